"""The training loop contract: a user function receives a :class:`TrainContext` and gets
checkpointing, resume, preemption handling and metrics without writing any of them.

A member's files (its :class:`~resilient_flows.rundir.TaskLayout`): the shared checkpoint tier,
a metrics line per logged step (a resumed attempt logs the redone steps again), the runner's
requests (preempt, retire), which the member consumes, the attempt counter, and its result,
written once it finished.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from resilient_flows.checkpoint import Checkpointer, TrainState
from resilient_flows.errors import LaunchError, Preempted, ResilientFlowsError, StorageFullError
from resilient_flows.rundir import TaskLayout, member_layout
from resilient_flows.rundir.events import EventLog
from resilient_flows.rundir.metrics import MetricsLog
from resilient_flows.training.autotune import MAX_PERSIST_EVERY, AutoTuner, tuned_fields
from resilient_flows.training.boundary import StopSignals, agreed_request, consume_request, fire_faults, pending_request
from resilient_flows.training.contract import member_tiers, node_local_dir, node_memory_dir
from resilient_flows.training.control import (
    CloneOrder,
    RequestWatch,
    count_attempt,
    read_clone_orders,
)
from resilient_flows.training.distributed import (
    DistributedInfo,
    comm_size,
    init_process_group,
    shutdown_process_group,
)
from resilient_flows.training.fork import Handoff, Seed, apply_overrides, mark_forking, wait_for_seed
from resilient_flows.training.heartbeat import Heartbeat
from resilient_flows.training.spec import MemberSpec

__all__ = ["Preempted", "TrainContext", "state_digest"]

logger = logging.getLogger(__name__)

#: How many checkpoints in a row may fail on a full file system before the member gives up, and
#: the pause between two tries of a checkpoint it cannot go on without (the last, or a stop's).
STORAGE_RETRIES = 300
STORAGE_RETRY_S = 2.0


def state_digest(module: Any) -> str:
    """SHA-256 over a ``state_dict``'s tensors in key order: equal digests mean equal weights, bit for bit.

    Sharded (DTensor) values are gathered first, so that the digest is of the whole model and the
    same on every rank; every rank of the model's group must call it.
    """
    from torch.distributed.tensor import DTensor

    digest = hashlib.sha256()
    for key, value in module.state_dict().items():
        digest.update(key.encode())
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if isinstance(value, torch.Tensor):
            digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()


class TrainContext:
    """What a training function sees of its member: parameters, checkpointing, metrics, stop requests.

    Attributes
    ----------
    params:
        The member's parameters from the workflow (``steps`` included).
    seed, name, attempt:
        The member's seed, its name, and which attempt this is (1 for the first).
    restored_step:
        The step restored by :meth:`track`, or None on a fresh start.
    directory:
        The member's directory in the run directory.
    inputs:
        The output directory of each workflow stage the member reads (``after:`` in YAML), by name.
    rank, world_size, group, device:
        This process's rank among the member's ranks, how many there are, their
        ``torch.distributed`` process group (None on one rank) and where this rank computes.

    A member with several ranks (``ranks`` in its spec, or a ``comm`` of several) forms its
    process group here (:func:`~resilient_flows.training.distributed.init_process_group`), shares
    it with its checkpointer, and destroys it on :meth:`close`. ``comm``: an mpi4py communicator
    to carry the rendezvous (what ``mpiexec`` members pass), or a torch ProcessGroup to use.

    ``attempt`` is given when another process runs the attempt (a command member's launcher, see
    :func:`~resilient_flows.training.from_env`): it counted the attempt, announces it and beats
    for it, so this context does none of the three. Without it, the context does them itself.
    """

    def __init__(
        self, spec: MemberSpec, run_dir: str | os.PathLike, comm: Any = None, *, attempt: int | None = None
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.seed = spec.seed
        self.params = {**spec.params, "steps": spec.steps}
        self.run_dir = Path(run_dir)
        self.inputs = {name: self.run_dir / path for name, path in spec.inputs.items()}
        self.layout = member_layout(run_dir, spec.name)
        self.directory = self.layout.root
        self.directory.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(run_dir)
        self.restored_step: int | None = None
        self.state: TrainState | None = None
        self._last_metrics: dict[str, Any] = {}
        self._last_saved: int | None = None
        self._last_save_time = time.monotonic()
        self._signals = StopSignals()
        self._orphaned: str | None = None  # why the member stops: its runner is gone
        self._metrics = MetricsLog(self.layout.metrics)
        self._seed: Seed | None = None
        self.retired: str | None = None
        self._watch = RequestWatch(self.directory)
        self._orders: list[CloneOrder] = []
        self._prepared = False
        self._full_failures = 0
        self.distributed = self._join_ranks(comm)
        self.group = None if self.distributed is None else self.distributed.group
        self.device = torch.device("cpu") if self.distributed is None else self.distributed.device
        ck = spec.checkpoint
        try:
            shared, local, memory = self.layout.checkpoints, node_local_dir(spec), node_memory_dir(spec)
            self.checkpointer = Checkpointer(
                tiers=member_tiers(shared, local, memory, ck.local_every, ck.persist_every),
                keep=ck.keep,
                comm=comm if self.group is None else self.group,
            )
        except BaseException:
            self._leave_ranks()
            raise
        self.rank, self.world_size = self.checkpointer.rank, self.checkpointer.world_size
        self._interval_steps, self._interval_s = ck.interval_steps, ck.interval_s
        self._tuner = AutoTuner(ck.process_mtbf_s, ck.node_mtbf_s, spec.steps) if ck.auto else None
        torch.set_num_threads(spec.threads)
        self._heartbeat: Heartbeat | None = None
        if attempt is not None:
            self.attempt = attempt
            return
        self.attempt = self.checkpointer.comm.bcast(count_attempt(self.directory) if self.rank == 0 else None)
        self._heartbeat = (
            Heartbeat(run_dir, self.name, self.attempt, on_orphaned=self._stop_orphaned).start()
            if self.rank == 0
            else None
        )
        self._emit("started", attempt=self.attempt, host=socket.gethostname(), pid=os.getpid(), **self._hosts())

    # ------------------------------------------------------------------ the contract

    def wrap(self, model: Any) -> Any:
        """``model`` made to train across the member's ranks, per the member's ``parallel``.

        ``ddp``: a ``DistributedDataParallel`` around it, averaging gradients; ``fsdp``: FSDP2
        (``fully_shard`` on each child with parameters, then on the root), sharding parameters,
        gradients and optimizer state. On one rank the model comes back unchanged. The model is
        moved to :attr:`device` first. Call it before :meth:`track`, build the optimizer from the
        returned module's parameters (FSDP replaces them by sharded ones), and ``track`` the
        unwrapped ``model``: its ``state_dict`` keys do not depend on the rank count, so a
        checkpoint restores on any.
        A model that cannot be wrapped is refused before anything is changed, on any rank count.
        """
        parallel = self.spec.parallel
        got = None
        if not isinstance(model, nn.Module):
            got = f"a {type(model).__name__}"
        elif not any(True for _ in model.parameters()):
            got = f"a {type(model).__name__} without parameters"
        if got is not None:
            raise LaunchError(
                f"member {self.name} (workload {self.spec.workload}): parallel: {parallel} needs a torch "
                f"nn.Module with parameters to wrap, got {got}"
            )
        if self.distributed is None:
            return model
        model.to(self.device)
        if parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            return DistributedDataParallel(model, device_ids=ids, process_group=self.group)
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(self.group, self.device.type)
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    def track(
        self,
        model: Any = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        extra: dict[str, Any] | None = None,
    ) -> int | None:
        """Declare what a checkpoint holds and restore it from the latest checkpoint; the step restored."""
        self.state = TrainState(model, optimizer, scheduler, extra=extra)
        parent = self.spec.parent
        if parent is not None and _read_seed_step(self.directory) is None:  # a clone's first start
            self._seed = self.checkpointer.comm.bcast(
                wait_for_seed(self.run_dir, self.spec, self.checkpointer) if self.rank == 0 else None
            )
        self.restored_step = self.checkpointer.restore(self.state)
        if self.checkpointer.skipped:  # newer ones it could not read: training goes on from here
            self.checkpointer.discard_newer_than(-1 if self.restored_step is None else self.restored_step)
        self._last_saved = self.restored_step
        if parent is not None and self.restored_step == self._seed_step():
            apply_overrides(self.state, parent.overrides)  # after the state, so that they win
        elif self.restored_step is not None:
            read_from = self.checkpointer.restored.shards_by_source()
            self._emit("resumed", attempt=self.attempt, step=self.restored_step, read_from=read_from)
        return self.restored_step

    def steps(self, total: int) -> Iterator[int]:
        """Steps ``0 .. total-1``, after the restored one; checkpoints and honours stop requests between them."""
        if self.state is None:
            raise ResilientFlowsError("call ctx.track(model=..., optimizer=...) before ctx.steps()")
        start = 0 if self.restored_step is None else self.restored_step + 1
        self._report_if_cloned()
        with self._signals:
            for step in range(start, total):
                yield step
                if self._after_step(step):
                    return
            if total > 0:
                self._commit(total - 1)
            else:
                self.checkpointer.wait()

    def log(self, step: int, **metrics: float) -> None:
        """Record metrics of ``step`` (floats, or 0-d tensors) in the member's metrics log."""
        values = {k: float(v.detach()) if isinstance(v, torch.Tensor) else float(v) for k, v in metrics.items()}
        self._last_metrics = {"step": step, **values}
        if self.rank == 0:
            self._metrics.append({"step": int(step), "attempt": self.attempt, "time": time.time(), **values})

    def result(self, model: Any = None, **values: Any) -> dict[str, Any]:
        """The member's result: its last metrics, the weights' digest, and ``values``.

        ``step`` is the last step this attempt logged, or the restored one when it had none left
        to run (a clone served at its source's final step, a resume of a finished member).
        """
        restored = {} if self.restored_step is None else {"step": self.restored_step}
        out: dict[str, Any] = {
            "member": self.name,
            "attempts": self.attempt,
            **restored,
            **self._last_metrics,
            **values,
        }
        if self.retired is not None:
            out["retired"] = self.retired
        if model is not None:
            out["digest"] = state_digest(model)
        return out

    # ------------------------------------------------------------------ internals

    def close(self) -> None:
        """Flush metrics, finish and stop the checkpointer, then leave the process group and stop
        beating. Idempotent."""
        self._metrics.close()
        try:
            self.checkpointer.close()
        finally:
            self._leave_ranks()
            if self._heartbeat is not None:
                self._heartbeat.stop()

    def _join_ranks(self, comm: Any) -> DistributedInfo | None:
        """The member's process group when it has several ranks: formed (or joined) here.

        ``comm`` of several ranks carries the rendezvous; without one, the launcher's environment
        must hold as many processes as the spec's ``ranks``.
        """
        given = comm_size(comm)
        if given <= 1 and self.spec.ranks == 1:
            return None
        try:
            info = init_process_group(comm=comm if given > 1 else None, interface=self.spec.network_interface)
        except LaunchError as exc:
            raise LaunchError(f"member {self.name} ({self.spec.ranks} ranks): {exc}") from exc
        if given <= 1 and info.world_size != self.spec.ranks:
            shutdown_process_group()
            raise LaunchError(
                f"member {self.name} has ranks: {self.spec.ranks}, but {info.launcher} started "
                f"{info.world_size} process(es)"
            )
        return info

    def _hosts(self) -> dict[str, list[str]]:
        """Every rank's host, in rank order, for a member of several ranks: where it really ran
        (which nodes a multi-node member spanned) is then in its ``started`` event."""
        if self.distributed is None:
            return {}
        return {"hosts": self.checkpointer.comm.allgather(socket.gethostname())}

    def _leave_ranks(self) -> None:
        if self.distributed is not None:
            self.distributed = None
            shutdown_process_group()

    def _after_step(self, step: int) -> bool:
        """Checkpoint, fork or stop as requested after ``step``; True when the member retires."""
        if self._heartbeat is not None:
            self._heartbeat.progress(step)
        fire_faults(self.spec.faults, step, self.attempt, self.name, self._metrics.flush)
        look = self.rank == 0 and self._watch.due()
        request = pending_request(self._signals.reason or self._orphaned, look, self.directory)
        if look:
            self._orders = read_clone_orders(self.directory)  # those due later wait here, not on disk
        orders = [o for o in self._orders if o.at_step is None or step >= o.at_step]
        self._orders = [o for o in self._orders if o not in orders]
        several = self.checkpointer.world_size > 1
        request = agreed_request(request, self.checkpointer.comm.allgather if several else None)
        if several:  # every rank forks at the same step, or none does
            orders = self.checkpointer.comm.bcast(orders)
        if self._tuner is not None and not self._tuner.done:  # no more collectives once tuned
            self._tune(step)
        due = (self._interval_steps is not None and (step + 1) % self._interval_steps == 0) or (
            self._interval_s is not None and time.monotonic() - self._last_save_time >= self._interval_s
        )
        handoff = self._handoff(step, orders) if orders else None
        if due or request is not None or handoff is not None:
            self._save(step, persist=True if request or handoff else None, handoff=handoff)
        elif not self._prepared:  # after the first step the optimizer has its state: the layout is final
            self.checkpointer.prepare(self.state)
        self._prepared = True
        if handoff is not None:
            clones = [c for order in orders for c in order.clones]
            self._emit("forked", step=step, clones=clones, stall_ms=round(1000 * self.checkpointer.stats.last_stall, 3))
        if request is not None:
            action, reason = request
            self._commit(step)
            if self.rank == 0:
                consume_request(self.directory)
            if action == "retire":
                self.retired = reason
                self._emit("retired", step=step, reason=reason)
                return True
            self._emit("preempted", attempt=self.attempt, step=step, reason=reason)
            raise Preempted(self.name, step, reason)
        return False

    def _seed_step(self) -> int | None:
        """The step this clone started from: its oldest own checkpoint was adopted from the source."""
        if self._seed is not None:
            return self._seed.step
        return _read_seed_step(self.directory)

    def _report_if_cloned(self) -> None:
        """A clone about to take its first step from its source's state says so (``cloned``)."""
        if self._seed is not None and self.restored_step == self._seed.step:
            self._report_clone()

    def _report_clone(self) -> None:
        """The clone's ``cloned`` event. Its clock starts at the request, or when the source served
        the order if that was later (an order for a future step)."""
        parent, seed = self.spec.parent, self._seed
        assert parent is not None and seed is not None
        start = max(parent.requested_at, seed.forked_at or 0.0)
        record = {"step": seed.step, "transport": seed.transport, "fallback": seed.fallback}
        if self.rank == 0:
            self.layout.write_seed({"parent": parent.member, **record})
        self._emit(
            "cloned",
            parent=parent.member,
            request=parent.request,
            overrides=parent.overrides,
            standby_s=round(seed.receiving_at - start, 4),
            readiness_s=round(time.time() - start, 4),
            **record,
        )

    def _handoff(self, step: int, orders: list[CloneOrder]) -> Handoff:
        """Serve clone orders with this step's checkpoint: linked into the clones' tiers on commit."""
        if self.rank == 0:
            for order in orders:
                mark_forking(self.run_dir, self.name, order, step, self.attempt)
        return Handoff(self.run_dir, self.name, orders, self.rank, self.checkpointer.world_size)

    def _save(self, step: int, persist: bool | None = None, handoff: Handoff | None = None) -> None:
        """Queue a checkpoint of ``step``. A full file system fails only that checkpoint (training
        goes on from the last committed one) until it has lasted :data:`STORAGE_RETRIES` tries."""
        self._metrics.flush()  # every step up to a committed checkpoint is on disk
        try:
            stats = self.checkpointer.save(
                step,
                self.state,
                overlap=self.spec.checkpoint.overlap,
                persist=persist,
                on_commit=self._on_commit(handoff),
                cached=handoff is not None,  # a clone on this node reads it next: keep it in memory
            )
        except StorageFullError as exc:  # an earlier checkpoint's; this one is queued
            self._storage_full(exc)
            stats = self.checkpointer.stats
        else:
            self._full_failures = 0
        self._last_saved = step
        self._last_save_time = time.monotonic()
        if self._tuner is not None:
            self._tuner.saved(stats)
        self._emit("checkpointed", step=step, stall_ms=round(1000 * stats.last_stall, 3))

    def _on_commit(self, handoff: Handoff | None) -> Callable[[Any, int], None] | None:
        """What runs when a checkpoint commits in a tier: the heartbeat records it (a lost attempt
        that committed one made progress, even if its node took that checkpoint along), and a
        clone handoff is served."""
        beat = self._heartbeat
        if beat is None:
            return handoff

        def committed(tier: Any, step: int) -> None:
            beat.committed(step)
            if handoff is not None:
                handoff(tier, step)

        return committed

    def _commit(self, step: int) -> None:
        """Make sure ``step`` is committed (the last step, or before stopping), saving it again
        while the file system is full."""
        while True:
            if self._last_saved != step:
                self._save(step, persist=True)
            try:
                self.checkpointer.wait()
                return
            except StorageFullError as exc:
                self._storage_full(exc)
                self._last_saved = None  # it may have been this one that failed
                time.sleep(STORAGE_RETRY_S)

    def _storage_full(self, exc: StorageFullError) -> None:
        """Count one more checkpoint lost to a full file system; give up (raise) after too many in a row.

        Counted in failures, not seconds, so that every rank of the member gives up together.
        """
        self._full_failures += 1
        logger.warning(
            "member %s: checkpoint failed, file system full (%d in a row): %s", self.name, self._full_failures, exc
        )
        if self._full_failures > STORAGE_RETRIES:
            raise exc

    def _tune(self, step: int) -> None:
        """``interval: auto``: once the warm-up checkpoints are measured, take the recommender's choice."""
        tuner, stats = self._tuner, self.checkpointer.stats
        tuner.stepped(step, self.checkpointer.flush_seconds)  # step times and their flush: l2_slowdown
        two_tiers = self.checkpointer.local is not None
        choice = None
        if self.rank == 0 and tuner.ready(stats, two_tiers):
            params, config = tuner.recommend(step, stats, two_tiers, self.checkpointer.nodes)
            fields = tuned_fields(params, config, tuner.observed(stats, self.checkpointer.nodes))
            choice = (config.interval, config.l2_every or MAX_PERSIST_EVERY, fields)
        if self.checkpointer.world_size > 1:  # every rank checkpoints on the same steps
            choice = self.checkpointer.comm.bcast(choice)
        if choice is None:
            return
        tuner.done = True
        self._interval_s, persist_every, fields = choice
        self._interval_steps = None
        self.checkpointer.persist_every = persist_every
        self._emit("tuned", step=step, **fields)

    def _stop_orphaned(self, reason: str) -> None:
        """The runner is gone (from the heartbeat's thread): stop at the next step boundary, as on a signal."""
        self._orphaned = reason

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.rank == 0:
            self.events.emit(kind, self.name, **fields)


def _read_seed_step(directory: Path) -> int | None:
    try:
        return int(TaskLayout(directory).read_seed()["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
