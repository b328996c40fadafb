"""Checkpointer: the one object a training loop holds.

It is a facade over three parts, each with its contract where it is defined, as in PyTorch's DCP:
what each rank writes (:mod:`~resilient_flows.checkpoint._writeplan`: boxes of replicated and sharded
arrays, balanced by bytes), how it is written (:mod:`~resilient_flows.checkpoint._writer`: host
arena -> node-local tiers -> shared tier, committed per tier), and how it is read back
(:mod:`~resilient_flows.checkpoint._reader`: verify, reshard into the live layout).

Order of operations for one ``save`` (each rank):

1. wait until the previous checkpoint has left the host arena (backpressure, reported);
2. flatten the state, plan which boxes this rank writes (its share of the replicated arrays, its
   shards of the ``DTensor`` ones), copy them into the arena (or start the copy behind the next
   forward/backward pass in overlap mode) and return;
3. the writer pipeline takes it from there (see :mod:`~resilient_flows.checkpoint._writer`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
import torch
import xxhash

from resilient_flows.checkpoint._boxes import Box, HeldBox, held_boxes, is_dtensor, local_box
from resilient_flows.checkpoint._buddy import fetch_copy
from resilient_flows.checkpoint._comm import as_comm, first_problem
from resilient_flows.checkpoint._config import CheckpointConfig, TierSpec, check_positive_int, check_tiers
from resilient_flows.checkpoint._flat import flatten_state
from resilient_flows.checkpoint._heartbeat import HeartbeatWriter
from resilient_flows.checkpoint._peer import Ring
from resilient_flows.checkpoint._reader import Restored, SkippedCheckpoint, read_agreed
from resilient_flows.checkpoint._shardfile import ShardEntry
from resilient_flows.checkpoint._snapshot import CopyTask, CopyWorker, HostArena, Snapshot
from resilient_flows.checkpoint._state import RANK_LOCAL, Stateful, TrainState
from resilient_flows.checkpoint._tiers import Tier
from resilient_flows.checkpoint._tree import Leaf, dtype_of
from resilient_flows.checkpoint._writeplan import (
    ArraySpec,
    WriteItem,
    array_specs,
    plan_writes,
    shard_order,
    whole_items,
)
from resilient_flows.checkpoint._writer import CheckpointStats, WriteJob, WritePipeline
from resilient_flows.errors import STORAGE_FULL, CheckpointError, Failure, StorageFullError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Layout:
    skeleton: Any
    arrays: dict[str, Leaf]
    local_skeleton: Any
    local_arrays: dict[str, Leaf]
    specs: tuple[ArraySpec, ...]
    digest: str  # of the specs: every rank must hold the same layout
    plan: list[list[WriteItem]]
    mine: list[WriteItem]
    held: dict[str, Box]
    entries: list[ShardEntry]


class Checkpointer:
    """Asynchronous, sharded, multi-level checkpoints of a training state.

    Parameters
    ----------
    tiers:
        Where checkpoints go: one directory (``Checkpointer("ckpt")``: a single shared tier), or
        any number of tiers, fastest first, each a :class:`TierSpec` or a path (for
        ``TierSpec(path)``): e.g. ``[TierSpec("/dev/shm/x"), TierSpec("/scratch/x",
        persist_every=2), TierSpec("/lus/x", persist_every=4)]``. A checkpoint is committed in
        the first, then flushed on from tier to tier in the background, from host memory while
        the next save has not reused it. ``save(..., persist=True)`` sends it through every tier
        (use it for the last checkpoint before a walltime). Restore takes the newest valid step
        found in any tier. A workflow member's tiers come whole from its
        :class:`~resilient_flows.checkpoint.CheckpointConfig` (:meth:`from_config`). A bad list
        (an option out of range, two tiers in one directory) raises
        :class:`~resilient_flows.errors.CheckpointConfigError` naming the field.
    keep:
        Committed checkpoints kept per tier; older ones are pruned after each commit.
    comm:
        An ``mpi4py`` communicator or ``torch.distributed`` process group over the ranks that
        hold the state. All ranks must construct, save, restore and close together. Plain tensors
        are taken as replicated: identical on every rank when ``save`` is called, and each rank
        writes about ``1/N`` of their bytes (under DDP, BatchNorm buffers differ per rank between
        forward passes: use ``SyncBatchNorm`` or broadcast them before saving). ``DTensor`` leaves
        (FSDP2, tensor parallelism) are sharded: each rank writes its own shard, and the replicas
        of a replicated placement share its writing. Values that legitimately differ per rank go
        in ``TrainState(rank_extra=...)``. With an mpi4py communicator, a DTensor's mesh ranks are
        taken to be the communicator's ranks.
    pin_memory:
        Pin the host staging arena. Default: when CUDA is available.
    heartbeat:
        Rank 0 keeps ``checkpoint-heartbeat.json`` in the shared tier up to date (the newest commit
        there, the period, the restore time) and, under Slurm, points its job's comment at it:
        what the preemption agent (``resilient-flows cosched agent``) chooses victims by. See
        :mod:`~resilient_flows.checkpoint._heartbeat`.
    node:
        The node this rank runs on; ranks naming the same node share its node-local tiers, and
        a peer tier copies each node's shards to another node. Default: the host name.
    """

    def __init__(
        self,
        tiers: str | os.PathLike | Sequence[TierSpec | str | os.PathLike],
        *,
        keep: int = 3,
        comm: Any = None,
        pin_memory: bool | None = None,
        heartbeat: bool = True,
        node: str | None = None,
    ) -> None:
        check_positive_int("keep", keep)
        specs = check_tiers(tiers)
        self._specs = specs
        self.tiers = [Tier(spec.path, cast(str, spec.name)) for spec in specs]  # check_tiers names each
        self._every = [spec.persist_every for spec in specs]
        self._sent = [0] * len(specs)  # per tier: checkpoints sent to the tier before it
        self.shared = self.tiers[-1]
        self.local = self.tiers[0] if len(self.tiers) > 1 else None
        self.keep = keep
        self.comm = as_comm(comm)
        self.rank, self.world_size = self.comm.rank, self.comm.size
        self.stats = CheckpointStats.of_tiers(len(self.tiers))
        self.skipped: list[SkippedCheckpoint] = []
        #: The last restore: its step, and which tier every shard came from (None: nothing restored).
        self.restored: Restored | None = None
        problem = None
        try:
            for tier in self.tiers:
                tier.path.mkdir(parents=True, exist_ok=True)
                if tier is not self.shared or self.rank == 0:
                    tier.clean_debris()
        except OSError as exc:
            problem = f"cannot prepare the {tier.name} checkpoint directory {tier.path}: {exc}"
        problems = self.comm.allgather(problem)  # every rank fails together, none waits in dup()
        if any(problems):
            raise CheckpointError(first_problem(problems))
        newest = [tier.committed_steps()[:1] for tier in self.tiers]
        self.node = node or socket.gethostname()
        gathered = self.comm.allgather((newest, self.node))
        self._newest = max((s for steps, _ in gathered for t in steps for s in t), default=-1)
        ring = Ring(tuple(host for _, host in gathered))
        self.nodes = len(ring.nodes)
        self._group_ranks = self.comm.group_ranks()

        pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._arena = HostArena(pin_memory=pin)
        self._copier = CopyWorker()
        self._plans: dict[tuple[ArraySpec, ...], tuple[list[list[WriteItem]], str]] = {}
        self._held: dict[Any, tuple[HeldBox, ...]] = {}
        self._errors: list[Failure] = []
        self._lock = threading.Lock()
        self._pending_snapshot: Snapshot | None = None
        self._hooked: weakref.WeakKeyDictionary[torch.optim.Optimizer, Any] = weakref.WeakKeyDictionary()
        self._closed = False
        self._exposed = False  # the restored state came from a peer copy: the next save re-replicates it
        peers = {index: spec.capacity for index, spec in enumerate(specs) if spec.peer}
        #: A member on one node: its peer tier's index and how it reaches its buddies' services.
        self._buddies = next(((i, s.buddies) for i, s in enumerate(specs) if s.buddies and not ring.active), None)
        self._pipeline = WritePipeline(
            self.tiers, self.comm, keep, self._arena, self._record, self.stats, ring=ring, peer_capacity=peers
        )
        self._pipeline.buddies = None if self._buddies is None else self._buddies[1]
        if heartbeat and self.rank == 0:
            self._pipeline.heartbeat = HeartbeatWriter(self.shared.path)
        self._pipeline.comm.allgather(None)  # nobody writes before every rank has cleaned up
        atexit.register(_close_at_exit, weakref.ref(self))

    @classmethod
    def from_config(cls, config: CheckpointConfig, **options: Any) -> Checkpointer:
        """The checkpointer of ``config``'s tiers and retention (placed where it runs: see
        :meth:`CheckpointConfig.placed`); ``options`` are the other keyword arguments."""
        return cls(config.tiers, keep=config.keep, **options)

    @property
    def tier_specs(self) -> tuple[TierSpec, ...]:
        """The tiers as given, named, each with the cadence it has now (``interval: auto`` tunes the last)."""
        return tuple(replace(spec, persist_every=every) for spec, every in zip(self._specs, self._every, strict=True))

    @property
    def shared_every(self) -> int:
        """The last tier's cadence (its :attr:`TierSpec.persist_every`): what ``interval: auto`` tunes."""
        return self._every[-1]

    @shared_every.setter
    def shared_every(self, value: int) -> None:
        check_positive_int("tiers[-1].persist_every", value)
        self._every[-1] = value

    @property
    def flushing(self) -> bool:
        """A checkpoint is on its way to a tier after the first right now (to the only tier, with
        one): what a training loop tags its step times with to measure a flush's interference."""
        return self._pipeline.flushing

    @property
    def flush_seconds(self) -> float:
        """Seconds checkpoints have spent on their way to the tiers after the first (to the only
        tier, with one), the running flush included: what a step overlapped with a flush, for
        measuring a flush's interference even when flushes are shorter than a step."""
        return self._pipeline.flush_seconds

    # ------------------------------------------------------------------ saving

    def save(
        self,
        step: int,
        state: Any,
        *,
        overlap: bool = False,
        persist: bool | None = None,
        on_commit: Callable[[Tier, int], None] | None = None,
        cached: bool = False,
    ) -> CheckpointStats:
        """Checkpoint ``state`` as of ``step``; return once later mutation cannot alter it.

        Blocks first while the previous checkpoint still occupies the host arena (at most one
        checkpoint is staged at a time; a flush still sending the previous one from the arena lets
        go within one chunk and reads the rest from the lower tier; ``stats.last_wait`` says how
        long). With ``overlap=True``
        parameters and optimizer state are copied while the next forward/backward pass runs and
        ``optimizer.step()`` waits for that copy; everything else is copied before returning.
        A failure of an earlier checkpoint is raised as :class:`CheckpointError` after this one is
        queued, so that all ranks always queue the same checkpoints.

        ``persist=True`` sends this checkpoint through every tier, ``False`` keeps it in the first;
        by default each tier's ``persist_every`` decides, except for the first save after a restore
        that read a lost node's shards from a peer copy: that one goes through every tier, so that
        the new ring's buddies and the shared tier hold the state again at once.

        ``on_commit(tier, step)`` runs on every rank in a background thread once this checkpoint is
        committed in a tier (fastest first, up to the shared one), before retention may prune it:
        the place to hand the checkpoint to someone else (a clone) without stalling training.
        Its exceptions are logged, never raised. ``cached`` writes the shards through the page
        cache rather than with direct I/O, so that a reader on this node right after the commit
        (a clone) reads memory, not the disk.
        """
        self._check_open()
        step = self._next_step(step)
        started = time.perf_counter()
        stateful = _as_stateful(state)
        if overlap and not (isinstance(stateful, TrainState) and stateful.optimizer is not None):
            raise ValueError("overlap=True needs a TrainState with an optimizer: its step() waits for the copy")
        layout = self._layout(stateful)
        generation, snapshot, waited = self._stage(layout, stateful, overlap)
        self.stats.saves += 1
        if persist is None and self._exposed:
            persist, self._exposed = True, False
        job = WriteJob(
            step=step,
            depth=self._depth(persist),
            generation=generation,
            snapshot=snapshot,
            entries=layout.entries,
            layout=layout.digest,
            skeleton=layout.skeleton,
            arrays={s.name: (s.dtype, s.shape) for s in layout.specs},
            plan=layout.plan,
            local_skeleton=layout.local_skeleton,
            local_arrays={n: (dtype_of(n, leaf), tuple(leaf.shape)) for n, leaf in layout.local_arrays.items()},
            started=started,
            on_commit=on_commit,
            cached=cached,
        )
        self._pipeline.submit(job)
        stall = time.perf_counter() - started
        self.stats.last_stall, self.stats.last_wait = stall, waited
        self.stats.total_stall += stall
        self.stats.total_wait += waited
        self.stats.staging_bytes = self._arena.nbytes
        self.stats.arena_allocations = self._arena.allocations
        self._raise_pending()  # after queueing: every rank queues the same checkpoints, errors or not
        return self.stats

    def _next_step(self, step: Any) -> int:
        """``step`` as an int, checked: non-negative, and not older than the newest committed."""
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        step = int(step)
        if step < self._newest:
            raise CheckpointError(
                f"step {step} is older than step {self._newest}, already committed under {self.shared.path}: "
                f"to branch off an older checkpoint, call discard_newer_than({step - 1}) first"
            )
        self._newest = step
        return step

    def _stage(self, layout: _Layout, stateful: Stateful, overlap: bool) -> tuple[int, Snapshot, float]:
        """Take the host arena (waiting for the previous checkpoint to let go of it) and start the
        copy into it: the arena's generation, the snapshot, and the seconds waited for the arena."""
        leaves = {**layout.arrays, **layout.local_arrays}
        # save() lets overlap through only with a TrainState that has an optimizer
        train = stateful if overlap and isinstance(stateful, TrainState) else None
        deferrable = train.deferrable() if train is not None else lambda name: False
        before = time.perf_counter()
        generation = self._arena.acquire()  # the flush of the previous checkpoint re-reads from here on
        waited = time.perf_counter() - before
        try:
            views = self._arena.views(layout.entries)
            tasks = [
                CopyTask(item, leaves[item.name], layout.held[item.name], view, not deferrable(item.name))
                for item, view in zip(layout.mine, views, strict=True)
            ]
            if train is not None and train.optimizer is not None:
                self._guard_optimizer(train.optimizer)
            snapshot = Snapshot(tasks, overlap, self._copier)
            if overlap:
                self._pending_snapshot = snapshot
        except BaseException:
            self._arena.release(generation)
            raise
        return generation, snapshot, waited

    def _depth(self, persist: bool | None) -> int:
        """How many tiers this save goes to: tier k when it is the ``persist_every``-th sent to
        tier k-1 (all with ``persist=True``, only the first with ``persist=False``)."""
        depth = 1
        for index in range(1, len(self.tiers)):
            self._sent[index] += 1
            if not (persist or (persist is None and self._sent[index] % self._every[index] == 0)):
                break
            depth += 1
        return depth

    def prepare(self, state: Any) -> None:
        """Allocate and touch the host arena for ``state``'s layout now, in the background.

        The first ``save`` of a layout otherwise allocates the arena during its stall, where the
        page faults of fresh memory make it several times slower than the copies that follow
        (2 s for 512 MiB on a small VM). Call this once the state has its final layout (after
        the first optimizer step: optimizers create their state lazily), some time before the
        first save; a save that comes sooner waits for the allocation, no longer than it would
        have taken anyway. Collective-free: ranks may prepare at different times. Sharded
        (``DTensor``) state stages only this rank's shards.
        """
        self._check_open()
        entries = self._layout(_as_stateful(state)).entries
        generation = self._arena.acquire()  # never while a checkpoint occupies the arena
        threading.Thread(target=self._allocate, args=(entries, generation), name="rf-arena", daemon=True).start()

    def _allocate(self, entries: list[ShardEntry], generation: int) -> None:
        try:
            self._arena.views(entries)
            self._arena.touch()
        except Exception as exc:  # the save that follows allocates again and reports its own failure
            logger.warning("preparing the host arena failed: %r", exc)
        finally:
            self._arena.release(generation)

    def _layout(self, stateful: Stateful) -> _Layout:
        """What this rank stages for ``stateful``: flattened arrays, the plan, its own pieces in order."""
        flat = flatten_state(stateful.state_dict(), f"{RANK_LOCAL}/{self.rank}")
        specs = array_specs(flat.arrays, self._held_boxes)
        plan, digest = self._plan(specs)
        local = whole_items(flat.local_arrays)
        held = {spec.name: self._local_box(spec, flat.arrays[spec.name]) for spec in specs}
        held.update((item.name, item.box) for item in local)
        mine = shard_order([*plan[self.rank], *local])
        entries = [ShardEntry(item.key, item.dtype, item.box.lengths) for item in mine]
        return _Layout(
            flat.skeleton, flat.arrays, flat.local_skeleton, flat.local_arrays, specs, digest, plan, mine, held, entries
        )

    def _held_boxes(self, name: str, leaf: Leaf) -> tuple[HeldBox, ...]:
        """Who holds which box of ``leaf``; cached per shape, mesh and placements."""
        if not is_dtensor(leaf):
            return tuple(held_boxes(leaf, self._group_ranks))
        key = (tuple(leaf.shape), leaf.device_mesh, tuple(leaf.placements))
        if key not in self._held:
            try:
                self._held[key] = tuple(held_boxes(leaf, self._group_ranks))
            except ValueError as exc:
                raise CheckpointError(
                    f"cannot checkpoint {name!r}: {exc}; pass the process group that spans its mesh as comm="
                ) from None
        return self._held[key]

    def _local_box(self, spec: ArraySpec, leaf: Leaf) -> Box:
        """The box this rank holds: found among the held boxes (cached), else computed (empty shards)."""
        if not is_dtensor(leaf):
            return Box.whole(spec.shape)
        for held in spec.held:
            if self.rank in held.holders:
                return held.box
        try:
            return local_box(leaf)
        except ValueError as exc:
            raise CheckpointError(f"cannot checkpoint {spec.name!r}: {exc}") from None

    def _plan(self, specs: tuple[ArraySpec, ...]) -> tuple[list[list[WriteItem]], str]:
        """The write plan and the layout's digest; both computed once per layout."""
        if specs not in self._plans:
            digest = xxhash.xxh3_64_hexdigest(repr(specs).encode())
            self._plans = {specs: (plan_writes(specs, self.world_size), digest)}
        return self._plans[specs]

    def _guard_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``optimizer.step()`` wait for the copy of the state it is about to change."""
        if optimizer in self._hooked:
            return

        def wait_for_copy(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
            pending, self._pending_snapshot = self._pending_snapshot, None
            if pending is not None:
                with contextlib.suppress(Exception):  # a failed copy is the writer's to report
                    pending.wait_copied()

        self._hooked[optimizer] = optimizer.register_step_pre_hook(wait_for_copy)

    def wait(self) -> None:
        """Block until every checkpoint saved so far is committed (and flushed, if asked)."""
        self._drain()
        self._raise_pending()

    def _drain(self) -> None:
        self._pipeline.drain()

    def close(self) -> None:
        """Wait for pending checkpoints, then stop the background threads. Idempotent.

        Safe after ``torch.distributed.destroy_process_group()``: the communicators the engine
        duplicated went with the group; the engine lets go of them and of ``comm`` here, so that
        they are destroyed now rather than in the interpreter's teardown.
        """
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            alive = self.comm.alive()
            self._pipeline.stop(free=alive)
            if not alive:
                self.comm.release()
            for handle in list(self._hooked.values()):
                handle.remove()
            self._hooked.clear()
            self._copier.stop()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _record(self, failure: Failure) -> None:
        logger.error("%s", failure)
        with self._lock:
            self._errors.append(failure)

    def _raise_pending(self) -> None:
        with self._lock:
            failures: tuple[Failure, ...] = tuple(self._errors)
            self._errors = []
        if failures:
            first, count = failures[0], len(failures)
            more = f" (and {count - 1} more failure(s))" if count > 1 else ""
            full = all(f.kind == STORAGE_FULL for f in failures)
            raise (StorageFullError if full else CheckpointError)(f"{first}{more}", failures=failures)

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this Checkpointer is closed")

    # ---------------------------------------------------------------- reading

    def discard_newer_than(self, step: int) -> list[int]:
        """Delete the committed checkpoints after ``step`` in every tier; the steps removed.

        For rolling back: after ``restore(state, step=80)`` the checkpoints of steps after 80
        belong to an abandoned run, and saving step 85 next to step 100 would make a later
        ``restore()`` pick 100. Collective with ``comm``.
        """
        self._drain()
        removed = self._pipeline.discard_after(step)
        self._pipeline.comm.allgather(None)  # nobody saves before the branch is gone everywhere
        self._newest = min(self._newest, step)
        return removed

    def latest_step(self) -> int | None:
        """Newest committed step in any tier (committed, not yet verified)."""
        steps = [s for tier in self.tiers for s in tier.committed_steps()[:1]]
        return max(steps, default=None)

    def restore(self, state: Any, step: int | None = None) -> int | None:
        """Load the newest valid checkpoint (or ``step``) into ``state``; its step, or None.

        The state may have another layout than the one saved: another number of ranks, FSDP
        shards where DDP replicas were saved or the other way round, one process. Each rank reads
        only the saved pieces that overlap what it holds now, and verifies their checksums before
        anything is copied. Checkpoints failing verification are skipped, logged and listed in
        ``self.skipped``; a checkpoint whose arrays do not fit the state raises
        :class:`StateMismatchError` and leaves the state untouched. A step held by several tiers
        is read from the fastest copy of each shard that this rank's node still has, the shared
        tier supplying the rest; ``self.restored.read_from`` says which. Collective with ``comm``.
        """
        stateful = _as_stateful(state)
        began = time.perf_counter()
        try:
            read = self._read(step, stateful)
        except BaseException:
            if isinstance(stateful, TrainState):
                stateful.discard_restore_target()
            raise
        if read is None:
            self.restored = None
            if isinstance(stateful, TrainState):
                stateful.discard_restore_target()
            return None
        stateful.load_state_dict(read.state)
        peers = {tier.name for index, tier in enumerate(self.tiers) if index in self._pipeline.peer_capacity}
        self._exposed = any(source.split(" on ")[0] in peers for source in read.bytes_from)
        self.restored = replace(read, state={})  # the state is the caller's now: holding it would keep its arrays alive
        if self._pipeline.heartbeat is not None:
            self._pipeline.heartbeat.restore_s = time.perf_counter() - began
        logger.info("restored step %d (%d ranks at save time, %d now)", read.step, read.world_size, self.world_size)
        return read.step

    def load(self, step: int | None = None) -> dict[str, Any] | None:
        """The newest valid checkpoint (or ``step``) as a nested dict of full CPU tensors, or None."""
        read = self._read(step, None)
        return None if read is None else read.state

    def _read(self, step: int | None, stateful: Stateful | None) -> Restored | None:
        self._drain()  # read our own writes; their errors still surface at the next save or wait
        fetched = self._fetch_from_buddy() if step is None else None
        try:
            return read_agreed(self.tiers, self._pipeline.comm, stateful, step, self.skipped, self.node)
        finally:
            if fetched is not None:  # read into the state: the copy lives on at the buddy and in the next saves
                self.tiers[fetched].discard_after(-1)

    def _fetch_from_buddy(self) -> int | None:
        """A member on one node whose newest copy is on a buddy node and not here (it lost its
        node): rank 0 fetches the copy into this node's peer tier, for the restore to read it
        there before the shared tier; the tier's index, or None when nothing was fetched."""
        if self._buddies is None:
            return None
        index, link = self._buddies
        fetched = None
        if self.rank == 0 and fetch_copy(link, self.node, self.tiers[:-1], self.tiers[index]) is not None:
            fetched = index
        return self._pipeline.comm.bcast(fetched)


class _DictState:
    """A plain dict of arrays and scalars, restored in place (arrays keep their identity)."""

    def __init__(self, data: dict) -> None:
        self.data = data

    def state_dict(self) -> dict:
        return self.data

    def load_state_dict(self, state_dict: dict) -> None:
        _update_in_place(self.data, state_dict)


def _update_in_place(target: dict, loaded: dict) -> None:
    for key, value in loaded.items():
        current = target.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            _update_in_place(current, value)
        elif current is not value:
            target[key] = value


def _as_stateful(state: Any) -> Stateful:
    if isinstance(state, Stateful):
        return state
    if isinstance(state, dict):
        return _DictState(state)
    raise TypeError(
        f"cannot checkpoint a {type(state).__name__}: pass a TrainState, a dict, or an object with state_dict()"
    )


def _close_at_exit(ref: weakref.ref) -> None:
    checkpointer = ref()
    if checkpointer is not None and not checkpointer._closed:
        try:
            checkpointer.close()
        except CheckpointError as exc:
            logger.error("at exit: %s", exc)
