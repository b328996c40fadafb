"""How a checkpoint is written: the background half of a save, from the host arena to every tier.

Order of operations of one :class:`WriteJob` (each rank), once ``save`` has queued it:

1. writer thread: wait for the copy into the arena; all ranks check that they hold the same
   layout; write this rank's shard to the first tier and fsync it; free the arena; all ranks
   exchange their shard records; rank 0 writes the manifest (the commit) and ``latest``; old
   checkpoints are pruned;
2. flusher thread (node-local tier only, when the job persists): copy the shard to the shared
   tier, verifying it on the way; rank 0 commits there too.

Every collective runs on a duplicate of the user's communicator owned by its thread, and every
rank takes part in it even when its own part failed, so that one rank's full disk becomes an
error on every rank instead of a hang. Errors are handed to ``on_error`` and surface at the
caller's next ``save``, ``wait`` or ``close``; a failed checkpoint never touches committed ones.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from resilient_flows.checkpoint.boxes import Box
from resilient_flows.checkpoint.comm import Comm, first_problem
from resilient_flows.checkpoint.manifest import ArrayRecord, Manifest, PieceRecord, write_manifest
from resilient_flows.checkpoint.planner import WriteItem
from resilient_flows.checkpoint.shardfile import ShardEntry, ShardRecord, copy_shard, write_shard
from resilient_flows.checkpoint.snapshot import HostArena, Snapshot
from resilient_flows.checkpoint.tiers import MANIFEST, Tier, shard_filename

__all__ = ["CheckpointStats", "WriteJob", "WritePipeline"]

logger = logging.getLogger(__name__)


@dataclass
class WriteJob:
    """One checkpoint on its way to the tiers, as this rank knows it."""

    step: int
    persist: bool
    snapshot: Snapshot
    entries: list[ShardEntry]
    layout: str
    skeleton: dict
    arrays: dict[str, tuple[torch.dtype, tuple[int, ...]]]
    plan: list[list[WriteItem]]
    local_skeleton: dict
    local_arrays: dict[str, tuple[torch.dtype, tuple[int, ...]]]
    started: float
    on_commit: Callable[[Tier, int], None] | None = None
    cached: bool = False
    manifest: Manifest | None = field(default=None)
    record: ShardRecord | None = field(default=None)


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


class WritePipeline:
    """The writer thread, and with a node-local tier the flusher thread, of one Checkpointer."""

    def __init__(
        self,
        tiers: list[Tier],
        comm: Comm,
        keep: int,
        arena: HostArena,
        arena_free: threading.Event,
        on_error: Callable[[str], None],
        stats: CheckpointStats,
    ) -> None:
        self.tiers = tiers
        self.local = tiers[0] if len(tiers) > 1 else None
        self.shared = tiers[-1]
        self.rank, self.world_size = comm.rank, comm.size
        self.keep = keep
        self.stats = stats
        self._arena = arena
        self._arena_free = arena_free
        self._on_error = on_error
        self._write_comm = comm.dup()
        self._flush_comm = comm.dup() if self.local is not None else None
        self._lock = threading.Lock()
        self._prune_lock = threading.Lock()
        self._flush_pending: set[int] = set()
        self._write_q: queue.Queue[WriteJob | None] = queue.Queue()
        self._flush_q: queue.Queue[WriteJob | None] = queue.Queue(maxsize=1)
        self._threads = [threading.Thread(target=self._serve, args=(self._write_q, self._write), name="rf-writer")]
        if self.local is not None:
            flusher = threading.Thread(target=self._serve, args=(self._flush_q, self._flush), name="rf-flusher")
            self._threads.append(flusher)
        for thread in self._threads:
            thread.daemon = True
            thread.start()

    @property
    def comm(self) -> Comm:
        """The writer's communicator: idle whenever the pipeline is drained."""
        return self._write_comm

    @property
    def shard_name(self) -> str:
        return shard_filename(self.rank, self.world_size)

    def submit(self, job: WriteJob) -> None:
        self._write_q.put(job)

    def drain(self) -> None:
        """Block until every submitted job is committed, and flushed where it persists."""
        self._write_q.join()
        if self.local is not None:
            self._flush_q.join()

    def stop(self, free: bool) -> None:
        """End the threads once drained; ``free`` releases the communicators (collective)."""
        self._write_q.put(None)
        self._threads[0].join()
        if self.local is not None:
            self._flush_q.put(None)
            self._threads[1].join()
        if free:
            for comm in {id(c): c for c in (self._write_comm, self._flush_comm) if c is not None}.values():
                comm.free()

    def prune(self, tier: Tier, step: int | None) -> None:
        """Retention; the writer and the flusher both call it, one at a time."""
        with self._lock:
            protect = set(self._flush_pending) | ({step} if step is not None else set())
        with self._prune_lock:
            if tier is self.local:
                tier.prune(self.keep, protect, own_files=[self.shard_name])
            elif self.rank == 0:
                tier.prune(self.keep, protect)

    # ------------------------------------------------------------------ threads

    def _serve(self, jobs: queue.Queue, handle: Callable[[WriteJob], None]) -> None:
        while (job := jobs.get()) is not None:
            try:
                handle(job)
            except BaseException as exc:  # a bug, not an I/O error: still never lost
                logger.exception("checkpoint thread failed")
                self._on_error(f"step {job.step}: internal error {exc!r}")
                self._arena_free.set()
            finally:
                jobs.task_done()
        jobs.task_done()

    def _write(self, job: WriteJob) -> None:
        comm, tier, step = self._write_comm, self.tiers[0], job.step
        step_dir = tier.step_dir(step)
        problem = None
        try:
            job.snapshot.wait_copied()
        except Exception as exc:
            problem = f"copying the state failed: {exc}"
        exists = self.rank == 0 and (step_dir / MANIFEST).is_file()
        before = comm.allgather((job.layout, exists, problem))
        problem = first_problem(p for _, _, p in before) or _layout_problem([lay for lay, _, _ in before])
        if problem is None and before[0][1]:
            self._arena_free.set()
            logger.info("step %d is already committed in the %s tier %s; keeping it", step, tier.name, tier.path)
            return
        digests: dict[str, str] = {}
        if problem is None:
            try:
                step_dir.mkdir(parents=True, exist_ok=True)
                meta = {"format": "resilient-flows", "step": str(step), "rank": str(self.rank)}
                job.record, digests = write_shard(
                    step_dir / self.shard_name, job.entries, self._arena.buffer, meta, cached=job.cached
                )
            except Exception as exc:
                problem = f"writing {step_dir / self.shard_name} failed: {exc}"
        self._arena_free.set()
        after = comm.allgather((job.record, digests, job.local_skeleton, job.local_arrays, problem))
        problem = problem or first_problem(p for *_, p in after)
        if problem is None:
            commit_problem, text = None, None
            if self.rank == 0:
                job.manifest = _manifest(job, after)
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
        if job.persist and self.local is not None:
            with self._lock:
                self._flush_pending.add(step)
            self._flush_q.put(job)
        self._committed(job, tier)
        self.prune(tier, step)

    def _flush(self, job: WriteJob) -> None:
        comm, step = self._flush_comm, job.step
        src = self.local.step_dir(step) / self.shard_name
        dst_dir = self.shared.step_dir(step)
        try:
            exists = comm.bcast(self.rank == 0 and (dst_dir / MANIFEST).is_file())
            problem = None
            if not exists:
                try:
                    dst_dir.mkdir(parents=True, exist_ok=True)
                    copy_shard(src, dst_dir / self.shard_name, job.record)
                except Exception as exc:
                    problem = f"copying {src} to {dst_dir} failed: {exc}"
                problem = first_problem(comm.allgather(problem))
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
            self.prune(self.local, None)  # the local copies it protected while flushing may go now

    def _committed(self, job: WriteJob, tier: Tier) -> None:
        if job.on_commit is None:
            return
        try:
            job.on_commit(tier, job.step)
        except Exception:
            logger.exception("on_commit of step %d in the %s tier failed", job.step, tier.name)

    def _abandon(self, tier: Tier, step_dir: Path, message: str) -> None:
        """Remove what a failed checkpoint wrote; a committed one (even of this step) is untouched."""
        committed = (step_dir / MANIFEST).is_file()
        for name in (self.shard_name + ".tmp",) if committed else (self.shard_name, self.shard_name + ".tmp"):
            with contextlib.suppress(OSError):
                (step_dir / name).unlink(missing_ok=True)
        if self.rank == 0 and not committed:
            shutil.rmtree(step_dir, ignore_errors=True)
        self._on_error(message)


def _manifest(job: WriteJob, gathered: list) -> Manifest:
    """Rank 0's commit record: every rank's pieces with their boxes and checksums."""
    arrays = {name: ArrayRecord(dtype, shape, []) for name, (dtype, shape) in job.arrays.items()}
    for rank, items in enumerate(job.plan):
        digests = gathered[rank][1]
        for item in items:
            arrays[item.name].pieces.append(PieceRecord(rank, item.key, item.box, digests[item.key]))
    for rank, (_, digests, _, local_arrays, _) in enumerate(gathered):
        for name, (dtype, shape) in local_arrays.items():
            arrays[name] = ArrayRecord(dtype, shape, [PieceRecord(rank, name, Box.whole(shape), digests[name])])
    return Manifest(
        step=job.step,
        world_size=len(gathered),
        skeleton=job.skeleton,
        rank_local=[skeleton for _, _, skeleton, _, _ in gathered],
        arrays=arrays,
        shards=[record for record, *_ in gathered],
    )


def _layout_problem(layouts: list[str]) -> str | None:
    odd = [rank for rank, lay in enumerate(layouts) if lay != layouts[0]]
    if odd:
        return f"ranks {odd} hold a different state (names, shapes, dtypes or placements) than rank 0"
    return None
