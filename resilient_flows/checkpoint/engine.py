"""Checkpointer: the one object a training loop holds.

Order of operations for one ``save`` (each rank):

1. wait until the previous checkpoint has left the host arena (backpressure, reported);
2. flatten the state, plan which pieces this rank writes, copy them into the arena (or start the
   copy behind the next forward/backward pass in overlap mode) and return;
3. writer thread: write this rank's shard to the first tier, fsync; all ranks exchange their shard
   records; rank 0 writes the manifest (the commit) and ``latest``; old checkpoints are pruned;
4. flusher thread (node-local tier only): copy the shard to the shared tier, verifying it on the
   way; rank 0 commits there too.

Every collective of steps 3 and 4 runs on a duplicate of the user's communicator, and every rank
takes part in it even when its own part failed, so that one rank's full disk becomes an error on
every rank instead of a hang. Errors surface as :class:`CheckpointError` at the next ``save``,
``wait`` or ``close``; a failed checkpoint never touches the committed ones.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash

from resilient_flows.checkpoint.catalog import open_checkpoint
from resilient_flows.checkpoint.comm import SingleProcess, as_comm
from resilient_flows.checkpoint.manifest import MANIFEST, ArrayRecord, Manifest, PieceRecord, write_manifest
from resilient_flows.checkpoint.shardfile import MappedShard, ShardEntry, ShardRecord, copy_shard, write_shard
from resilient_flows.checkpoint.shards import ArraySpec, Piece, plan_shards, shard_order
from resilient_flows.checkpoint.snapshot import CopyTask, CopyWorker, HostArena, Snapshot
from resilient_flows.checkpoint.state import RANK_LOCAL, Stateful, TrainState
from resilient_flows.checkpoint.tiers import Tier, shard_filename
from resilient_flows.checkpoint.tree import Leaf, flatten, unflatten
from resilient_flows.errors import CheckpointError, CorruptCheckpointError, StateMismatchError

__all__ = ["CheckpointStats", "Checkpointer", "SkippedCheckpoint"]

logger = logging.getLogger(__name__)


@dataclass
class CheckpointStats:
    """What checkpointing has cost so far on this rank; every time in seconds."""

    saves: int = 0
    committed: int = 0
    persisted: int = 0
    last_stall: float = 0.0
    last_wait: float = 0.0
    total_stall: float = 0.0
    total_wait: float = 0.0
    last_commit_latency: float = 0.0
    last_persist_latency: float = 0.0
    bytes_written: int = 0
    staging_bytes: int = 0
    arena_allocations: int = 0


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A committed checkpoint that restore passed over, and why."""

    step: int
    tier: str
    reason: str


@dataclass(frozen=True)
class _Layout:
    skeleton: Any
    arrays: dict[str, Leaf]
    local_skeleton: Any
    local_arrays: dict[str, Leaf]
    specs: tuple[ArraySpec, ...]
    plan: list[list[Piece]]
    mine: list[Piece]
    entries: list[ShardEntry]


@dataclass
class _Job:
    step: int
    tier: Tier
    persist: bool
    snapshot: Snapshot
    entries: list[ShardEntry]
    layout: str
    skeleton: dict
    arrays: dict[str, ArrayRecord]
    local_skeleton: dict
    local_arrays: dict[str, tuple[torch.dtype, tuple[int, ...]]]
    started: float
    on_commit: Callable[[Tier, int], None] | None = None
    cached: bool = False
    manifest: Manifest | None = field(default=None)
    record: ShardRecord | None = field(default=None)


class Checkpointer:
    """Asynchronous, sharded, two-level checkpoints of a training state.

    Parameters
    ----------
    directory:
        The shared (persistent) tier: a directory on the parallel file system.
    local_dir:
        Optional node-local tier (``/tmp``, ``/local/scratch``, ...). Checkpoints are committed
        there first and flushed to ``directory`` in the background.
    persist_every:
        With ``local_dir``, every ``persist_every``-th checkpoint also goes to the shared tier.
        ``save(..., persist=True)`` forces it (use it for the last checkpoint before a walltime).
    keep:
        Committed checkpoints kept per tier; older ones are pruned after each commit.
    comm:
        An ``mpi4py`` communicator or ``torch.distributed`` process group over data-parallel
        ranks holding replicated state. Each rank then writes about ``1/N`` of the bytes. All
        ranks must construct, save, restore and close together. The replicated state must be
        identical on every rank when ``save`` is called: under DDP, BatchNorm buffers differ per
        rank between forward passes (use ``SyncBatchNorm`` or broadcast them before saving).
        Values that legitimately differ per rank go in ``TrainState(rank_extra=...)``.
    pin_memory:
        Pin the host staging arena. Default: when CUDA is available.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        local_dir: str | os.PathLike | None = None,
        persist_every: int = 1,
        keep: int = 3,
        comm: Any = None,
        pin_memory: bool | None = None,
    ) -> None:
        _check_positive_int("persist_every", persist_every)
        _check_positive_int("keep", keep)
        self.shared = Tier(directory, "shared")
        self.local = Tier(local_dir, "local") if local_dir is not None else None
        if self.local is not None and _same_path(self.local.path, self.shared.path):
            raise ValueError(f"local_dir and directory are the same directory {self.shared.path}")
        self.persist_every = persist_every
        self.keep = keep
        self.comm = as_comm(comm)
        self.rank, self.world_size = self.comm.rank, self.comm.size
        self.stats = CheckpointStats()
        self.skipped: list[SkippedCheckpoint] = []
        problem = None
        try:
            for tier in self.tiers:
                tier.path.mkdir(parents=True, exist_ok=True)
                if tier is self.local or self.rank == 0:
                    tier.clean_debris()
        except OSError as exc:
            problem = f"cannot prepare the {tier.name} checkpoint directory {tier.path}: {exc}"
        problems = self.comm.allgather(problem)  # every rank fails together, none waits in dup()
        if any(problems):
            raise CheckpointError(_first_problem(problems))
        newest = [tier.committed_steps()[:1] for tier in self.tiers]
        self._newest = max((s for steps in self.comm.allgather(newest) for t in steps for s in t), default=-1)
        self._write_comm = self.comm.dup()
        self._flush_comm = self.comm.dup() if self.local is not None else None
        self._write_comm.allgather(None)  # nobody writes before every rank has cleaned up

        pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._arena = HostArena(pin_memory=pin)
        self._copier = CopyWorker()
        self._plans: dict[tuple[ArraySpec, ...], list[list[Piece]]] = {}
        self._arena_free = threading.Event()
        self._arena_free.set()
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._prune_lock = threading.Lock()
        self._flush_pending: set[int] = set()
        self._pending_snapshot: Snapshot | None = None
        self._hooked: weakref.WeakKeyDictionary[torch.optim.Optimizer, Any] = weakref.WeakKeyDictionary()
        self._closed = False
        self._write_q: queue.Queue[_Job | None] = queue.Queue()
        self._flush_q: queue.Queue[_Job | None] = queue.Queue(maxsize=1)
        self._threads = [
            threading.Thread(target=self._serve, args=(self._write_q, self._write), name="rf-writer", daemon=True)
        ]
        if self.local is not None:
            self._threads.append(
                threading.Thread(target=self._serve, args=(self._flush_q, self._flush), name="rf-flusher", daemon=True)
            )
        for thread in self._threads:
            thread.start()
        atexit.register(_close_at_exit, weakref.ref(self))

    @property
    def tiers(self) -> list[Tier]:
        """Fastest first."""
        return [self.local, self.shared] if self.local is not None else [self.shared]

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
        checkpoint is staged at a time; ``stats.last_wait`` says how long). With ``overlap=True``
        parameters and optimizer state are copied while the next forward/backward pass runs and
        ``optimizer.step()`` waits for that copy; everything else is copied before returning.
        A failure of an earlier checkpoint is raised as :class:`CheckpointError` after this one is
        queued, so that all ranks always queue the same checkpoints.

        ``on_commit(tier, step)`` runs on every rank in a background thread once this checkpoint is
        committed in a tier (the local one, then the shared one), before retention may prune it:
        the place to hand the checkpoint to someone else (a clone) without stalling training.
        Its exceptions are logged, never raised. ``cached`` writes the shards through the page
        cache rather than with direct I/O, so that a reader on this node right after the commit
        (a clone) reads memory, not the disk.
        """
        self._check_open()
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        step = int(step)
        if step < self._newest:
            raise CheckpointError(
                f"step {step} is older than step {self._newest}, already committed under {self.shared.path}: "
                f"to branch off an older checkpoint, call discard_newer_than({step - 1}) first"
            )
        self._newest = step
        started = time.perf_counter()
        self._arena_free.wait()
        waited = time.perf_counter() - started

        stateful = _as_stateful(state)
        if overlap and not (isinstance(stateful, TrainState) and stateful.optimizer is not None):
            raise ValueError("overlap=True needs a TrainState with an optimizer: its step() waits for the copy")
        layout = self._layout(stateful)
        mine, entries = layout.mine, layout.entries
        leaves = {**layout.arrays, **layout.local_arrays}
        deferrable = stateful.deferrable() if overlap else lambda name: False

        self._arena_free.clear()
        try:
            views = self._arena.views(entries)
            tasks = [CopyTask(p, leaves[p.name], v, not deferrable(p.name)) for p, v in zip(mine, views, strict=True)]
            if overlap:
                self._guard_optimizer(stateful.optimizer)
            snapshot = Snapshot(tasks, overlap, self._copier)
            if overlap:
                self._pending_snapshot = snapshot
        except BaseException:
            self._arena_free.set()
            raise

        self.stats.saves += 1
        if persist is None:
            persist = self.stats.saves % self.persist_every == 0
        job = _Job(
            step=step,
            tier=self.tiers[0],
            persist=persist and self.local is not None,
            snapshot=snapshot,
            entries=entries,
            layout=xxhash.xxh3_64_hexdigest(repr(layout.specs).encode()),
            skeleton=layout.skeleton,
            arrays=_array_records(layout.specs, layout.plan),
            local_skeleton=layout.local_skeleton,
            local_arrays={n: (_dtype_of(n, leaf), tuple(leaf.shape)) for n, leaf in layout.local_arrays.items()},
            started=started,
            on_commit=on_commit,
            cached=cached,
        )
        self._write_q.put(job)
        stall = time.perf_counter() - started
        self.stats.last_stall, self.stats.last_wait = stall, waited
        self.stats.total_stall += stall
        self.stats.total_wait += waited
        self.stats.staging_bytes = self._arena.nbytes
        self.stats.arena_allocations = self._arena.allocations
        self._raise_pending()  # after queueing: every rank queues the same checkpoints, errors or not
        return self.stats

    def prepare(self, state: Any) -> None:
        """Allocate and touch the host arena for ``state``'s layout now, in the background.

        The first ``save`` of a layout otherwise allocates the arena during its stall, where the
        page faults of fresh memory make it several times slower than the copies that follow
        (2 s for 512 MiB on a small VM). Call this once the state has its final layout (after
        the first optimizer step: optimizers create their state lazily), some time before the
        first save; a save that comes sooner waits for the allocation, no longer than it would
        have taken anyway. Collective-free: ranks may prepare at different times.
        """
        self._check_open()
        entries = self._layout(_as_stateful(state)).entries
        self._arena_free.wait()  # never while a checkpoint occupies the arena
        self._arena_free.clear()
        threading.Thread(target=self._allocate, args=(entries,), name="rf-arena", daemon=True).start()

    def _allocate(self, entries: list[ShardEntry]) -> None:
        try:
            self._arena.views(entries)
            self._arena.touch()
        except Exception as exc:  # the save that follows allocates again and reports its own failure
            logger.warning("preparing the host arena failed: %r", exc)
        finally:
            self._arena_free.set()

    def _layout(self, stateful: Stateful) -> _Layout:
        """What this rank stages for ``stateful``: flattened arrays, the shard plan, its own pieces in order."""
        full = dict(stateful.state_dict())
        local_state = full.pop(RANK_LOCAL, None)
        skeleton, arrays = flatten(full)
        local_skeleton, local_arrays = (
            ({}, {}) if local_state is None else flatten(local_state, f"{RANK_LOCAL}/{self.rank}")
        )
        specs = tuple(ArraySpec(name, _dtype_of(name, leaf), tuple(leaf.shape)) for name, leaf in arrays.items())
        plan = self._plan(specs)
        mine = list(plan[self.rank])
        dtypes = {s.name: s.dtype for s in specs}
        for name, leaf in local_arrays.items():
            dtypes[name] = _dtype_of(name, leaf)
            mine.append(Piece(name, 0, _numel(leaf), True))
        mine = shard_order(mine, {n: d.itemsize for n, d in dtypes.items()})
        entries = [ShardEntry(p.key, dtypes[p.name], p.stop - p.start) for p in mine]
        return _Layout(skeleton, arrays, local_skeleton, local_arrays, specs, plan, mine, entries)

    def _plan(self, specs: tuple[ArraySpec, ...]) -> list[list[Piece]]:
        if specs not in self._plans:
            self._plans = {specs: plan_shards(specs, self.world_size)}
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
        self._write_q.join()
        if self.local is not None:
            self._flush_q.join()

    def close(self) -> None:
        """Wait for pending checkpoints, then stop the background threads. Idempotent."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._write_q.put(None)
            self._threads[0].join()
            if self.local is not None:
                self._flush_q.put(None)
                self._threads[1].join()
            for handle in list(self._hooked.values()):
                handle.remove()
            self._hooked.clear()
            self._copier.stop()
            for comm in {id(c): c for c in (self._write_comm, self._flush_comm) if c is not None}.values():
                comm.free()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- background

    def _serve(self, jobs: queue.Queue, handle: Any) -> None:
        while (job := jobs.get()) is not None:
            try:
                handle(job)
            except BaseException as exc:  # a bug, not an I/O error: still never lost
                logger.exception("checkpoint thread failed")
                self._record(f"step {job.step}: internal error {exc!r}")
                self._arena_free.set()
            finally:
                jobs.task_done()
        jobs.task_done()

    def _write(self, job: _Job) -> None:
        comm, tier, step = self._write_comm, job.tier, job.step
        step_dir = tier.step_dir(step)
        problem = None
        try:
            job.snapshot.wait_copied()
        except Exception as exc:
            problem = f"copying the state failed: {exc}"
        exists = self.rank == 0 and (step_dir / MANIFEST).is_file()
        before = comm.allgather((job.layout, exists, problem))
        problem = _first_problem(p for _, _, p in before) or _layout_problem([lay for lay, _, _ in before])
        if problem is None and before[0][1]:
            self._arena_free.set()
            logger.info("step %d is already committed in the %s tier %s; keeping it", step, tier.name, tier.path)
            return
        if problem is None:
            try:
                step_dir.mkdir(parents=True, exist_ok=True)
                meta = {"format": "resilient-flows", "step": str(step), "rank": str(self.rank)}
                job.record = write_shard(
                    step_dir / self._shard_name, job.entries, self._arena.buffer, meta, cached=job.cached
                )
            except Exception as exc:
                problem = f"writing {step_dir / self._shard_name} failed: {exc}"
        self._arena_free.set()
        after = comm.allgather((job.record, job.local_skeleton, job.local_arrays, problem))
        problem = problem or _first_problem(p for *_, p in after)
        if problem is None:
            commit_problem, text = None, None
            if self.rank == 0:
                job.manifest = self._manifest(job, after)
                try:
                    write_manifest(step_dir, job.manifest)
                    tier.write_latest(step)
                except Exception as exc:
                    commit_problem = f"committing {step_dir} failed: {exc}"
                text = job.manifest.to_json() if tier is self.local else None
            problem, text = comm.bcast((commit_problem, text))
            if text is not None and self.rank != 0:
                job.manifest = Manifest.from_json(text, step_dir.name)
        if problem is not None:
            self._abandon(tier, step_dir, f"checkpoint of step {step} to the {tier.name} tier {tier.path}: {problem}")
            return
        if tier is self.local and self.rank != 0 and not (step_dir / MANIFEST).is_file():
            try:
                write_manifest(step_dir, job.manifest)  # this rank's node has no copy yet
            except OSError as exc:  # this node's copy is unusable; restore falls back to another tier
                logger.warning("cannot commit step %d in this node's %s tier: %s", step, tier.name, exc)
        self.stats.committed += 1
        self.stats.bytes_written += job.record.nbytes
        self.stats.last_commit_latency = time.perf_counter() - job.started
        if job.persist:
            with self._lock:
                self._flush_pending.add(step)
            self._flush_q.put(job)
        self._committed(job, tier)
        self._prune(tier, step)

    def _flush(self, job: _Job) -> None:
        comm, step = self._flush_comm, job.step
        src = self.local.step_dir(step) / self._shard_name
        dst_dir = self.shared.step_dir(step)
        try:
            exists = comm.bcast(self.rank == 0 and (dst_dir / MANIFEST).is_file())
            problem = None
            if not exists:
                try:
                    dst_dir.mkdir(parents=True, exist_ok=True)
                    copy_shard(src, dst_dir / self._shard_name, job.record)
                except Exception as exc:
                    problem = f"copying {src} to {dst_dir} failed: {exc}"
                problem = _first_problem(comm.allgather(problem))
                if problem is None:
                    commit_problem = None
                    if self.rank == 0:
                        try:
                            write_manifest(dst_dir, job.manifest)
                            self.shared.write_latest(step)
                        except Exception as exc:
                            commit_problem = f"committing {dst_dir} failed: {exc}"
                    problem = comm.bcast(commit_problem)
            if problem is not None:
                self._abandon(
                    self.shared, dst_dir, f"flush of step {step} to the shared tier {self.shared.path}: {problem}"
                )
                return
            self.stats.persisted += 1
            self.stats.last_persist_latency = time.perf_counter() - job.started
            self._committed(job, self.shared)
            if self.rank == 0:
                self.shared.prune(self.keep, protect={step})
        finally:
            with self._lock:
                self._flush_pending.discard(step)
            self._prune(self.local, None)  # the local copies it protected while flushing may go now

    def _manifest(self, job: _Job, gathered: list) -> Manifest:
        arrays = dict(job.arrays)
        for rank, (_, _, local_arrays, _) in enumerate(gathered):
            for name, (dtype, shape) in local_arrays.items():
                numel = int(np.prod(shape, dtype=np.int64))
                arrays[name] = ArrayRecord(dtype, shape, [PieceRecord(rank, name, 0, numel)])
        return Manifest(
            step=job.step,
            world_size=self.world_size,
            skeleton=job.skeleton,
            rank_local=[skel for _, skel, _, _ in gathered],
            arrays=arrays,
            shards=[record for record, *_ in gathered],
        )

    def _committed(self, job: _Job, tier: Tier) -> None:
        if job.on_commit is None:
            return
        try:
            job.on_commit(tier, job.step)
        except Exception:
            logger.exception("on_commit of step %d in the %s tier failed", job.step, tier.name)

    def _abandon(self, tier: Tier, step_dir: Path, message: str) -> None:
        """Remove what a failed checkpoint wrote; a committed one (even of this step) is untouched."""
        committed = (step_dir / MANIFEST).is_file()
        for name in (self._shard_name + ".tmp",) if committed else (self._shard_name, self._shard_name + ".tmp"):
            with contextlib.suppress(OSError):
                (step_dir / name).unlink(missing_ok=True)
        if self.rank == 0 and not committed:
            shutil.rmtree(step_dir, ignore_errors=True)
        self._record(message)

    def _prune(self, tier: Tier, step: int | None) -> None:
        """Retention; the writer and the flusher both call it, one at a time."""
        with self._lock:
            protect = set(self._flush_pending) | ({step} if step is not None else set())
        with self._prune_lock:
            if tier is self.local:
                tier.prune(self.keep, protect, own_files=[self._shard_name])
            elif self.rank == 0:
                tier.prune(self.keep, protect)

    @property
    def _shard_name(self) -> str:
        return shard_filename(self.rank, self.world_size)

    def _record(self, message: str) -> None:
        logger.error("%s", message)
        with self._lock:
            self._errors.append(message)

    def _raise_pending(self) -> None:
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            more = f" (and {len(errors) - 1} more failure(s))" if len(errors) > 1 else ""
            raise CheckpointError(errors[0] + more)

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
        removed: set[int] = set()
        for tier in self.tiers:
            if tier is self.local:
                removed.update(tier.discard_after(step, own_files=[self._shard_name]))
            elif self.rank == 0:
                removed.update(tier.discard_after(step))
        self._write_comm.allgather(None)  # nobody saves before the branch is gone everywhere
        self._newest = min(self._newest, step)
        return sorted(removed)

    def latest_step(self) -> int | None:
        """Newest committed step in any tier (committed, not yet verified)."""
        steps = [s for tier in self.tiers for s in tier.committed_steps()[:1]]
        return max(steps, default=None)

    def restore(self, state: Any, step: int | None = None) -> int | None:
        """Load the newest valid checkpoint (or ``step``) into ``state``; its step, or None.

        Checkpoints failing verification are skipped, logged and listed in ``self.skipped``.
        Collective: with ``comm``, every rank calls it and all restore the same step; each rank
        reads and verifies about ``1/N`` of the shards and broadcasts what it read.
        """
        stateful = _as_stateful(state)
        opened = self._open_valid(step)
        if opened is None:
            return None
        manifest, shards = opened
        try:
            target = dict(stateful.state_dict())
            target.pop(RANK_LOCAL, None)
            _, live = flatten(target)
            lazy = stateful.lazy_prefixes() if isinstance(stateful, TrainState) else ()
            mismatch = None
            try:
                _check_compatible(manifest, live, lazy)
                if isinstance(stateful, TrainState):
                    stateful.check_loadable(unflatten(manifest.skeleton, _Placeholders()))
            except StateMismatchError as exc:
                mismatch = str(exc)
            mismatches = self._write_comm.allgather(mismatch)  # no rank broadcasts if one must stop
            if any(mismatches):
                raise StateMismatchError(_first_problem(mismatches))
            loaded = _materialize(manifest, shards, live, self._write_comm)
        finally:
            for shard in shards.values():
                shard.close()
        stateful.load_state_dict(loaded)
        logger.info(
            "restored step %d (%d ranks at save time, %d now)", manifest.step, manifest.world_size, self.world_size
        )
        return manifest.step

    def load(self, step: int | None = None) -> dict[str, Any] | None:
        """The newest valid checkpoint (or ``step``) as a nested dict of CPU tensors, or None."""
        opened = self._open_valid(step)
        if opened is None:
            return None
        manifest, shards = opened
        try:
            return _materialize(manifest, shards, {}, self._write_comm)
        finally:
            for shard in shards.values():
                shard.close()

    def _open_valid(self, step: int | None) -> tuple[Manifest, dict[int, MappedShard]] | None:
        """The newest checkpoint every rank could verify its share of; each rank maps its shards."""
        self._drain()  # read our own writes; their errors still surface at the next save or wait
        mine = [(s, i) for i, tier in enumerate(self.tiers) for s in tier.committed_steps() if step in (None, s)]
        comm = self._write_comm  # idle once drained; a gloo group even when the user's is NCCL
        candidates = sorted({c for cs in comm.allgather(mine) for c in cs}, key=lambda c: (-c[0], c[1]))
        for s, index in candidates:
            tier = self.tiers[index]
            shards: dict[int, MappedShard] = {}
            problem = None
            try:
                manifest, shards = open_checkpoint(tier.step_dir(s), s, reader=(self.rank, self.world_size))
                _check_pieces(manifest, shards)
            except CorruptCheckpointError as exc:
                problem = str(exc)
            problems = comm.allgather(problem)
            if not any(problems):
                return manifest, shards
            for shard in shards.values():
                shard.close()
            reason = "; ".join(f"rank {r}: {p}" if self.world_size > 1 else p for r, p in enumerate(problems) if p)
            logger.warning("skipping checkpoint step %d in the %s tier %s: %s", s, tier.name, tier.path, reason)
            self.skipped.append(SkippedCheckpoint(s, tier.name, reason))
        if step is not None:
            raise CheckpointError(f"no valid checkpoint of step {step} in {', '.join(str(t.path) for t in self.tiers)}")
        return None


def _materialize(
    manifest: Manifest, shards: dict[int, MappedShard], live: Mapping[str, Leaf], comm: Any
) -> dict[str, Any]:
    """Every array this rank needs; a piece comes from the rank that read its shard.

    All ranks walk the manifest in the same order and take part in every broadcast, also of
    other ranks' per-rank values (a few kilobytes), so that the collectives line up.
    """
    source_rank = comm.rank % manifest.world_size
    if manifest.world_size != comm.size and manifest.rank_local[source_rank]:
        logger.warning(
            "checkpoint was saved by %d ranks, restoring on %d: rank %d takes rank %d's per-rank values",
            manifest.world_size,
            comm.size,
            comm.rank,
            source_rank,
        )
    own_local = f"{RANK_LOCAL}/{source_rank}/"
    loaded: dict[str, Any] = {}
    for name, record in manifest.arrays.items():
        needed = not name.startswith(f"{RANK_LOCAL}/") or name.startswith(own_local)
        if not needed and comm.size == 1:
            continue
        flat, finish = _receiver(record, live.get(name))
        with torch.no_grad():
            for piece in record.pieces:
                part = flat[piece.start : piece.stop]
                reader = piece.shard % comm.size
                if reader == comm.rank:
                    part.copy_(shards[piece.shard].piece(piece.key, record.dtype, piece.stop - piece.start))
                if comm.size > 1:
                    comm.bcast_buffer(part, reader)
        if needed:
            loaded[name] = finish()
    state = unflatten(manifest.skeleton, loaded)
    local_skeleton = manifest.rank_local[source_rank]
    if local_skeleton:
        state[RANK_LOCAL] = unflatten(local_skeleton, loaded)
    return state


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
        shards: dict[int, MappedShard] = {}
        try:
            manifest, shards = open_checkpoint(tier.step_dir(s), s)
            _check_pieces(manifest, shards)
            return s, _materialize(manifest, shards, {}, SingleProcess())
        except CorruptCheckpointError as exc:
            logger.warning("skipping checkpoint step %d in %s: %s", s, tier.path, exc)
        finally:
            for shard in shards.values():
                shard.close()
    return None


class _Placeholders(dict):
    """Stands in for every array, to look at a checkpoint's structure without reading it."""

    def __missing__(self, name: str) -> torch.Tensor:
        return torch.zeros(())


def _check_pieces(manifest: Manifest, shards: dict[int, MappedShard]) -> None:
    """Every piece the manifest places in a mapped shard is there, before any rank broadcasts."""
    for record in manifest.arrays.values():
        for piece in record.pieces:
            if piece.shard in shards:
                shards[piece.shard].piece(piece.key, record.dtype, piece.stop - piece.start)


def _receiver(record: ArrayRecord, target: Leaf | None) -> tuple[torch.Tensor, Callable[[], Leaf]]:
    """A flat, contiguous CPU tensor to fill with the array, and what turns it into the result.

    The live array is filled in place when it is such a tensor already (no second copy, and other
    references see the restored values); otherwise through a staging tensor.
    """
    if isinstance(target, np.ndarray) and target.flags.c_contiguous and target.flags.writeable:
        return torch.from_numpy(target).view(-1), lambda: target
    if isinstance(target, torch.Tensor) and target.is_contiguous() and target.device.type == "cpu":
        return target.detach().view(-1), lambda: target
    flat = torch.empty(record.numel, dtype=record.dtype)
    if target is None:
        return flat, lambda: flat.view(record.shape)

    def into_target() -> Leaf:
        if isinstance(target, np.ndarray):
            np.copyto(target, flat.view(record.shape).numpy())
        else:
            with torch.no_grad():
                target.copy_(flat.view(record.shape))
        return target

    return flat, into_target


def _check_compatible(manifest: Manifest, live: Mapping[str, Leaf], lazy: tuple[str, ...]) -> None:
    """Fail before touching the state if its arrays do not match the checkpoint's."""
    where = f"checkpoint step {manifest.step}"
    for name, leaf in live.items():
        record = manifest.arrays.get(name)
        if record is None:
            raise StateMismatchError(f"{where} has no {name!r}, which the state to restore into has")
        if tuple(leaf.shape) != record.shape:
            saved, live_shape = list(record.shape), list(leaf.shape)
            raise StateMismatchError(
                f"{where}: {name!r} has shape {saved} in the checkpoint but {live_shape} in the state"
            )
        dtype = _dtype_of(name, leaf)
        if dtype != record.dtype:
            raise StateMismatchError(f"{where}: {name!r} is {record.dtype} in the checkpoint but {dtype} in the state")
    for name in manifest.arrays:
        if name not in live and not name.startswith((f"{RANK_LOCAL}/", *lazy)):
            raise StateMismatchError(f"{where} has {name!r}, which the state to restore into does not have")


def _array_records(specs: tuple[ArraySpec, ...], plan: list[list[Piece]]) -> dict[str, ArrayRecord]:
    records = {s.name: ArrayRecord(s.dtype, s.shape, []) for s in specs}
    for rank, pieces in enumerate(plan):
        for p in pieces:
            records[p.name].pieces.append(PieceRecord(rank, p.key, p.start, p.stop))
    return records


class _DictState:
    """A plain dict of arrays and scalars, restored in place (arrays keep their identity)."""

    def __init__(self, data: dict) -> None:
        self.data = data

    def state_dict(self) -> dict:
        return self.data

    def load_state_dict(self, loaded: dict) -> None:
        _update_in_place(self.data, loaded)


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


_NUMPY_DTYPES: dict[np.dtype, torch.dtype] = {}


def _dtype_of(name: str, leaf: Leaf) -> torch.dtype:
    if isinstance(leaf, torch.Tensor):
        return leaf.dtype
    if leaf.dtype not in _NUMPY_DTYPES:
        try:
            _NUMPY_DTYPES[leaf.dtype] = torch.from_numpy(np.empty(0, dtype=leaf.dtype)).dtype
        except TypeError:
            raise CheckpointError(
                f"cannot checkpoint {name!r}: numpy dtype {leaf.dtype} has no tensor equivalent"
            ) from None
    return _NUMPY_DTYPES[leaf.dtype]


def _numel(leaf: Leaf) -> int:
    return leaf.numel() if isinstance(leaf, torch.Tensor) else int(leaf.size)


def _first_problem(problems: Any) -> str | None:
    return next((p for p in problems if p), None)


def _layout_problem(layouts: list[str]) -> str | None:
    odd = [rank for rank, lay in enumerate(layouts) if lay != layouts[0]]
    if odd:
        return f"ranks {odd} hold a different replicated state (names, shapes or dtypes) than rank 0"
    return None


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _same_path(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def _close_at_exit(ref: weakref.ref) -> None:
    checkpointer = ref()
    if checkpointer is not None and not checkpointer._closed:
        try:
            checkpointer.close()
        except CheckpointError as exc:
            logger.error("at exit: %s", exc)
