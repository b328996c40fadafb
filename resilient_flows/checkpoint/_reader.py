"""Reading a checkpoint back into whatever layout the state has now.

A checkpoint records, for every array, the boxes its pieces cover in the global array. A rank
restoring works out, for every array of its live state, the box it holds *now* (all of it for a
plain tensor, its local shard for a ``DTensor`` on any mesh), and reads only the saved pieces that
overlap that box. So a checkpoint written by 4 FSDP ranks restores on 2 or 3 FSDP ranks, into a
replicated (DDP) model, or into one process, and the other way round.

Arrays that every rank needs whole (replicated state) are read once, each piece by one rank that
broadcasts it, so that a restart of N data-parallel ranks does not read the checkpoint N times.
The reader of a piece is a rank that can see the shard holding it: in a node-local tier each node
holds only the shards its own ranks wrote.

A step may lie in several tiers at once: a rank reads each shard from the fastest copy it sees
(its node's node-local one, where that survived) and from the shared tier otherwise, and a copy
that fails its checksum gives way to the next. So a job that lost a node restores what the
surviving nodes still hold locally and only the rest from the shared file system; which copy
every shard came from is reported (:attr:`Restored.read_from`, and the bytes read from each source
in :attr:`Restored.bytes_from`).

A piece of a sharded array (or a rank's own values) that a rank sees only in the shared tier, or
not at all, while another rank sees it in a node-local or peer tier, is read there by that rank
and sent to it (relayed): after a lost node, the ranks on new nodes take their shards from a
surviving node's peer copy over the network instead of the shared file system.

Order of operations the caller guarantees (the contract of :class:`OpenCheckpoint`):

1. :meth:`OpenCheckpoint.targets` is computed from the live state; it checks nothing on disk;
   with several ranks, :meth:`OpenCheckpoint.assign_readers` then picks who reads each replicated
   or relayed piece, from every rank's :meth:`OpenCheckpoint.visible_shards` and
   :meth:`OpenCheckpoint.needs`;
2. :meth:`OpenCheckpoint.verify` maps the shards that hold pieces overlapping the targets and
   checks every such piece's checksum before anything is copied into the live state: a bad
   checkpoint leaves the state untouched (ranks agree on the verdict between 2 and 3). Targets
   made for this restore (optimizer state created for it, arrays the state lacks) are filled as
   their pieces are hashed, since nothing uses them before the restore succeeds;
3. :meth:`OpenCheckpoint.fill` copies the other overlaps into the targets, in place where the
   live leaf allows it, and returns the arrays by name.

Meanwhile (from :meth:`OpenCheckpoint.prefault` to :meth:`OpenCheckpoint.close`) a helper thread
faults in the targets' host memory without changing it, so that the copies in 3 run at memory
speed instead of taking a page fault every 4 KiB of a freshly allocated state.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from resilient_flows.checkpoint._boxes import Box, dtensor_local, is_dtensor, local_box
from resilient_flows.checkpoint._comm import Comm, SingleProcess, first_problem
from resilient_flows.checkpoint._flat import unflatten_state
from resilient_flows.checkpoint._manifest import ArrayRecord, Manifest, PieceRecord, read_manifest
from resilient_flows.checkpoint._prefault import Prefault
from resilient_flows.checkpoint._shardfile import MappedShard
from resilient_flows.checkpoint._state import RANK_LOCAL, Stateful, TrainState
from resilient_flows.checkpoint._tiers import Tier, shard_path, step_dirname
from resilient_flows.checkpoint._tree import Leaf, dtype_of, flatten, unflatten
from resilient_flows.errors import CheckpointError, CorruptCheckpointError, StateMismatchError

logger = logging.getLogger(__name__)


@dataclass
class Target:
    """Where one array goes on this rank: ``dst`` holds exactly ``box`` of the global array."""

    box: Box
    dst: torch.Tensor
    result: Leaf
    into: np.ndarray | None = None  # a live numpy array ``dst`` is copied into at the end
    replicated: bool = False  # every rank needs all of it: read once, broadcast
    fresh: bool = False  # ``dst`` was made for this restore: it may be filled while it is verified

    def landing(self, common: Box) -> tuple[torch.Tensor, torch.Tensor]:
        """The region of ``dst`` that holds ``common``, and where raw bytes of it can be written:
        the region itself when it lies contiguous in host memory, else a fresh buffer to copy in
        afterwards (a device tensor, a slice across rows, a lazily negated view)."""
        region = self.dst[common.within(self.box)]
        if region.device.type == "cpu" and region.is_contiguous() and not (region.is_conj() or region.is_neg()):
            return region, region
        return region, torch.empty(common.lengths, dtype=self.dst.dtype)

    def finish(self) -> None:
        """Hand the filled values to a live array that could not be filled in place."""
        if self.into is not None:
            np.copyto(self.into, self.dst.numpy())

    @classmethod
    def of(cls, record: ArrayRecord, live: Leaf | None) -> Target:
        """Fill ``live`` in place where it allows it (other references then see the restored values)."""
        whole = Box.whole(record.shape)
        if live is None:
            made = torch.empty(record.shape, dtype=record.dtype)
            return cls(whole, made, made, replicated=True, fresh=True)
        if isinstance(live, np.ndarray):
            if live.flags.c_contiguous and live.flags.writeable:
                return cls(whole, torch.from_numpy(live), live, replicated=True)
            return cls(whole, torch.empty(record.shape, dtype=record.dtype), live, into=live, replicated=True)
        if is_dtensor(live):
            box = local_box(live)
            dst = dtensor_local(live).detach()
            if tuple(dst.shape) != box.lengths:
                raise StateMismatchError(f"a local shard has shape {list(dst.shape)}, its placement says {box.lengths}")
            return cls(box, dst, live)
        return cls(whole, live.detach(), live, replicated=True)


def source_rank(manifest: Manifest, rank: int) -> int:
    """Whose per-rank values (RNG states, data position) ``rank`` takes when the world size changed."""
    return rank % manifest.world_size


@dataclass(frozen=True)
class StepCopy:
    """One tier's copy of a step directory as this rank sees it; ``level`` is the tier's place,
    fastest first (the same on every rank)."""

    tier: str
    path: Path
    level: int = 0


class OpenCheckpoint:
    """One committed checkpoint opened for reading: its manifest, and shards mapped on demand.

    ``copies`` are the step's directories in the tiers that hold it here, fastest first (or one
    directory). The manifest of the slowest copy is the authority, since the shared tier outlives
    the nodes (a rank with no copy, on a node that replaced a lost one, is given ``manifest`` by a
    rank that has one, and other ranks read its pieces for it); a faster copy whose manifest
    records other shards (a stale branch on a node that came back) is not read. Each shard comes
    from the fastest copy that holds it, and the next copy takes over when one fails its checksum.

    With ``comm`` of several ranks, arrays that every rank needs whole (replicated state: DDP
    parameters, Adam's step counters) are read once: each piece by one rank that sees its shard,
    in the fastest tier first and then balancing the bytes, which verifies it and broadcasts it,
    so the shared file system serves them once and not once per rank. Sharded targets are read
    by each rank for itself. Every rank must then call :meth:`assign_readers`, :meth:`verify`
    and :meth:`fill` together, with targets of the same structure.
    """

    def __init__(
        self, copies: Path | Sequence[StepCopy], step: int, comm: Comm | None = None, manifest: Manifest | None = None
    ) -> None:
        self.comm = comm if comm is not None else SingleProcess()
        listed = [StepCopy("", copies)] if isinstance(copies, Path) else list(copies)
        if not listed and manifest is not None:  # a rank on a new node: other ranks read for it
            self.manifest, self.step_dir, self.copies = manifest, Path(step_dirname(step)), []
            self._start()
            return
        if not listed:
            raise CorruptCheckpointError(f"{step_dirname(step)}: no copy of it here")
        read: list[tuple[StepCopy, Manifest]] = []
        problems = []
        for copy in listed:
            try:
                read.append((copy, read_manifest(copy.path)))
            except (OSError, CorruptCheckpointError) as exc:
                problems.append(f"{copy.tier or copy.path}: {exc}")
        if not read:
            raise CorruptCheckpointError(f"{step_dirname(step)}: cannot read it ({'; '.join(problems)})")
        authority, self.manifest = read[-1]
        self.step_dir = authority.path
        if self.manifest.step != step:
            raise CorruptCheckpointError(f"{self.step_dir.name}: the manifest says step {self.manifest.step}")
        self.copies = [copy for copy, manifest in read if manifest.shards == self.manifest.shards]
        for copy, _ in read:
            if copy not in self.copies:
                logger.warning(
                    "%s: the %s copy records other shards than the %s one's; not read",
                    self.step_dir.name,
                    copy.tier,
                    authority.tier,
                )
        self._start()

    def _start(self) -> None:
        self._using: dict[int, StepCopy] = {}  # the copy each mapped shard comes from
        self._shards: dict[int, MappedShard] = {}
        self._failed: dict[int, set[Path]] = {}  # copies of a shard that failed, by shard index
        self._assigned: dict[tuple[str, str], int] = {}  # who reads each replicated piece
        self._prefault: Prefault | None = None
        self._filled: set[tuple[str, str]] = set()  # pieces copied into fresh targets while verified
        #: Sharded pieces read by one rank for others: (array, piece, reader, the ranks that need it).
        self._relay: list[tuple[str, PieceRecord, int, tuple[int, ...]]] = []
        self._counted: set[tuple[str, str]] = set()
        #: Bytes of the pieces this rank read, by the tier they came from.
        self.bytes_read: dict[str, int] = {}

    def targets(self, live: Mapping[str, Leaf], made: tuple[str, ...] = ()) -> dict[str, Target]:
        """Every array this rank restores: the live ones, the saved ones it lacks, its per-rank values.

        Live arrays under the prefixes ``made`` were created for this restore (optimizer state).
        """
        own = f"{RANK_LOCAL}/{source_rank(self.manifest, self.comm.rank)}/"
        found = {}
        for name, record in self.manifest.arrays.items():
            if not name.startswith(f"{RANK_LOCAL}/"):
                found[name] = Target.of(record, live.get(name))
                if made and name.startswith(made):
                    found[name].fresh = True
            elif name.startswith(own):  # this rank's alone: read by itself
                found[name] = replace(Target.of(record, None), replicated=False)
        return found

    def prefault(self, targets: Mapping[str, Target]) -> None:
        """Start faulting in the targets' host memory while the pieces are verified (until
        :meth:`close`); their contents do not change, so a checkpoint refused later has touched
        nothing."""
        self._prefault = Prefault(target.dst for target in targets.values())

    @property
    def sources(self) -> dict[str, str]:
        """The tier each shard this rank read came from, by shard file."""
        return {self.manifest.shards[index].file: copy.tier for index, copy in self._using.items()}

    def visible_shards(self) -> dict[int, int]:
        """The shards this rank can open here, each with the level of the fastest tier holding
        it: all of them in a shared tier, only its own node's in a node-local one."""
        found: dict[int, int] = {}
        for copy in reversed(self.copies):
            for index, record in enumerate(self.manifest.shards):
                if self._holds(copy, record.file):
                    found[index] = copy.level
        return found

    def needs(self, targets: Mapping[str, Target]) -> list[tuple[str, str, int]]:
        """The pieces this rank reads for itself: ``(array, piece key, shard)`` of its own targets."""
        return [
            (name, piece.key, piece.shard)
            for name, target in sorted(targets.items())
            if not target.replicated
            for piece, _ in self._overlaps(name, target.box)
        ]

    def assign_readers(
        self,
        targets: Mapping[str, Target],
        visible: list[dict[int, int]],
        needs: list[list[tuple[str, str, int]]] | None = None,
        slowest: int | None = None,
    ) -> None:
        """Who reads each piece of a replicated target: among the ranks that see its shard
        (``visible[rank]``), those that see it in the fastest tier, then the least loaded, largest
        pieces first. A piece in ``needs[rank]`` (see :meth:`needs`) that its rank sees only at
        level ``slowest`` (the shared tier) or not at all, and another rank sees at a faster one,
        is relayed: read by that rank and sent to those that need it. The same on every rank, from the same inputs;
        raises CorruptCheckpointError when no rank sees a shard that is needed."""
        if self.comm.size == 1:
            return
        pieces = [
            (piece.box.numel * self.manifest.arrays[name].dtype.itemsize, name, piece.key, piece.shard)
            for name, target in targets.items()
            if target.replicated
            for piece in self.manifest.arrays[name].pieces
        ]
        loads = [0] * self.comm.size
        self._assigned = {}
        for nbytes, name, key, shard in sorted(pieces, key=lambda p: (-p[0], p[1], p[2])):
            able = [rank for rank in range(self.comm.size) if shard in visible[rank]]
            if not able:
                file = self.manifest.shards[shard].file
                raise CorruptCheckpointError(f"{self.step_dir.name}: no rank can read {file} (its node's copy is gone)")
            rank = min(able, key=lambda r: (visible[r][shard], loads[r], r))
            self._assigned[(name, key)] = rank
            loads[rank] += nbytes
        self._relay = []
        wanting_by: dict[tuple[str, str, int], list[int]] = {}  # each piece a rank reads itself: who
        for rank, wanted in enumerate(needs or []):
            for name, key, shard in wanted:  # a list or a tuple, as the transport delivers it
                wanting_by.setdefault((name, key, shard), []).append(rank)
        for (name, key, shard), wanting in sorted(wanting_by.items()):
            able = [rank for rank in range(self.comm.size) if visible[rank].get(shard, slowest) != slowest]
            if not able or all(visible[rank].get(shard, slowest) != slowest for rank in wanting):
                continue
            piece = next(p for p in self.manifest.arrays[name].pieces if p.key == key)
            rank = min(able, key=lambda r: (visible[r][shard], loads[r], r))
            self._assigned[(name, key)] = rank
            self._relay.append((name, piece, rank, tuple(wanting)))
            loads[rank] += piece.box.numel * self.manifest.arrays[name].dtype.itemsize

    def verify(self, targets: Mapping[str, Target]) -> None:
        """Check every piece this rank reads; raises CorruptCheckpointError.

        The disk reads the next piece while this one is hashed, so that reading a checkpoint the
        page cache does not hold costs the longer of the two, not their sum.
        """
        readers = self._assigned
        self._filled.clear()
        mine = [
            (name, piece)
            for name, target in targets.items()
            for piece, _ in self._overlaps(name, target.box)
            if readers.get((name, piece.key), self.comm.rank) == self.comm.rank
        ]
        chosen = {(name, piece.key) for name, piece in mine}
        mine += [(n, p) for n, p, r, _ in self._relay if r == self.comm.rank and (n, p.key) not in chosen]
        for index, (name, piece) in enumerate(mine):
            if index + 1 < len(mine):
                following = mine[index + 1][1]
                self._shard(following.shard).read_ahead(following.key)
            target = targets.get(name)  # None: a piece relayed for another rank
            self._piece(name, piece, None if target is None else self._fill_now(name, target, piece))

    def fill(self, targets: Mapping[str, Target]) -> dict[str, Leaf]:
        """Copy every overlap into its target (collective for replicated ones); the arrays by name."""
        readers = self._assigned
        with torch.no_grad():
            relayed = self._fill_relayed(targets)
            for name, target in targets.items():
                for piece, common in self._overlaps(name, target.box):
                    if (name, piece.key) in self._filled or (name, piece.key) in relayed:
                        continue
                    reader = readers.get((name, piece.key))
                    if reader is None:
                        target.dst[common.within(target.box)].copy_(self._piece(name, piece)[common.within(piece.box)])
                        continue
                    region, buffer = target.landing(common)  # replicated: the whole piece
                    if reader == self.comm.rank:
                        buffer.copy_(self._piece(name, piece))
                    self.comm.bcast_buffer(buffer.reshape(-1), reader)
                    if buffer is not region:
                        region.copy_(buffer)
                target.finish()
        return {name: target.result for name, target in targets.items()}

    def _fill_relayed(self, targets: Mapping[str, Target]) -> set[tuple[str, str]]:
        """Each relayed piece goes from its reader to the ranks that need it, point to point, in
        the agreed order; they copy their overlap. Returns the pieces done."""
        rank = self.comm.rank
        for name, piece, reader, wanting in self._relay:
            if rank != reader and rank not in wanting:
                continue
            buffer = torch.empty(piece.box.lengths, dtype=self.manifest.arrays[name].dtype)
            if rank == reader:
                buffer.copy_(self._piece(name, piece))
                self.comm.exchange([(other, buffer.reshape(-1)) for other in wanting if other != rank], [])
            else:
                self.comm.exchange([], [(reader, buffer.reshape(-1))])
            target = targets.get(name)
            common = None if target is None or target.replicated else piece.box.intersect(target.box)
            if rank in wanting and target is not None and common is not None:
                target.dst[common.within(target.box)].copy_(buffer[common.within(piece.box)])
        return {(name, piece.key) for name, piece, _, _ in self._relay}

    def state(self, arrays: Mapping[str, Leaf]) -> dict[str, Any]:
        """The nested state from the filled arrays, with this rank's per-rank values."""
        local = self.manifest.rank_local[source_rank(self.manifest, self.comm.rank)]
        return unflatten_state(self.manifest.skeleton, local, arrays)

    def release(self, name: str) -> None:
        """Drop the mapped pages of ``name``'s pieces from this process (done with them)."""
        for piece in self.manifest.arrays[name].pieces:
            if piece.shard in self._shards:
                self._shards[piece.shard].release(piece.key)

    def verify_all(self) -> None:
        """Hash every shard whole (what a full scan does)."""
        for index in range(self.manifest.world_size):
            self._shard(index).verify()

    def close(self) -> None:
        if self._prefault is not None:
            self._prefault.stop()
        for shard in self._shards.values():
            shard.close()
        self._shards.clear()

    def __enter__(self) -> OpenCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _overlaps(self, name: str, box: Box) -> list[tuple[PieceRecord, Box]]:
        found = []
        for piece in self.manifest.arrays[name].pieces:
            common = piece.box.intersect(box)
            if common is not None:
                found.append((piece, common))
        return found

    def _fill_now(self, name: str, target: Target, piece: PieceRecord) -> torch.Tensor | None:
        """Where ``piece`` can be copied as it is hashed: the region of a fresh target that it
        fills whole, contiguous in host memory, on the rank that reads it alone (None: copy it
        in :meth:`fill`)."""
        if not target.fresh or (name, piece.key) in self._assigned:
            return None
        common = piece.box.intersect(target.box)
        if common is None or common != piece.box:
            return None
        region, buffer = target.landing(common)
        return region if buffer is region else None

    def _piece(self, name: str, piece: PieceRecord, into: torch.Tensor | None = None) -> torch.Tensor:
        """The verified piece; with ``into``, copied there chunk by chunk as it is hashed."""
        record = self.manifest.arrays[name]
        while True:
            shard = self._shard(piece.shard)
            try:
                found = shard.piece(piece.key, record.dtype, piece.box.lengths, piece.xxh3_64, into)
            except CorruptCheckpointError as exc:
                if not self._give_up_copy(piece.shard, str(exc)):
                    raise
            else:
                if into is not None:
                    self._filled.add((name, piece.key))
                if (name, piece.key) not in self._counted:
                    self._counted.add((name, piece.key))
                    tier = self._using[piece.shard].tier
                    self.bytes_read[tier] = self.bytes_read.get(tier, 0) + piece.box.numel * record.dtype.itemsize
                return found

    def _shard(self, index: int) -> MappedShard:
        if index in self._shards:
            return self._shards[index]
        record = self.manifest.shards[index]
        errors: list[tuple[StepCopy, CorruptCheckpointError]] = []
        for copy in self._untried(index):
            try:
                self._shards[index] = MappedShard(shard_path(copy.path, record.file), record)
            except OSError as exc:
                errors.append((copy, CorruptCheckpointError(f"{record.file}: cannot read it ({exc})")))
            except CorruptCheckpointError as exc:
                errors.append((copy, exc))
            else:
                self._using[index] = copy
                return self._shards[index]
            self._failed.setdefault(index, set()).add(copy.path)
        if len(errors) == 1:
            raise errors[0][1]
        if not errors:
            raise CorruptCheckpointError(f"{record.file}: every copy of it failed")
        raise CorruptCheckpointError("; ".join(f"{copy.tier} copy: {exc}" for copy, exc in errors))

    def _give_up_copy(self, index: int, problem: str) -> bool:
        """Stop reading shard ``index`` from the copy that just failed; whether another copy is left."""
        self._failed.setdefault(index, set()).add(self._using.pop(index).path)
        self._shards.pop(index).close()
        left = self._untried(index)
        if left:
            file = self.manifest.shards[index].file
            logger.warning("%s/%s: %s; reading the %s copy instead", self.step_dir.name, file, problem, left[0].tier)
        return bool(left)

    def _untried(self, index: int) -> list[StepCopy]:
        failed = self._failed.get(index, set())
        return [copy for copy in self.copies if copy.path not in failed]

    @staticmethod
    def _holds(copy: StepCopy, file: str) -> bool:
        try:
            return shard_path(copy.path, file).is_file()
        except CorruptCheckpointError:
            return False  # a link out of its directory: that copy of the shard does not count


def live_arrays(
    stateful: Stateful | None, records: Mapping[str, ArrayRecord], skeleton: dict, where: str, ours: str
) -> dict[str, Leaf]:
    """The arrays of the state to restore into, in this rank's layout, checked against ``records``.

    A :class:`TrainState` creates its optimizer state first, when the saved state has some, so that
    moments of sharded parameters have somewhere to go; :meth:`TrainState.discard_restore_target`
    undoes that when nothing is restored after all. ``where`` and ``ours`` name the two states in
    errors ("checkpoint step 5", "the state to restore into").
    """
    if stateful is None:
        return {}
    lazy = stateful.lazy_prefixes() if isinstance(stateful, TrainState) else ()
    live = _arrays_of(stateful.state_dict())
    check_compatible(records, live, lazy, where, ours)
    if not isinstance(stateful, TrainState):
        return live
    saved = unflatten(skeleton, _Placeholders(records))
    stateful.check_loadable(saved)
    live = _arrays_of(stateful.restore_target(saved))
    check_compatible(records, live, lazy, where, ours)
    return live


def check_compatible(
    records: Mapping[str, ArrayRecord], live: Mapping[str, Leaf], lazy: tuple[str, ...], where: str, ours: str
) -> None:
    """Fail before touching the state if its arrays' global shapes or dtypes differ from the saved ones."""
    for name, leaf in live.items():
        record = records.get(name)
        if record is None:
            if name.startswith(lazy):  # an optimizer that has stepped, receiving one that has not
                continue
            raise StateMismatchError(f"{where} has no {name!r}, which {ours} has")
        if tuple(leaf.shape) != record.shape:
            kind = "global shape" if is_dtensor(leaf) else "shape"
            raise StateMismatchError(
                f"{name!r} has {kind} {list(record.shape)} in {where} but {list(leaf.shape)} in {ours}"
            )
        dtype = dtype_of(name, leaf)
        if dtype != record.dtype:
            raise StateMismatchError(f"{name!r} is {record.dtype} in {where} but {dtype} in {ours}")
    for name in records:
        if name not in live and not name.startswith((f"{RANK_LOCAL}/", *lazy)):
            raise StateMismatchError(f"{where} has {name!r}, which {ours} does not have")


def _arrays_of(state: Mapping[str, Any]) -> dict[str, Leaf]:
    target = dict(state)
    target.pop(RANK_LOCAL, None)
    return flatten(target)[1]


class _Placeholders(dict):
    """Stands in for every array, to look at a saved state's structure without reading it: each
    has the saved shape and dtype (what optimizer state is created from) and no storage."""

    def __init__(self, records: Mapping[str, ArrayRecord]) -> None:
        super().__init__()
        self._records = records

    def __missing__(self, name: str) -> torch.Tensor:
        record = self._records.get(name)
        if record is None:
            return torch.zeros(())
        return torch.zeros((), dtype=record.dtype).expand(record.shape)


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A committed checkpoint that restore passed over, and why."""

    step: int
    tier: str
    reason: str


@dataclass(frozen=True)
class Restored:
    """A checkpoint read back: its step, how many ranks wrote it, the state, where every shard
    read came from (shard file -> ``"<tier> on <host>"`` for node-local copies, or the shared
    tier's name) and the bytes read from each source, which tell after a node loss what the
    surviving nodes still held."""

    step: int
    world_size: int
    state: dict[str, Any]
    read_from: dict[str, list[str]]
    #: Bytes of pieces read, all ranks together, by source (named as in ``read_from``).
    bytes_from: dict[str, int] = field(default_factory=dict)

    def shards_by_source(self) -> dict[str, list[str]]:
        """Shard files by where they were read: ``{"local on n2": [...], "shared": [...]}``."""
        by_source: dict[str, list[str]] = {}
        for file, sources in self.read_from.items():
            for source in sources:
                by_source.setdefault(source, []).append(file)
        return {source: sorted(files) for source, files in sorted(by_source.items())}


def read_agreed(
    tiers: list[Tier],
    comm: Comm,
    stateful: Stateful | None,
    step: int | None,
    skipped: list[SkippedCheckpoint],
    node: str | None = None,
) -> Restored | None:
    """The newest checkpoint (or ``step``) every rank verified its part of, read into ``stateful``'s layout.

    Returns None when there is none. Collective over ``comm`` (idle, and gloo even when training
    uses NCCL). Candidates are the steps any rank sees in any tier, newest first; each rank reads
    a step from all the tiers that hold it here, the fastest copy of each shard first (see
    :class:`OpenCheckpoint`). A step that a rank cannot verify is skipped by all, with the reason,
    into ``skipped``; a state that does not fit raises :class:`StateMismatchError` on every rank
    before anything is read.
    """
    mine: dict[int, list[StepCopy]] = {}
    for level, tier in enumerate(tiers):
        for s in tier.committed_steps():
            if step in (None, s):
                mine.setdefault(s, []).append(StepCopy(tier.name, tier.step_dir(s), level))
    candidates = sorted({s for steps in comm.allgather(sorted(mine)) for s in steps}, reverse=True)
    last = len(tiers) - 1
    for s in candidates:
        copies = mine.get(s, [])
        opened: OpenCheckpoint | None = None
        problem = mismatch = shape = visible = None
        try:
            opened = OpenCheckpoint(copies, s, comm, _manifest_for_the_copyless(copies, s, comm))
            manifest = opened.manifest
            where = f"checkpoint step {manifest.step}"
            live = live_arrays(stateful, manifest.arrays, manifest.skeleton, where, "the state to restore into")
            targets = opened.targets(live, stateful.created_for_restore() if isinstance(stateful, TrainState) else ())
            opened.prefault(targets)
            shape = sorted(name for name, target in targets.items() if target.replicated)
            visible = opened.visible_shards()
        except CorruptCheckpointError as exc:
            problem = str(exc)
        except StateMismatchError as exc:
            mismatch = str(exc)
        try:
            needs = opened.needs(targets) if visible is not None and opened is not None else None
            agreed = comm.allgather((mismatch, shape, visible, needs))  # no rank reads if one must stop
            mismatch = first_problem(m for m, *_ in agreed) or _structure_problem([k for _, k, _, _ in agreed])
            if mismatch:
                raise StateMismatchError(mismatch)
            if problem is None and opened is not None:  # opened whenever no problem was found
                try:
                    visibles, wanted = [v or {} for _, _, v, _ in agreed], [n or [] for *_, n in agreed]
                    opened.assign_readers(targets, visibles, wanted, last)
                    opened.verify(targets)
                except CorruptCheckpointError as exc:
                    problem = str(exc)
            problems = comm.allgather(problem)
            if not any(problems) and opened is not None:
                arrays = opened.fill(targets)
                read_from, bytes_from = _sources_of_all_ranks(opened, tiers, node or socket.gethostname(), comm)
                return Restored(s, manifest.world_size, opened.state(arrays), read_from, bytes_from)
        finally:
            if opened is not None:
                opened.close()
        if isinstance(stateful, TrainState):
            stateful.discard_restore_target()  # the next candidate creates the optimizer state it has
        reason = "; ".join(f"rank {r}: {p}" if comm.size > 1 else p for r, p in enumerate(problems) if p)
        held = ", ".join(copy.tier for copy in copies) or "no tier on this rank"
        logger.warning("skipping checkpoint step %d (%s): %s", s, held, reason)
        skipped.append(SkippedCheckpoint(s, held, reason))
    if step is not None:
        raise CheckpointError(f"no valid checkpoint of step {step} in {', '.join(str(t.path) for t in tiers)}")
    return None


def _sources_of_all_ranks(
    opened: OpenCheckpoint, tiers: list[Tier], node: str, comm: Comm
) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Where the ranks read each file from, and the bytes read per source, over all ranks: what a
    restore reports, so that a resume after a lost node can show it read nothing from the shared tier."""
    here = {file: _source(tier, tiers, node) for file, tier in opened.sources.items()}
    counted = {_source(tier, tiers, node): n for tier, n in opened.bytes_read.items()}
    read_from: dict[str, set[str]] = {}
    bytes_from: dict[str, int] = {}
    for sources, nbytes in comm.allgather((here, counted)):
        for file, where in sources.items():
            read_from.setdefault(file, set()).add(where)
        for where, count in nbytes.items():
            bytes_from[where] = bytes_from.get(where, 0) + count
    return {f: sorted(w) for f, w in sorted(read_from.items())}, dict(sorted(bytes_from.items()))


def _manifest_for_the_copyless(copies: list[StepCopy], step: int, comm: Comm) -> Manifest | None:
    """The step's manifest for a rank that holds no copy of the step (a node that replaced a lost
    one, where the step is not in the shared tier), from the first rank whose copy opens; None for
    ranks with a copy, or when no rank has a readable one. Collective."""
    holding = comm.allgather(bool(copies))
    if all(holding) or not any(holding):  # the common case: nobody reads a manifest twice
        return None
    text = None
    if copies:
        with contextlib.suppress(OSError, CorruptCheckpointError):
            text = read_manifest(copies[-1].path).to_json()
    readable = comm.allgather(text is not None)
    if not any(readable):
        return None
    text = comm.bcast(text, readable.index(True))
    return None if copies else Manifest.from_json(text, f"{step_dirname(step)}/manifest.json from another rank")


def _source(tier: str, tiers: list[Tier], node: str) -> str:
    """How a restore names where it read: the shared tier by name, a node's tier with the node."""
    return tier if tier == tiers[-1].name else f"{tier} on {node}"


def _structure_problem(replicated: list[list[str] | None]) -> str | None:
    """Ranks must agree on which arrays they restore whole, to read each once and broadcast it."""
    known = [names for names in replicated if names is not None]
    if any(names != known[0] for names in known):
        return "the ranks restore states of different structure (replicated arrays differ between ranks)"
    return None


def read_checkpoint(directory: str | os.PathLike, step: int | None = None) -> tuple[int, dict[str, Any]] | None:
    """The newest valid checkpoint (or ``step``) in one tier as ``(step, nested dict)``, or None.

    For readers beside a live writer (analytics on a member that keeps training): unlike a
    :class:`Checkpointer` it cleans no debris, since the writer's half-written step is not debris
    yet, and it takes part in no collectives.
    """
    tier = Tier(directory, "shared")
    for s in tier.committed_steps():
        if step not in (None, s):
            continue
        try:
            with OpenCheckpoint(tier.step_dir(s), s) as opened:
                targets = opened.targets({})
                opened.prefault(targets)
                opened.verify(targets)
                return s, opened.state(opened.fill(targets))
        except CorruptCheckpointError as exc:
            logger.warning("skipping checkpoint step %d in %s: %s", s, tier.path, exc)
    return None
