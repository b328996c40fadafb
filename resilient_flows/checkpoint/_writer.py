"""How a checkpoint is written: the background half of a save, from the host arena to every tier.

Tiers are ordered fastest first; all but the last are node-local (each node holds its own ranks'
shards and a copy of the manifest), the last is shared (rank 0 commits there). A checkpoint goes
to a prefix of the tiers: ``WriteJob.depth`` of them, decided at ``save`` on every rank alike.

Order of operations of one :class:`WriteJob` (each rank), once ``save`` has queued it:

1. writer thread: wait for the copy into the arena; all ranks check that they hold the same
   layout; write this rank's shard to the first tier and fsync it; release the arena (it still
   holds the checkpoint until the next save takes it); all ranks exchange their shard records;
   rank 0 writes the manifest (the commit) and ``latest``; old checkpoints are pruned;
2. flusher thread (one, behind a one-slot queue, when the job goes further): for each further
   tier in order, write the shard there from the arena if it still holds this checkpoint, else
   (or from the chunk where a newer save took the arena back) from the previous tier's file,
   verified on the way; all ranks commit that tier as in 1. A failed tier ends the job's flush.
   A peer tier is not written from the tier before it: each rank's shard goes to another node
   (see :mod:`~resilient_flows.checkpoint._peer`), and the tier after it is written from this
   rank's own shard in the nearest tier before it.

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

from resilient_flows.checkpoint._boxes import Box
from resilient_flows.checkpoint._buddy import send_copy
from resilient_flows.checkpoint._comm import Comm, first_problem
from resilient_flows.checkpoint._heartbeat import HeartbeatWriter
from resilient_flows.checkpoint._manifest import ArrayRecord, Manifest, PieceRecord, write_manifest
from resilient_flows.checkpoint._peer import Ring, copies_within, held_bytes, plan_step, replicate
from resilient_flows.checkpoint._registry import BuddyLink
from resilient_flows.checkpoint._shardfile import (
    ShardEntry,
    ShardRecord,
    copy_shard,
    header_bytes,
    send_shard,
    write_shard,
)
from resilient_flows.checkpoint._snapshot import HostArena, Snapshot
from resilient_flows.checkpoint._tiers import MANIFEST, Tier, shard_filename
from resilient_flows.checkpoint._writeplan import WriteItem
from resilient_flows.errors import CheckpointError, Failure, PeerTransferError

logger = logging.getLogger(__name__)


@dataclass
class WriteJob:
    """One checkpoint on its way to the tiers, as this rank knows it."""

    step: int
    depth: int  # how many tiers, from the first, this checkpoint goes to
    generation: int  # the host arena's generation holding it
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
    head: bytes = b""
    digests: dict[str, str] = field(default_factory=dict)

    def shard(self) -> ShardRecord:
        """This rank's shard record, which every step after the first tier's write relies on."""
        if self.record is None:
            raise CheckpointError(f"step {self.step}: this rank's shard was never written")
        return self.record

    def committed(self) -> Manifest:
        """The manifest, which every rank holds once the first tier committed the step."""
        if self.manifest is None:
            raise CheckpointError(f"step {self.step}: no manifest committed")
        return self.manifest


@dataclass
class CheckpointStats:
    """What checkpointing has cost so far on this rank; every time in seconds.

    ``persisted`` and ``last_persist_latency`` are about the last (shared) tier. In a peer tier,
    ``tier_bytes`` counts the bytes this rank sent to its buddy. Per tier,
    fastest first: ``tier_commits`` checkpoints committed there, and ``tier_bytes`` this rank
    wrote there in ``tier_seconds`` (from the start of its write to the commit), whose ratio is
    the bandwidth the tier gave a checkpoint. Flushes to later tiers count in ``flushes_from_arena``
    when they came wholly from memory, in ``flushes_reread`` when they read a lower tier's file.
    """

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
    last_checkpoint_bytes: int = 0  # every rank's shards of the last committed checkpoint
    flushes_from_arena: int = 0
    flushes_reread: int = 0
    tier_commits: list[int] = field(default_factory=list)
    tier_bytes: list[int] = field(default_factory=list)
    tier_seconds: list[float] = field(default_factory=list)
    peer_held_bytes: int = 0  # what this rank's node holds of other nodes' shards, in its peer tier
    peer_skipped: int = 0  # replications a node left out for want of room under the tier's capacity
    peer_failed: int = 0  # replications that failed (the checkpoint stood)

    @classmethod
    def of_tiers(cls, count: int) -> CheckpointStats:
        return cls(tier_commits=[0] * count, tier_bytes=[0] * count, tier_seconds=[0.0] * count)

    def bandwidth(self, tier: int) -> float | None:
        """Bytes per second this rank's writes to tier ``tier`` took so far; None before the first."""
        seconds = self.tier_seconds[tier]
        return self.tier_bytes[tier] / seconds if seconds > 0 else None

    def record_tier(self, tier: int, nbytes: int, seconds: float) -> None:
        """One commit of ``nbytes`` from this rank to tier ``tier``, ``seconds`` after its write began."""
        self.tier_commits[tier] += 1
        self.tier_bytes[tier] += nbytes
        self.tier_seconds[tier] += seconds


class WritePipeline:
    """The writer thread, and with several tiers the flusher thread, of one Checkpointer."""

    def __init__(
        self,
        tiers: list[Tier],
        comm: Comm,
        keep: int,
        arena: HostArena,
        on_error: Callable[[Failure], None],
        stats: CheckpointStats,
        ring: Ring | None = None,
        peer_capacity: dict[int, int | None] | None = None,
    ) -> None:
        self.tiers = tiers
        self.ring = ring
        #: Peer tiers by index, each with its bound in bytes per node (None: only ``keep``).
        self.peer_capacity = peer_capacity or {}
        self._peer_keep: dict[int, int] = {}  # copies this node keeps per peer tier, as last planned
        #: Ranks on one node: how rank 0 reaches the buddy nodes' services (see ``_buddy``).
        self.buddies: BuddyLink | None = None
        self.shared = tiers[-1]
        self.rank, self.world_size = comm.rank, comm.size
        self.keep = keep
        self.stats = stats
        self._arena = arena
        self._on_error = on_error
        self.heartbeat: HeartbeatWriter | None = None  # rank 0's, set by the Checkpointer
        self._write_comm = comm.dup()
        self._flush_comm = comm.dup() if len(tiers) > 1 else None
        self._lock = threading.Lock()
        self._prune_lock = threading.Lock()
        self._flush_pending: set[int] = set()
        self._flushing = False
        self._flush_busy = 0.0  # seconds the flusher has worked, finished flushes
        self._flush_since: float | None = None  # when the running flush began
        self._write_q: queue.Queue[WriteJob | None] = queue.Queue()
        self._flush_q: queue.Queue[WriteJob | None] = queue.Queue(maxsize=1)
        last = len(tiers) == 1  # the thread whose work is the flush to the last tier, as models see it
        self._threads = [
            threading.Thread(target=self._serve, args=(self._write_q, self._write, last), name="rf-writer")
        ]
        if len(tiers) > 1:
            flusher = threading.Thread(target=self._serve, args=(self._flush_q, self._flush, True), name="rf-flusher")
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

    @property
    def flushing(self) -> bool:
        """A checkpoint is being sent to a tier after the first (to the only one, with one tier)."""
        return self._flushing

    @property
    def flush_seconds(self) -> float:
        """Seconds the flusher has worked so far, the running flush included."""
        with self._lock:
            since = self._flush_since
            return self._flush_busy + (time.perf_counter() - since if since is not None else 0.0)

    def node_local(self, tier: Tier) -> bool:
        """Every tier but the last is node-local: each node sees only its own ranks' shards."""
        return tier is not self.shared

    def own_copy(self, index: int) -> Tier:
        """The nearest tier before ``index`` that holds this rank's own shard (not a peer tier)."""
        return next(self.tiers[i] for i in range(index - 1, -1, -1) if i not in self.peer_capacity)

    def discard_after(self, step: int) -> list[int]:
        """Drop every checkpoint newer than ``step`` from the tiers this rank removes files of."""
        removed: set[int] = set()
        for index, tier in enumerate(self.tiers):
            if index in self.peer_capacity:
                if self.ring is not None and self.ring.leader(self.rank):
                    removed.update(tier.discard_after(step))
            elif self.node_local(tier):
                removed.update(tier.discard_after(step, own_files=[self.shard_name]))
            elif self.rank == 0:
                removed.update(tier.discard_after(step))
        return sorted(removed)

    def submit(self, job: WriteJob) -> None:
        self._write_q.put(job)

    def drain(self) -> None:
        """Block until every submitted job is committed, and flushed as far as it goes."""
        self._write_q.join()
        if self._flush_comm is not None:
            self._flush_q.join()

    def stop(self, free: bool) -> None:
        """End the threads once drained; ``free`` frees the communicators (collective), otherwise
        they are only released (the user tore the communication down)."""
        self._write_q.put(None)
        self._threads[0].join()
        if self._flush_comm is not None:
            self._flush_q.put(None)
            self._threads[1].join()
        for comm in {id(c): c for c in (self._write_comm, self._flush_comm) if c is not None}.values():
            if free:
                comm.free()
            else:
                comm.release()

    def prune(self, tier: Tier, step: int | None) -> None:
        """Retention; the writer and the flusher both call it, one at a time. Steps still to be
        flushed stay in every tier, so that a flush that has to re-read finds them."""
        with self._lock:
            protect = set(self._flush_pending) | ({step} if step is not None else set())
        with self._prune_lock:
            index = self.tiers.index(tier)
            if index in self.peer_capacity:  # one node's copies, whatever their names: its leader's
                if self.ring is not None and self.ring.leader(self.rank):
                    tier.prune(self._peer_keep.get(index, self.keep), protect)
            elif self.node_local(tier):
                tier.prune(self.keep, protect, own_files=[self.shard_name])
            elif self.rank == 0:
                tier.prune(self.keep, protect)

    # ------------------------------------------------------------------ threads

    def _serve(self, jobs: queue.Queue, handle: Callable[[WriteJob], None], flushes: bool) -> None:
        while (job := jobs.get()) is not None:
            if flushes:
                began = time.perf_counter()
                with self._lock:
                    self._flush_since = began
                self._flushing = True
            try:
                handle(job)
            except BaseException as exc:  # a bug, not an I/O error: still never lost
                logger.exception("checkpoint thread failed")
                self._on_error(Failure("error", f"step {job.step}: internal error {exc!r}"))
                self._arena.release(job.generation)
            finally:
                if flushes:
                    self._flushing = False
                    with self._lock:
                        self._flush_busy += time.perf_counter() - began
                        self._flush_since = None
                jobs.task_done()
        jobs.task_done()

    def _write(self, job: WriteJob) -> None:
        comm, tier, step = self._write_comm, self.tiers[0], job.step
        step_dir = tier.step_dir(step)
        problem = None
        try:
            job.snapshot.wait_copied()
        except Exception as exc:
            problem = Failure.of(exc, "copying the state failed")
        began = time.perf_counter()
        exists = self.rank == 0 and (step_dir / MANIFEST).is_file()
        before = comm.allgather((job.layout, exists, problem))
        problem = first_problem(p for _, _, p in before) or _layout_problem([lay for lay, _, _ in before])
        if problem is None and before[0][1]:
            self._arena.release(job.generation)
            logger.info("step %d is already committed in the %s tier %s; keeping it", step, tier.name, tier.path)
            return
        if problem is None:
            try:
                step_dir.mkdir(parents=True, exist_ok=True)
                meta = {"format": "resilient-flows", "step": str(step), "rank": str(self.rank)}
                job.head = header_bytes(job.entries, meta)
                job.record, job.digests = write_shard(
                    step_dir / self.shard_name, job.head, job.entries, self._arena.buffer, cached=job.cached
                )
            except Exception as exc:
                problem = Failure.of(exc, f"writing {step_dir / self.shard_name} failed")
        self._arena.release(job.generation)
        after = comm.allgather((job.record, job.digests, job.local_skeleton, job.local_arrays, problem))
        problem = problem or first_problem(p for *_, p in after)
        if problem is None:
            problem = self._commit(comm, job, tier, lambda: _manifest(job, after, self._placement(job)))
        if problem is not None:
            self._abandon(
                tier, step_dir, problem.within(f"checkpoint of step {step} to the {tier.name} tier {tier.path}")
            )
            return
        self.stats.committed += 1
        self.stats.bytes_written += job.shard().nbytes
        self.stats.last_checkpoint_bytes = sum(record.nbytes for record, *_ in after)
        self.stats.last_commit_latency = time.perf_counter() - job.started
        self.stats.record_tier(0, job.shard().nbytes, time.perf_counter() - began)
        if job.depth > 1:
            with self._lock:
                self._flush_pending.add(step)
            self._flush_q.put(job)
        self._committed(job, tier)
        self.prune(tier, step)

    def _commit(self, comm: Comm, job: WriteJob, tier: Tier, manifest: Callable[[], Manifest]) -> Failure | None:
        """Rank 0 commits ``tier`` (``manifest()`` builds the record, once); in a node-local tier
        every other rank then puts a copy of the manifest beside its own shard. Collective; the
        problem, on every rank, or None."""
        step_dir = tier.step_dir(job.step)
        problem, text = None, None
        if self.rank == 0:
            try:
                job.manifest = job.manifest or manifest()
                write_manifest(step_dir, job.manifest)
                tier.write_latest(job.step)
            except Exception as exc:
                problem = Failure.of(exc, f"committing {step_dir} failed")
            others_lack_it = tier is self.tiers[0] and self.node_local(tier)  # later tiers: they have it
            text = job.manifest.to_json() if others_lack_it and job.manifest is not None else None
        problem, text = comm.bcast((problem, text))
        if problem is not None:
            return problem
        if text is not None and self.rank != 0:
            job.manifest = job.manifest or Manifest.from_json(text, step_dir.name)
        if self.node_local(tier) and self.rank != 0 and not (step_dir / MANIFEST).is_file():
            try:
                write_manifest(step_dir, job.committed())  # this rank's node has no copy yet
            except OSError as exc:  # this node's copy is unusable; restore falls back to another tier
                logger.warning("cannot commit step %d in this node's %s tier: %s", job.step, tier.name, exc)
        return None

    def _flush(self, job: WriteJob) -> None:
        try:
            for index in range(1, job.depth):
                if not self._flush_to(job, index):
                    return
        finally:
            with self._lock:
                self._flush_pending.discard(job.step)
            for tier in self.tiers[: job.depth - 1]:  # the copies it protected while flushing may go now
                self.prune(tier, None)

    def _flush_to(self, job: WriteJob, index: int) -> bool:
        """Send the job's checkpoint to tier ``index`` and commit it there; False when that failed."""
        if index in self.peer_capacity:
            return self._replicate(job, index)
        comm, step, tier = self._flush_group(), job.step, self.tiers[index]
        src = self.own_copy(index).step_dir(step) / self.shard_name
        dst_dir = tier.step_dir(step)
        began = time.perf_counter()
        exists = comm.bcast(self.rank == 0 and (dst_dir / MANIFEST).is_file())
        problem = None
        if not exists:
            try:
                dst_dir.mkdir(parents=True, exist_ok=True)
                self._send(job, src, dst_dir / self.shard_name)
            except Exception as exc:
                problem = Failure.of(exc, f"copying {src} to {dst_dir} failed")
            problem = first_problem(comm.allgather(problem))
            if problem is None:
                problem = self._commit(comm, job, tier, job.committed)
        if problem is not None:
            where = f"the {tier.name} tier {tier.path}"
            self._abandon(tier, dst_dir, problem.within(f"flush of step {step} to {where}"))
            return False
        if tier is self.shared:
            self.stats.persisted += 1
            self.stats.last_persist_latency = time.perf_counter() - job.started
        if not exists:
            self.stats.record_tier(index, job.shard().nbytes, time.perf_counter() - began)
        self._committed(job, tier)
        self.prune(tier, step)
        return True

    def _flush_group(self) -> Comm:
        """The flush thread's communicator, which a writer with more than one tier has."""
        if self._flush_comm is None:
            raise CheckpointError("a flush to a later tier without a second tier")
        return self._flush_comm

    def _placement(self, job: WriteJob) -> dict[str, list[str]]:
        """Where each shard's node-local copies of ``job`` go (the manifest's ``copies``)."""
        ring = self.ring
        if ring is None:
            return {}
        placement: dict[str, list[str]] = {}
        for rank, host in enumerate(ring.hosts):
            where = []
            for index, tier in enumerate(self.tiers[: job.depth]):
                if index in self.peer_capacity:
                    buddy = ring.buddy(rank)
                    if buddy is not None:
                        where.append(f"{tier.name} on {ring.hosts[buddy]}")
                elif self.node_local(tier):
                    where.append(f"{tier.name} on {host}")
            placement[shard_filename(rank, self.world_size)] = where
        return placement

    def _replicate(self, job: WriteJob, index: int) -> bool:
        """The peer tier ``index``: this rank's shard to its buddy, the shards of those it is buddy
        of from them. A single node has no buddy: the tier is passed over. A copy that fails is
        reported and passed over too: the checkpoint is committed, and goes on to the next tier."""
        tier, ring = self.tiers[index], self.ring
        if ring is None or not ring.active or job.manifest is None:
            if self.buddies is not None and job.manifest is not None and self.rank == 0:
                self._send_to_buddy(job, index)
            return True
        began = time.perf_counter()
        plan = plan_step(ring, job.manifest, self.peer_capacity[index], self.keep)
        host = ring.hosts[self.rank]
        if host in plan.skipped:
            self.stats.peer_skipped += 1
            logger.warning(
                "step %d: no peer copy on this node, its shards exceed the peer tier's capacity of %s bytes",
                job.step,
                self.peer_capacity[index],
            )
        self._peer_keep[index] = plan.keep.get(host, self.keep)
        source = self.own_copy(index).step_dir(job.step) / self.shard_name
        problem = replicate(self._flush_group(), ring, plan, job.manifest, source, tier)
        if problem is not None:  # an extra copy: the checkpoint stands, and goes on to the next tier
            self.stats.peer_failed += 1
            logger.warning("step %d: no peer copy in the %s tier: %s", job.step, tier.name, problem.message)
            return True
        if self.rank in plan.sends:
            self.stats.record_tier(index, job.shard().nbytes, time.perf_counter() - began)
        self.prune(tier, job.step)
        self.stats.peer_held_bytes = held_bytes(tier)
        self._committed(job, tier)
        return True

    def _send_to_buddy(self, job: WriteJob, index: int) -> None:
        """Ranks on one node: rank 0 sends the step, committed in the nearest tier before ``index``
        (all ranks' shards lie there, on this node), to a buddy node's service. As for a ring, a
        copy that does not fit the bound or fails is reported and passed over."""
        assert self.buddies is not None and job.manifest is not None and self.ring is not None
        capacity = self.peer_capacity[index]
        if copies_within(capacity, job.manifest.nbytes, self.keep) < 1:
            self.stats.peer_skipped += 1
            logger.warning("step %d: no peer copy, its shards exceed the peer tier's bound %s", job.step, capacity)
            return
        began = time.perf_counter()
        step_dir = self.own_copy(index).step_dir(job.step)
        try:
            host = send_copy(self.buddies, self.ring.hosts[self.rank], step_dir, job.manifest, self.keep)
        except (OSError, PeerTransferError) as exc:
            self.stats.peer_failed += 1
            logger.warning("step %d: no peer copy in the %s tier: %s", job.step, self.tiers[index].name, exc)
            return
        if host is None:  # no other node's service yet: nothing to copy to, nothing wrong
            logger.debug("step %d: no other node to keep a peer copy", job.step)
            return
        self.stats.record_tier(index, job.manifest.nbytes, time.perf_counter() - began)
        logger.debug("step %d: peer copy kept by %s", job.step, host)

    def _send(self, job: WriteJob, src: Path, dst: Path) -> None:
        """From the arena while it still holds this checkpoint, else (or from where a newer save
        took it back) from ``src``; counted in the stats by where the bytes came from."""
        if not self._arena.lend(job.generation):
            copy_shard(src, dst, job.shard())
            self.stats.flushes_reread += 1
            return
        from_memory = send_shard(
            dst, job.head, job.entries, self._arena.buffer, job.shard(), job.digests, src, self._arena
        )
        if from_memory == job.shard().nbytes:
            self.stats.flushes_from_arena += 1
        else:
            self.stats.flushes_reread += 1

    def _committed(self, job: WriteJob, tier: Tier) -> None:
        if tier is self.shared and self.heartbeat is not None:
            self.heartbeat.committed(job.step, time.perf_counter() - job.started)
        if job.on_commit is None:
            return
        try:
            job.on_commit(tier, job.step)
        except Exception:
            logger.exception("on_commit of step %d in the %s tier failed", job.step, tier.name)

    def _abandon(self, tier: Tier, step_dir: Path, failure: Failure) -> None:
        """Remove what a failed checkpoint wrote; a committed one (even of this step) is untouched."""
        committed = (step_dir / MANIFEST).is_file()
        for name in (self.shard_name + ".tmp",) if committed else (self.shard_name, self.shard_name + ".tmp"):
            with contextlib.suppress(OSError):
                (step_dir / name).unlink(missing_ok=True)
        if self.rank == 0 and not committed:
            shutil.rmtree(step_dir, ignore_errors=True)
        self._on_error(failure)


def _manifest(job: WriteJob, gathered: list, copies: dict[str, list[str]]) -> Manifest:
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
        copies=copies,
    )


def _layout_problem(layouts: list[str]) -> Failure | None:
    odd = [rank for rank, lay in enumerate(layouts) if lay != layouts[0]]
    if odd:
        return Failure(
            "mismatch", f"ranks {odd} hold a different state (names, shapes, dtypes or placements) than rank 0"
        )
    return None
