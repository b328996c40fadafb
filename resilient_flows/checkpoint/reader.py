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

Order of operations the caller guarantees (the contract of :class:`OpenCheckpoint`):

1. :meth:`OpenCheckpoint.targets` is computed from the live state; it checks nothing on disk;
   with several ranks, :meth:`OpenCheckpoint.assign_readers` then picks who reads each replicated
   piece, from every rank's :meth:`OpenCheckpoint.visible_shards`;
2. :meth:`OpenCheckpoint.verify` maps the shards that hold pieces overlapping the targets and
   checks every such piece's checksum, before anything is copied: a bad checkpoint leaves the
   state untouched (ranks agree on the verdict between 2 and 3);
3. :meth:`OpenCheckpoint.fill` copies the overlaps into the targets, in place where the live
   leaf allows it, and returns the arrays by name.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from resilient_flows.checkpoint.boxes import Box, dtensor_local, is_dtensor, local_box
from resilient_flows.checkpoint.comm import Comm, SingleProcess, first_problem
from resilient_flows.checkpoint.manifest import ArrayRecord, Manifest, PieceRecord, read_manifest
from resilient_flows.checkpoint.shardfile import MappedShard
from resilient_flows.checkpoint.state import RANK_LOCAL, Stateful, TrainState
from resilient_flows.checkpoint.tiers import Tier, shard_path
from resilient_flows.checkpoint.tree import Leaf, dtype_of, flatten, unflatten
from resilient_flows.errors import CheckpointError, CorruptCheckpointError, StateMismatchError

__all__ = [
    "OpenCheckpoint",
    "SkippedCheckpoint",
    "Target",
    "check_compatible",
    "live_arrays",
    "read_agreed",
    "read_checkpoint",
    "source_rank",
]

logger = logging.getLogger(__name__)


@dataclass
class Target:
    """Where one array goes on this rank: ``dst`` holds exactly ``box`` of the global array."""

    box: Box
    dst: torch.Tensor
    result: Leaf
    into: np.ndarray | None = None  # a live numpy array ``dst`` is copied into at the end
    replicated: bool = False  # every rank needs all of it: read once, broadcast

    def finish(self) -> None:
        """Hand the filled values to a live array that could not be filled in place."""
        if self.into is not None:
            np.copyto(self.into, self.dst.numpy())

    @classmethod
    def of(cls, record: ArrayRecord, live: Leaf | None) -> Target:
        """Fill ``live`` in place where it allows it (other references then see the restored values)."""
        whole = Box.whole(record.shape)
        if live is None:
            fresh = torch.empty(record.shape, dtype=record.dtype)
            return cls(whole, fresh, fresh, replicated=True)
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


class OpenCheckpoint:
    """One committed checkpoint opened for reading: its manifest, and shards mapped on demand.

    With ``comm`` of several ranks, arrays that every rank needs whole (replicated state: DDP
    parameters, Adam's step counters) are read once: each piece by one rank that sees its shard,
    chosen to balance the bytes, which verifies it and broadcasts it, so the shared file system
    serves them once and not once per rank. Sharded targets are read by each rank for itself.
    Every rank must then call :meth:`assign_readers`, :meth:`verify` and :meth:`fill` together,
    with targets of the same structure.
    """

    def __init__(self, step_dir: Path, step: int, comm: Comm | None = None) -> None:
        self.step_dir = step_dir
        self.comm = comm if comm is not None else SingleProcess()
        try:
            self.manifest = read_manifest(step_dir)
        except OSError as exc:
            raise CorruptCheckpointError(f"{step_dir.name}: cannot read it ({exc})") from None
        if self.manifest.step != step:
            raise CorruptCheckpointError(f"{step_dir.name}: the manifest says step {self.manifest.step}")
        self._shards: dict[int, MappedShard] = {}
        self._assigned: dict[tuple[str, str], int] = {}  # who reads each replicated piece

    def targets(self, live: Mapping[str, Leaf]) -> dict[str, Target]:
        """Every array this rank restores: the live ones, the saved ones it lacks, its per-rank values."""
        own = f"{RANK_LOCAL}/{source_rank(self.manifest, self.comm.rank)}/"
        found = {}
        for name, record in self.manifest.arrays.items():
            if not name.startswith(f"{RANK_LOCAL}/"):
                found[name] = Target.of(record, live.get(name))
            elif name.startswith(own):  # this rank's alone: read by itself
                found[name] = replace(Target.of(record, None), replicated=False)
        return found

    def visible_shards(self) -> set[int]:
        """The shards this rank can open here: all of them in a shared tier, only its own node's
        in a node-local one."""
        return {i for i, record in enumerate(self.manifest.shards) if shard_path(self.step_dir, record.file).is_file()}

    def assign_readers(self, targets: Mapping[str, Target], visible: list[set[int]]) -> None:
        """Who reads each piece of a replicated target: among the ranks that see its shard
        (``visible[rank]``), the least loaded, largest pieces first. The same on every rank, from
        the same inputs; raises CorruptCheckpointError when no rank sees a shard that is needed."""
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
            rank = min(able, key=lambda r: (loads[r], r))
            self._assigned[(name, key)] = rank
            loads[rank] += nbytes

    def verify(self, targets: Mapping[str, Target]) -> None:
        """Check every piece this rank reads; raises CorruptCheckpointError."""
        readers = self._assigned
        for name, target in targets.items():
            for piece, _ in self._overlaps(name, target.box):
                if readers.get((name, piece.key), self.comm.rank) == self.comm.rank:
                    self._piece(name, piece)

    def fill(self, targets: Mapping[str, Target]) -> dict[str, Leaf]:
        """Copy every overlap into its target (collective for replicated ones); the arrays by name."""
        readers = self._assigned
        with torch.no_grad():
            for name, target in targets.items():
                for piece, common in self._overlaps(name, target.box):
                    region = target.dst[common.within(target.box)]
                    reader = readers.get((name, piece.key))
                    if reader is None:
                        region.copy_(self._piece(name, piece)[common.within(piece.box)])
                        continue
                    usable = region.device.type == "cpu" and region.is_contiguous()
                    buffer = region if usable else torch.empty(piece.box.lengths, dtype=region.dtype)
                    if reader == self.comm.rank:
                        buffer.copy_(self._piece(name, piece))
                    self.comm.bcast_buffer(buffer.reshape(-1), reader)
                    if not usable:
                        region.copy_(buffer)
                target.finish()
        return {name: target.result for name, target in targets.items()}

    def state(self, arrays: Mapping[str, Leaf]) -> dict[str, Any]:
        """The nested state from the filled arrays, with this rank's per-rank values."""
        state = unflatten(self.manifest.skeleton, arrays)
        local = self.manifest.rank_local[source_rank(self.manifest, self.comm.rank)]
        if local:
            state[RANK_LOCAL] = unflatten(local, arrays)
        return state

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

    def _piece(self, name: str, piece: PieceRecord) -> torch.Tensor:
        record = self.manifest.arrays[name]
        return self._shard(piece.shard).piece(piece.key, record.dtype, piece.box.lengths, piece.xxh3_64)

    def _shard(self, index: int) -> MappedShard:
        if index not in self._shards:
            record = self.manifest.shards[index]
            try:
                self._shards[index] = MappedShard(shard_path(self.step_dir, record.file), record)
            except OSError as exc:
                raise CorruptCheckpointError(f"{record.file}: cannot read it ({exc})") from None
        return self._shards[index]


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
    saved = unflatten(skeleton, _Placeholders())
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
    """Stands in for every array, to look at a saved state's structure without reading it."""

    def __missing__(self, name: str) -> torch.Tensor:
        return torch.zeros(())


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A committed checkpoint that restore passed over, and why."""

    step: int
    tier: str
    reason: str


def read_agreed(
    tiers: list[Tier], comm: Comm, stateful: Stateful | None, step: int | None, skipped: list[SkippedCheckpoint]
) -> tuple[int, int, dict[str, Any]] | None:
    """The newest checkpoint (or ``step``) every rank verified its part of, read into ``stateful``'s layout.

    Returns ``(step, world size at save time, state)``, or None when there is none. Collective over
    ``comm`` (idle, and gloo even when training uses NCCL). Candidates come from every rank's view
    of the tiers, newest first, the fastest tier first; one that a rank cannot verify is skipped
    by all, with the reason, into ``skipped``; a state that does not fit raises
    :class:`StateMismatchError` on every rank before anything is read.
    """
    mine = [(s, i) for i, tier in enumerate(tiers) for s in tier.committed_steps() if step in (None, s)]
    candidates = sorted({c for cs in comm.allgather(mine) for c in cs}, key=lambda c: (-c[0], c[1]))
    for s, index in candidates:
        tier = tiers[index]
        opened: OpenCheckpoint | None = None
        problem = mismatch = shape = visible = None
        try:
            opened = OpenCheckpoint(tier.step_dir(s), s, comm)
            manifest = opened.manifest
            where = f"checkpoint step {manifest.step}"
            live = live_arrays(stateful, manifest.arrays, manifest.skeleton, where, "the state to restore into")
            targets = opened.targets(live)
            shape = sorted(name for name, target in targets.items() if target.replicated)
            visible = opened.visible_shards()
        except CorruptCheckpointError as exc:
            problem = str(exc)
        except StateMismatchError as exc:
            mismatch = str(exc)
        try:
            agreed = comm.allgather((mismatch, shape, visible))  # no rank reads if one must stop
            mismatch = first_problem(m for m, _, _ in agreed) or _structure_problem([k for _, k, _ in agreed])
            if mismatch:
                raise StateMismatchError(mismatch)
            if problem is None:
                try:
                    opened.assign_readers(targets, [v or set() for _, _, v in agreed])
                    opened.verify(targets)
                except CorruptCheckpointError as exc:
                    problem = str(exc)
            problems = comm.allgather(problem)
            if not any(problems):
                arrays = opened.fill(targets)
                return s, opened.manifest.world_size, opened.state(arrays)
        finally:
            if opened is not None:
                opened.close()
        reason = "; ".join(f"rank {r}: {p}" if comm.size > 1 else p for r, p in enumerate(problems) if p)
        logger.warning("skipping checkpoint step %d in the %s tier %s: %s", s, tier.name, tier.path, reason)
        skipped.append(SkippedCheckpoint(s, tier.name, reason))
    if step is not None:
        raise CheckpointError(f"no valid checkpoint of step {step} in {', '.join(str(t.path) for t in tiers)}")
    return None


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
                opened.verify(targets)
                return s, opened.state(opened.fill(targets))
        except CorruptCheckpointError as exc:
            logger.warning("skipping checkpoint step %d in %s: %s", s, tier.path, exc)
    return None
