"""The training loop contract: a user function receives a :class:`TrainContext` and gets
checkpointing, resume, preemption handling and metrics without writing any of them.

A member's files (its :class:`~resilient_flows.rundir.TaskLayout`): the shared checkpoint tier,
a metrics line per logged step (a resumed attempt logs the redone steps again), the runner's
requests (preempt, retire), which the member consumes, the attempt counter, and its result,
written once it finished.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import torch

from resilient_flows.checkpoint import Checkpointer, TrainState
from resilient_flows.errors import Preempted, ResilientFlowsError, Superseded
from resilient_flows.rundir import EventLog, MetricsLog, count_attempt, member_layout
from resilient_flows.rundir._block import current_block
from resilient_flows.rundir._heartbeat import Heartbeat
from resilient_flows.training._buddyservice import buddy_link
from resilient_flows.training._contract import member_checkpoint
from resilient_flows.training._digest import state_digest
from resilient_flows.training._distributed import shutdown_process_group
from resilient_flows.training._faults import record_pool_lost
from resilient_flows.training._fork import CloneStart
from resilient_flows.training._loader import DataPositions, ResumableLoader, loader_arguments
from resilient_flows.training._parallel import join_member_ranks, wrap_model
from resilient_flows.training._peerwatch import PeerWatch, watch_peers
from resilient_flows.training._pool import PoolWatch
from resilient_flows.training._spec import MemberSpec
from resilient_flows.training._stream import StreamLoader, is_stream, stream_loader
from resilient_flows.training._walltime import drain_in_s
from resilient_flows.training.boundary import Cadence, CheckpointSaver, CommRanks, StepRuntime, member_events


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
    process group here (:func:`~resilient_flows.training._distributed.init_process_group`), shares
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
        self.name, self.seed = spec.name, spec.seed
        self.params = {**spec.params, "steps": spec.steps}
        self.run_dir = Path(run_dir)
        self.inputs = {name: self.run_dir / path for name, path in spec.inputs.items()}
        self.layout = member_layout(run_dir, spec.name)
        self.directory = self.layout.root
        self.directory.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(run_dir)
        self.restored_step: int | None = None
        self.state: TrainState | None = None
        self.retired: str | None = None
        self.data = DataPositions()
        self._unpositioned_said = False
        self.distributed = join_member_ranks(spec, comm)
        self.group = None if self.distributed is None else self.distributed.group
        self.device = torch.device("cpu") if self.distributed is None else self.distributed.device
        self._peers: PeerWatch | None = None
        try:
            if self.distributed is not None and spec.nodes > 1:  # a peer's node may fall silent
                info = self.distributed
                self._peers = watch_peers(info.group, info.rank, info.world_size, self.directory)
            self.checkpointer = self._checkpointer(comm)
        except BaseException:
            self._leave_ranks()
            raise
        self.rank, self.world_size = self.checkpointer.rank, self.checkpointer.world_size
        self._emit = member_events(self.run_dir, self.name, self.rank == 0)
        torch.set_num_threads(spec.threads)
        ranks = CommRanks(self.checkpointer.comm)
        counted = attempt is None  # else the process that launched this one counted, announces and beats
        if attempt is None:  # rank 0 counts; the others get its number
            attempt = cast(int, ranks.broadcast(count_attempt(self.directory) if self.rank == 0 else None))
        self.attempt: int = attempt
        self._saver = CheckpointSaver(self.checkpointer, overlap=spec.checkpoint.overlap)
        self.runtime = StepRuntime(
            self.name,
            attempt,
            ranks,
            self._saver,
            self._emit,
            directory=self.directory,
            run_dir=self.run_dir,
            faults=spec.faults,
            metrics=MetricsLog(self.layout.metrics) if self.rank == 0 else None,
            cadence=Cadence(spec.checkpoint, spec.steps, self.checkpointer, functools.partial(drain_in_s, run_dir)),
        )
        self._clone = CloneStart(self.run_dir, spec, self.rank, ranks.broadcast, self._emit)
        if counted:
            self._start_beating(ranks)
            where = {"host": socket.gethostname(), "pid": os.getpid(), "block": current_block()}
            self._emit("started", attempt=attempt, **where, **self._hosts())

    def _start_beating(self, ranks: CommRanks) -> None:
        """Rank 0 beats for the attempt; every rank stops here, before anything is trained or
        announced, when its runner was superseded (see :class:`~resilient_flows.rundir.Heartbeat`)."""
        refused = None
        if self.rank == 0:
            stop = self.runtime.stop_orphaned
            heartbeat = Heartbeat(
                self.run_dir,
                self.name,
                self.attempt,
                on_orphaned=stop,
                on_pool_lost=self._pool_lost,
                pool=PoolWatch.find(),
            )
            try:
                self.runtime.beat(heartbeat.start())
            except Superseded as exc:
                refused = str(exc)
        refused = ranks.broadcast(refused)
        if refused is not None:
            self.close()
            raise Superseded(refused)

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
        return wrap_model(model, self.spec, self.distributed)

    def track(
        self,
        model: Any = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        extra: dict[str, Any] | None = None,
    ) -> int | None:
        """Declare what a checkpoint holds and restore it from the latest checkpoint; the step restored."""
        self.state = TrainState(model, optimizer, scheduler, extra=extra, data=self.data, rank_data=self.data.per_rank)
        self._clone.wait(self.checkpointer)
        self.restored_step = self.checkpointer.restore(self.state)
        if self.checkpointer.skipped:  # newer ones it could not read: training goes on from here
            self.checkpointer.discard_newer_than(-1 if self.restored_step is None else self.restored_step)
        saver = self._saver
        saver.state, saver.last_saved = self.state, self.restored_step
        self._warn_unpositioned()
        restored = self.checkpointer.restored
        cloned = self._clone.restored(self.state, self.restored_step)
        if not cloned and self.restored_step is not None and restored is not None:
            self._emit(
                "resumed",
                attempt=self.attempt,
                step=self.restored_step,
                read_from=restored.shards_by_source(),
                bytes_from=restored.bytes_from,
            )
        return self.restored_step

    def loader(
        self,
        data: Any,
        batch_size: int | None = None,
        *,
        shuffle: bool | None = None,
        drop_last: bool | None = None,
        seed: int | None = None,
        name: str = "train",
        **loader_kwargs: Any,
    ) -> ResumableLoader | StreamLoader:
        """A ``DataLoader`` whose position is in every checkpoint and that resumes at the next sample.

        ``data`` is a map-style dataset, or a ``DataLoader`` you built (its dataset, batch size,
        sampler's shuffle, workers and collate function are taken; a ``DistributedSampler``'s
        per-rank batch times its replicas is the global batch). ``batch_size`` is the global
        batch, split over this member's ranks; the order of each epoch comes from ``seed``
        (the member's by default) and the epoch only, so a checkpoint resumes on any rank count
        without a sample trained twice or skipped. Other arguments go to ``DataLoader``
        (``num_workers``, ``persistent_workers``, ``collate_fn``, ...); see
        :class:`~resilient_flows.training.ResumableLoader`. Build it before or after
        :meth:`track`: either way it starts where the restored checkpoint left it.

        An ``IterableDataset``, a ``DataLoader`` over one, or torchdata's ``StatefulDataLoader``
        (the ``data`` extra) resumes by that loader's ``state_dict()``, kept per rank: on the
        same rank count only (:class:`~resilient_flows.training.StreamLoader`).
        """
        seed = self.seed if seed is None else seed
        flags = {"shuffle": shuffle, "drop_last": drop_last}
        given: dict[str, Any] = {key: value for key, value in flags.items() if value is not None}
        where = {"seed": seed, "rank": self.rank, "world_size": self.world_size, "name": name}
        made: ResumableLoader | StreamLoader
        if is_stream(data):
            made = stream_loader(data, batch_size, **where, **given, **loader_kwargs)
        else:
            dataset, taken = loader_arguments(data)
            given.update({} if batch_size is None else {"batch_size": batch_size})
            made = ResumableLoader(dataset, **where, **{**taken, **given, **loader_kwargs})
        self.data.add(made)
        self._warn_unpositioned()
        return made

    def steps(self, total: int) -> Iterator[int]:
        """Steps ``0 .. total-1``, after the restored one; checkpoints and honours stop requests between them.

        Raises :class:`Preempted` before the first step when the member's block is drained before
        it could reach a checkpoint (see :mod:`resilient_flows.training._walltime`)."""
        if self.state is None:
            raise ResilientFlowsError("call ctx.track(model=..., optimizer=...) before ctx.steps()")
        start = 0 if self.restored_step is None else self.restored_step + 1
        declined = self.runtime.decline_start(start) if start < total else None
        if declined is not None:  # too close to its block's drain: requeued for free, elsewhere
            raise Preempted(self.name, declined.step, declined.reason)
        self.report_if_cloned()
        with self.runtime.signals:
            for step in range(start, total):
                yield step
                if self.after_step(step):
                    return
            if total > 0:
                self.runtime.commit(total - 1)
            else:
                self.checkpointer.wait()

    def batches(self, loader: ResumableLoader | StreamLoader, total: int) -> Iterator[tuple[int, Any]]:
        """``(step, batch)`` for the steps of :meth:`steps`, batch after batch of ``loader`` across epochs.

        Each batch is drawn after the previous step's boundary, so that a checkpoint of a step
        holds the loader's position just past that step's batch (``zip(loader, ctx.steps(n))``,
        in that order, would save one batch ahead and skip it on resume).
        """
        stream = loader.batches()
        for step in self.steps(total):
            yield step, next(stream)

    def log(self, step: int, **metrics: float) -> None:
        """Record metrics of ``step`` (floats, or 0-d tensors) in the member's metrics log."""
        values = {k: float(v.detach()) if isinstance(v, torch.Tensor) else float(v) for k, v in metrics.items()}
        self.runtime.log(step, values)

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
            **self.runtime.last_metrics,
            **values,
        }
        if self.retired is not None:
            out["retired"] = self.retired
        if model is not None:
            out["digest"] = state_digest(model)
        return out

    def close(self) -> None:
        """Flush metrics, finish and stop the checkpointer, stop the loaders' worker processes,
        then leave the process group and stop beating. Idempotent."""
        try:
            self.checkpointer.close()
        finally:
            self.data.close()
            self._leave_ranks()
            self.runtime.close()

    # ------------------------------------------------------------------ for the loops built on it

    def after_step(self, step: int) -> bool:
        """The step boundary after ``step``: True when the member retires; raises
        :class:`Preempted` once a checkpoint of ``step`` is committed when it must stop."""
        stop = self.runtime.after_step(step)
        if stop is None:
            return False
        if stop.action == "retire":
            self.retired = stop.reason
            return True
        raise Preempted(self.name, stop.step, stop.reason)

    def report_if_cloned(self) -> None:
        """A clone about to take its first step from its source's state says so."""
        self._clone.report(self.restored_step)

    # ------------------------------------------------------------------ internals

    def _checkpointer(self, comm: Any) -> Checkpointer:
        """The member's checkpointer, from its configuration as it is; a peer tier of a member on
        one node (no ring over its own nodes) reaches buddies on other nodes."""
        config = member_checkpoint(self.spec, self.run_dir)
        peer = next((tier for tier in config.tiers if tier.peer), None)
        if peer is not None and self.spec.nodes == 1:
            link = buddy_link(self.run_dir, self.spec.name, Path(peer.path), cast(int, peer.capacity))
            tiers = tuple(replace(tier, buddies=link) if tier is peer else tier for tier in config.tiers)
            config = replace(config, tiers=tiers)
        return Checkpointer.from_config(config, comm=comm if self.group is None else self.group)

    def _hosts(self) -> dict[str, Any]:
        """Every rank's host, in rank order, for a member of several ranks: where it really ran
        (which nodes a multi-node member spanned) is then in its ``started`` event; and, for a
        member on several nodes or one that may shrink, the nodes this attempt runs on (fewer
        than it spans after a shrink)."""
        where: dict[str, Any] = {}
        if self.distributed is not None:
            where["hosts"] = self.checkpointer.comm.allgather(socket.gethostname())
        if self.spec.nodes > 1 or self.spec.min_nodes is not None:
            where["nodes"] = self.spec.nodes
        return where

    def _warn_unpositioned(self) -> None:
        """A checkpoint without data positions (saved before the member used ``ctx.loader``)
        restarts its loaders at epoch 0: say so once, in the run's events, for it is not exact."""
        if self.restored_step is None or self.data.restored or not self.data.names() or self._unpositioned_said:
            return
        self._unpositioned_said = True
        self._emit(
            "warning",
            attempt=self.attempt,
            step=self.restored_step,
            reason=f"the checkpoint of step {self.restored_step} holds no data position: loader(s) "
            f"{', '.join(self.data.names())} start at epoch 0, sample 0",
        )

    def _pool_lost(self, reason: str) -> None:
        """The attempt's worker pool is gone (said from the heartbeat's thread): its end is the
        machine's fault; it commits a checkpoint and stops at the next boundary, as when orphaned."""
        record_pool_lost(self.directory, reason)
        self.runtime.stop_orphaned(reason)

    def _leave_ranks(self) -> None:
        if self._peers is not None:
            self._peers.stop()
            self._peers = None
        if self.distributed is not None:
            self.distributed = None
            shutdown_process_group()
