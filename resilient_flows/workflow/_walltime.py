"""Blocks that end on time: the runner's side of walltime awareness.

A batch job ends at its walltime with a signal and, moments later, SIGKILL. Waiting for that loses
a member's steps since its last checkpoint, may catch it in the middle of one, and Parsl only
starts a fresh block once it notices the old one gone. So, per Parsl instance, a
:class:`BlockClock` watches the blocks of a site with a ``walltime`` fact:

- a block seen running (its provider says so, or a member on it beats) gets its start from its
  provider where the provider can tell (Slurm), else the last moment the runner saw it not yet
  running, which is never later than its start by more than a poll; its end is the start plus
  the walltime, its drain time the end less the margin its members' observed paces need
  (:func:`~resilient_flows.training.drain_margin_s`);
- the blocks' times are published in the run directory, where members starting on a block read
  them and decline to start too close to its drain (see :mod:`resilient_flows.training._walltime`);
- at its drain time the block is held (the interchange sends it nothing more) and every member
  beating on it is asked to commit and stop (exit 75: requeued for free);
- once its managers hold no task, or :data:`FORCE_S` before its end whatever they hold, the block
  is cancelled and marked scaled in: Parsl starts a fresh block, on which the members resume.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import shlex
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parsl.jobs.states import JobState
from parsl.providers import SlurmProvider

from resilient_flows.rundir import EventLog, request_preemption, run_layout
from resilient_flows.sites._parsl import hold_block
from resilient_flows.training import BlockTimes, Pace, drain_margin_s
from resilient_flows.workflow._blocks import retire_block

logger = logging.getLogger(__name__)

#: Seconds between two looks at the blocks.
LOOK_S = 1.0
#: Seconds before its end at which a drained block is cancelled even if its managers still hold tasks
#: (a member that did not stop): ahead of the batch system's own signal, so that the block is ours to end.
FORCE_S = 3.0
#: Seconds the provider has to say when a block started.
QUERY_S = 10


@dataclass
class _Block:
    executor: Any
    job_id: str
    start: float
    end: float
    drain_at: float
    draining: bool = False
    asked: set[tuple[str, Any]] = field(default_factory=set)  # (member, attempt) asked to stop

    def times(self, block: str) -> BlockTimes:
        return BlockTimes(block, self.start, self.end, self.drain_at)


def drain_at(end: float, paces: Iterable[Pace], walltime_s: float) -> float:
    """When a block ending at ``end`` and running members of these paces is drained; whole
    seconds, earlier rather than later, so that its published times change only when it matters.
    Members so slow that their margin exceeds half the walltime get half: a block drained at its
    start would serve nobody."""
    return float(int(end - min(drain_margin_s(paces), walltime_s / 2)))


def to_stop(
    beats: Mapping[str, Mapping[str, Any]], block: str, members: set[str], asked: set[tuple[str, Any]]
) -> list[tuple[str, Any]]:
    """The ``(member, attempt)`` beating on ``block`` that were not asked to stop yet (stages and
    analytics have no such request: they end with the block)."""
    return [
        (name, beat.get("attempt"))
        for name, beat in beats.items()
        if name in members and str(beat.get("block")) == block and (name, beat.get("attempt")) not in asked
    ]


def may_retire(draining: bool, tasks: int | None, end: float, now: float) -> bool:
    """Whether a block is cancelled now: drained and its managers hold no task (``tasks``; None
    while the interchange does not say), or its end is :data:`FORCE_S` away."""
    return draining and (tasks == 0 or now >= end - FORCE_S)


def provider_start(provider: Any, job_id: str) -> float | None:
    """When the batch system started job ``job_id`` (seconds since the epoch); None where the
    provider cannot tell. Slurm: ``squeue``'s start time of a running job, in local time."""
    if not isinstance(provider, SlurmProvider):
        return None
    try:
        status, out, _ = provider.execute_wait(f"squeue -h -j {shlex.quote(job_id)} -o %S", QUERY_S)
        if status != 0:
            return None
        return datetime.datetime.fromisoformat(out.strip()).timestamp()
    except Exception as exc:  # an unanswered or unparsable query: the runner's own estimate stands
        logger.warning("no start time of job %s from Slurm: %s", job_id, exc)
        return None


class BlockClock:
    """Call :meth:`update` from the runner's loop (see the module's docstring); it looks at most
    every :data:`LOOK_S` seconds. ``managers(executor)``: the interchange's managers (their
    ``block_id`` and ``tasks``), None when it does not answer."""

    def __init__(
        self,
        run_dir: Path,
        walltime_s: float,
        managers: Callable[[Any], list[dict[str, Any]] | None],
        clock: Callable[[], float] = time.time,
        start_of: Callable[[Any, str], float | None] = provider_start,
    ) -> None:
        self.run_dir, self.walltime_s = run_dir, walltime_s
        self.managers, self.clock, self.start_of = managers, clock, start_of
        self.events = EventLog(run_dir)
        self.blocks: dict[tuple[str, str], _Block] = {}
        self._not_running: dict[tuple[str, str], float] = {}  # when each block was last seen not running yet
        self._published: list[dict[str, Any]] | None = None
        self._looked = float("-inf")
        self.publish()  # the blocks of an earlier Parsl instance are gone, and their numbers are reused

    def update(
        self, executors: Iterable[Any], beats: Mapping[str, Mapping[str, Any]], members: set[str]
    ) -> list[tuple[str, str]]:
        """One look: new blocks timed, drains started, drained blocks cancelled; the ``(executor,
        block)`` cancelled, whose silence is then no news to the watchdog."""
        now = self.clock()
        if now - self._looked < LOOK_S:
            return []
        self._looked = now
        executors = [e for e in executors if hasattr(e, "blocks_to_job_id")]
        self._time_blocks(executors, beats, now)
        for (_, block), state in self.blocks.items():
            if not state.draining:
                on_it = [b for name, b in beats.items() if name in members and str(b.get("block")) == block]
                state.drain_at = drain_at(state.end, [Pace.from_record(b) for b in on_it], self.walltime_s)

        self.publish()
        retired = []
        for key, state in list(self.blocks.items()):
            if now >= state.drain_at:
                self._drain(key, state, beats, members, now)
                if may_retire(state.draining, self._tasks(state.executor, key[1]), state.end, now):
                    retire_block(state.executor, key[1])
                    del self.blocks[key]
                    retired.append(key)
                    self.events.emit("drained", None, executor=key[0], block=key[1], job_id=state.job_id)
        if retired:
            self.publish()
        return retired

    def publish(self) -> None:
        """Write the running blocks' times for members to read, when they changed."""
        entries = [{**s.times(block).to_dict(), "executor": label} for (label, block), s in self.blocks.items()]
        if entries != self._published:
            run_layout(self.run_dir).write_block_times({"blocks": entries})
            self._published = entries

    def _time_blocks(self, executors: list[Any], beats: Mapping[str, Mapping[str, Any]], now: float) -> None:
        beating = {str(b.get("block")) for b in beats.values()}
        for executor in executors:
            status = executor.status_facade
            current = set()
            for block, job_id in list(executor.blocks_to_job_id.items()):
                key = (executor.label, str(block))
                state = status.get(str(block))
                if state is not None and state.terminal:
                    continue
                current.add(key)
                running = (state is not None and state.state == JobState.RUNNING) or str(block) in beating
                if not running:
                    self._not_running[key] = now
                elif key not in self.blocks:
                    start = self.start_of(executor.provider, str(job_id)) or self._not_running.get(key, now)
                    end = start + self.walltime_s
                    self.blocks[key] = _Block(executor, str(job_id), start, end, drain_at(end, [], self.walltime_s))
                    self.events.emit(
                        "block_started", None, executor=key[0], block=key[1], job_id=str(job_id), start=start, end=end
                    )
            for key in [k for k in self.blocks if k[0] == executor.label and k not in current]:
                del self.blocks[key]  # ended, or cancelled by someone else

    def _drain(
        self,
        key: tuple[str, str],
        state: _Block,
        beats: Mapping[str, Mapping[str, Any]],
        members: set[str],
        now: float,
    ) -> None:
        """Hold the block once, and ask each member newly seen beating on it to stop."""
        label, block = key
        if not state.draining:
            state.draining = True
            hold_block(state.executor, block)
            self.events.emit("draining", None, executor=label, block=block, end_in_s=round(state.end - now, 3))
        for name, attempt in to_stop(beats, block, members, state.asked):
            reason = f"block {block} ends in {state.end - now:.0f} s (walltime)"
            with contextlib.suppress(OSError):  # a full file system: asked again at the next look
                request_preemption(self.run_dir, name, reason, block=block)
                state.asked.add((name, attempt))

    def _tasks(self, executor: Any, block: str) -> int | None:
        """Tasks the block's managers hold; None when the interchange does not answer."""
        managers = self.managers(executor)
        if managers is None:
            return None
        return sum(int(m.get("tasks", 0)) for m in managers if str(m.get("block_id")) == block)
