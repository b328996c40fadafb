"""The step boundary: what a member does between two training steps, whichever loop it runs in.

In this order: report progress, fire injected faults, take stop requests (a signal, the runner
gone, the runner's preempt or retire, a block's drain before its walltime) and clone orders, agree
on them across ranks, retune the interval, save when due, asked or forking, and stop after
committing; before the first step, decline to start on a block about to be drained (see
:mod:`resilient_flows.training._walltime`). :class:`StepRuntime` does all of it once;
:class:`~resilient_flows.training.TrainContext`, the Lightning callback and the Hugging Face
Trainer integration only feed it their steps, their collectives (:class:`Ranks`) and their way of
saving (:class:`Saver`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilient_flows.errors import StorageFullError
from resilient_flows.rundir import EventLog, MetricsLog
from resilient_flows.rundir._block import current_block
from resilient_flows.rundir._control import CloneOrder, RequestWatch, read_clone_orders
from resilient_flows.rundir._heartbeat import Heartbeat
from resilient_flows.training._contract import EXIT_PREEMPTED
from resilient_flows.training._fork import Handoff, mark_forking
from resilient_flows.training._spec import FaultSpec
from resilient_flows.training._walltime import (
    Pace,
    read_block_times,
    read_pace,
    start_refusal,
    time_to_checkpoint_s,
    write_declined,
    write_pace,
)
from resilient_flows.training.boundary._cadence import Cadence
from resilient_flows.training.boundary._ranks import Ranks
from resilient_flows.training.boundary._requests import Request, consume_request, fire_faults, pending_request
from resilient_flows.training.boundary._saver import OnCommit, Saver
from resilient_flows.training.boundary._signals import StopSignals
from resilient_flows.training.boundary._unsaved import UnsavedWatch

logger = logging.getLogger(__name__)

#: How many checkpoints in a row may fail on a full file system before the member gives up, and
#: the pause between two tries of a checkpoint it cannot go on without (the last, or a stop's).
STORAGE_RETRIES = 300
STORAGE_RETRY_S = 2.0

#: Keys of a metrics line that a logged metric cannot replace.
_RESERVED = ("step", "attempt", "time")


def member_events(run_dir: str | os.PathLike | None, member: str | None, writes: bool) -> Callable[..., None]:
    """How a rank emits its member's events: into the run's event log from the one rank that
    writes them (rank 0, in a workflow), nowhere from the others."""
    if run_dir is None or member is None or not writes:
        return lambda kind, **fields: None
    events = EventLog(run_dir)
    return lambda kind, **fields: events.emit(kind, member, **fields)


@dataclass(frozen=True)
class Stop:
    """A member stopping at a step boundary, after committing ``step``: ``action`` is
    ``"preempt"`` (it continues in a later attempt) or ``"retire"`` (it is done)."""

    action: str
    reason: str
    step: int

    @property
    def exit_status(self) -> int:
        """What the member's process exits with: the runner requeues a preempted one for free."""
        return EXIT_PREEMPTED if self.action == "preempt" else 0


class StepRuntime:
    """One member's step boundaries (see the module's docstring).

    ``emit`` writes a member event; the loop gives one that does nothing off rank 0 or outside a
    workflow. ``directory``: the member's directory, where rank 0 reads the runner's requests
    (None outside a workflow). ``run_dir``: given, the member serves clone orders. ``metrics``:
    its metrics log, on the rank that writes it. ``cadence``: when to checkpoint without being
    asked (None: the loop's framework decides).
    """

    def __init__(
        self,
        member: str,
        attempt: int,
        ranks: Ranks,
        saver: Saver,
        emit: Callable[..., None],
        *,
        directory: Path | None = None,
        run_dir: Path | None = None,
        faults: Iterable[FaultSpec] = (),
        metrics: MetricsLog | None = None,
        cadence: Cadence | None = None,
    ) -> None:
        self.member, self.attempt, self.ranks, self.saver, self.emit = member, attempt, ranks, saver, emit
        self.directory, self.run_dir, self.faults = directory, run_dir, tuple(faults)
        self.metrics, self.cadence = metrics, cadence
        self.signals = StopSignals()
        self.heartbeat: Heartbeat | None = None
        self.last_metrics: dict[str, Any] = {}
        self._orphaned: str | None = None
        self._watch = RequestWatch(directory) if directory is not None and ranks.rank == 0 else None
        self._orders: list[CloneOrder] = []
        self._prepared = False
        self._full_failures = 0
        self._first_step: tuple[int, float] | None = None  # (step, monotonic time) of this attempt's first boundary
        self.step_s: float | None = None  # this attempt's seconds per step, once two boundaries were seen
        self.commit_s: float | None = None  # seconds from the last save to its last commit
        self._save_began = (-1, 0.0)  # (step, monotonic time) of the last save
        self._unsaved = UnsavedWatch(cadence, attempt, emit)

    def beat(self, heartbeat: Heartbeat) -> None:
        """``heartbeat`` hears of every step and commit from now on."""
        self.heartbeat = heartbeat

    def stop_orphaned(self, reason: str) -> None:
        """The runner is gone (said from the heartbeat's thread): stop at the next boundary, as on a signal."""
        self._orphaned = reason

    def log(self, step: int, values: dict[str, float]) -> None:
        """Record ``step``'s metrics: kept for the member's result, appended to its metrics log."""
        self.last_metrics = {"step": step, **values}
        self._unsaved.logged(step, self.saver.last_saved)
        if self.metrics is not None:
            own = {k: v for k, v in values.items() if k not in _RESERVED}
            self.metrics.append({"step": int(step), "attempt": self.attempt, "time": time.time(), **own})

    def flush_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.flush()

    def close(self) -> None:
        """Put the signal handlers back, close the metrics log and stop beating. Idempotent."""
        self.signals.restore()
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.heartbeat is not None:
            self.heartbeat.stop()

    def after_step(self, step: int) -> Stop | None:
        """Everything due after ``step``; the stop, once committed, when the member must stop."""
        if self.heartbeat is not None:
            self.heartbeat.progress(step)
        self._time_step(step)
        fire_faults(self.faults, step, self.attempt, self.member, self.flush_metrics)
        request, orders = self._requests(step)
        if self.cadence is not None:
            self.cadence.tune(step, self.ranks, self.emit)
        handoff = self._serve(step, orders) if orders else None
        if request is not None or handoff is not None or (self.cadence is not None and self.cadence.due(step)):
            persist = True if request is not None or handoff is not None else None
            self.save(step, persist=persist, handoff=handoff)
        elif not self._prepared:  # after the first step the optimizer has its state: the layout is final
            self.saver.prepare(step)
        self._prepared = True
        if handoff is not None:
            clones = [c for order in orders for c in order.clones]
            self.emit("forked", step=step, clones=clones, stall_ms=round(1000 * self.saver.stall, 3))
        return None if request is None else self.stop(step, *request)

    def save(self, step: int, persist: bool | None = None, handoff: Handoff | None = None) -> None:
        """Start a checkpoint of ``step``. A full file system fails only that checkpoint (training
        goes on from the last committed one) until it has lasted :data:`STORAGE_RETRIES` tries."""
        self.flush_metrics()  # every step up to a committed checkpoint is on disk
        self._save_began = (step, time.monotonic())
        self._unsaved.saved()
        try:
            self.saver.save(step, persist=persist, on_commit=self._on_commit(handoff), cached=handoff is not None)
        except StorageFullError as exc:  # an earlier checkpoint's; this one is queued
            self._storage_full(exc)
        else:
            self._full_failures = 0
        if self.cadence is not None:
            self.cadence.saved()
        if not self.saver.reports_saves:
            self.emit("checkpointed", step=step, stall_ms=round(1000 * self.saver.stall, 3))

    def commit(self, step: int) -> None:
        """Return once ``step`` is committed (the last step, or before stopping), saving it again
        while the file system is full."""
        while True:
            if self.saver.last_saved != step:
                self.save(step, persist=True)
            try:
                self.saver.wait()
                return
            except StorageFullError as exc:
                self._storage_full(exc)
                self.saver.last_saved = None  # it may have been this one that failed
                time.sleep(STORAGE_RETRY_S)

    def stop(self, step: int, action: str, reason: str) -> Stop:
        """Commit ``step``, settle the runner's request and say why the member stops."""
        self.commit(step)
        if self._watch is not None:
            consume_request(self._watch.directory)
            with contextlib.suppress(OSError):  # advice: a full file system must not fail a committed stop
                write_pace(self._watch.directory, self.pace())  # the next attempt's start and drain use it
        if action == "retire":
            self.emit("retired", step=step, reason=reason)
        else:
            self.emit("preempted", attempt=self.attempt, step=step, reason=reason)
        logger.warning("member %s: stopping after committing step %d: %s", self.member, step, reason)
        return Stop(action, reason, step)

    def pace(self) -> Pace:
        """This member's pace: what this attempt observed, else what earlier ones did."""
        before = read_pace(self.directory) if self.directory is not None else Pace()
        return Pace(
            self.step_s if self.step_s is not None else before.step_s,
            self.commit_s if self.commit_s is not None else before.commit_s,
        )

    def decline_start(self, step: int) -> Stop | None:
        """Before the first step (``step``, the first to run): the stop, when the member's block is
        drained before it could reach a checkpoint; it then trains nothing and is requeued for free
        on another block. None when it may start (or its block's times are unknown)."""
        reason = None
        if self._watch is not None and self.run_dir is not None:
            times = read_block_times(self.run_dir, current_block())
            cadence = self.cadence
            to_interval = None if cadence is None else cadence.steps_to_next(step)
            needed = time_to_checkpoint_s(self.pace(), to_interval, None if cadence is None else cadence.interval_s)
            reason = start_refusal(times, needed, time.time())
            if reason is not None:
                assert times is not None
                left = round(times.drain_at - time.time(), 3)
                with contextlib.suppress(OSError):  # advice to the retry handler: a full disk must not fail the stop
                    write_declined(self._watch.directory, self.attempt, times.block)
                self.emit("declined", attempt=self.attempt, step=step - 1, block=times.block, drain_in_s=left)
        reason = self.ranks.broadcast(reason)
        if reason is None:
            return None
        logger.warning("member %s: not starting: %s", self.member, reason)
        return Stop("preempt", reason, step - 1)

    def _time_step(self, step: int) -> None:
        now = time.monotonic()
        if self._first_step is None:
            self._first_step = (step, now)
        elif step > self._first_step[0]:
            self.step_s = (now - self._first_step[1]) / (step - self._first_step[0])

    def _requests(self, step: int) -> tuple[Request | None, list[CloneOrder]]:
        """The stop request and the clone orders due at ``step``, the same on every rank."""
        look = self._watch is not None and self._watch.due()
        request = pending_request(self.signals.reason or self._orphaned, look, self.directory)
        if look and self._watch is not None and self.run_dir is not None:
            self._orders = read_clone_orders(self._watch.directory)  # those due later wait here, not on disk
        orders = [o for o in self._orders if o.at_step is None or step >= o.at_step]
        self._orders = [o for o in self._orders if o not in orders]
        request = self.ranks.first_request(request)
        if self.run_dir is not None:  # every rank forks at the same step, or none does
            orders = self.ranks.broadcast(orders)
        return request, orders

    def _serve(self, step: int, orders: list[CloneOrder]) -> Handoff:
        """Serve clone orders with this step's checkpoint: linked into the clones' tiers on commit."""
        assert self.run_dir is not None
        if self.ranks.rank == 0:
            for order in orders:
                mark_forking(self.run_dir, self.member, order, step, self.attempt)
        return Handoff(self.run_dir, self.member, orders, self.ranks.rank, self.ranks.size)

    def _on_commit(self, handoff: Handoff | None) -> OnCommit | None:
        """The heartbeat records each commit (a lost attempt that committed one made progress,
        even if its node took that checkpoint along) and how long it took (a block's drain margin
        holds it), and a clone hand-off is served."""
        beat = self.heartbeat

        def committed(tier: Any, step: int) -> None:
            began_step, began = self._save_began
            if began_step == step:
                self.commit_s = time.monotonic() - began  # the last tier's commit is the last call
            if beat is not None:
                beat.committed(step, self.commit_s)
            if handoff is not None:
                handoff(tier, step)

        return committed

    def _storage_full(self, exc: StorageFullError) -> None:
        """Count one more checkpoint lost to a full file system; give up (raise) after too many in
        a row: counted in checkpoints, not seconds, so that every rank gives up together."""
        self._full_failures += 1
        logger.warning(
            "member %s: checkpoint failed, file system full (%d in a row): %s", self.member, self._full_failures, exc
        )
        if self._full_failures > STORAGE_RETRIES:
            raise exc
