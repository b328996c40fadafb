"""The runner's progress watchdog: finds attempts and blocks that stopped making progress silently.

Parsl notices a worker or a manager that exits, the latter only after the interchange missed its
heartbeats for ``heartbeat_threshold`` seconds. It does not notice a worker that is frozen (a hung
node, SIGSTOP), a worker pool whose main thread died while its heartbeat thread still answers the
interchange (its tasks then never start and never fail), or an interchange that exited: a run in
any of these states waits forever. The watchdog looks every :data:`WATCH_S` seconds at four things:

- each running attempt's heartbeat record: an attempt that saw its worker pool gone (the pool
  process, or its multiprocessing manager: :mod:`resilient_flows.training._pool`) says so in its
  next beat, and its block is lost at once (the fast path: within a look of the beat); a pool on
  the runner's own host, named in the beat, the runner looks at itself, as its attempts may die
  with it before they look;
- each running attempt's heartbeat (:mod:`resilient_flows.rundir._heartbeat`): an attempt whose
  file has not changed for longer than its stall timeout is lost;
- each block's managers, as the interchange reports them: a block that holds tasks of which none
  beats for longer than the site's stall timeout is lost (:data:`START_FACTOR` times that since it
  took a task, while none of its tasks has beaten yet: they may still be starting);
- each executor's interchange process: once it exited, or stopped answering (within
  :data:`~resilient_flows.sites._parsl.ANSWER_S`), the executor can run nothing more.

Silence is measured on the runner's own clock, from the moment it last saw a heartbeat file
change, so that clock skew between nodes and the shared file system's times play no part.

The stall timeout of an attempt is its member's ``stall_timeout`` when the workflow sets one, and
otherwise the larger of ten times its observed seconds per step and the site's ``stall_timeout``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parsl.executors import HighThroughputExecutor

from resilient_flows.rundir import read_attempt_heartbeat, run_layout
from resilient_flows.sites._parsl import ANSWER_S, interchange_exit, interchange_managers
from resilient_flows.training import pool_exited, pool_process_gone

logger = logging.getLogger(__name__)

#: Seconds between two looks: a lost pool is found within this of its members' next beat.
WATCH_S = 1.0

#: How many times its step time an attempt may stay silent, when its member sets no timeout.
STEP_FACTOR = 10.0

#: How many times the site's stall timeout a block that took a task may stay silent before any of
#: its tasks beats: a start (a worker importing torch, an ``srun`` step forming its ranks' group)
#: takes long on a loaded node, and only a task that has started can beat.
START_FACTOR = 3.0


@dataclass(frozen=True)
class Lost:
    """What the watchdog found: a silent attempt (``task`` set), a block whose tasks never beat, or
    an executor whose interchange exited (``block`` None, ``executor`` set). ``silent_s``: how
    long a silent attempt had not beaten, on the runner's clock; ``seen_by``: the task that saw its
    block's pool gone (whose executor is the block's); ``pool_gone``: why, where the runner saw it
    itself (its attempts could not say so: the runner records it for them)."""

    reason: str
    task: str | None = None
    attempt: int | None = None
    block: str | None = None
    executor: str | None = None
    silent_s: float | None = None
    seen_by: str | None = None
    pool_gone: str | None = None


@dataclass
class _Beat:
    mtime_ns: int
    changed: float  # runner's monotonic clock when the file last changed
    record: dict[str, Any] = field(default_factory=dict)


def interchange_gone(executor: Any) -> str | None:
    """Why the executor is lost, where its interchange exited; None while it runs."""
    status = interchange_exit(executor)
    return None if status is None else f"the interchange of executor {executor.label} exited (status {status})"


def clear_heartbeats(run_dir: Path, keep: Iterable[str] = ()) -> None:
    """Remove the heartbeats of attempts that cannot be running: those of an earlier runner, or of
    a Parsl instance given up, whose blocks were cancelled. Left in place, they would be taken
    for silent attempts of the new blocks. The tasks in ``keep`` (adopted attempts, which train
    on in an earlier runner's blocks) keep theirs."""
    directory = run_layout(run_dir).heartbeats
    kept = set(keep)
    if directory.is_dir():
        for path in directory.iterdir():
            if path.name not in kept:
                path.unlink(missing_ok=True)


def stall_timeout(member_s: float | None, step_s: float | None, site_s: float) -> float:
    """Seconds of silence after which an attempt is lost (see the module's docstring)."""
    if member_s is not None:
        return member_s
    return max(site_s, STEP_FACTOR * step_s) if step_s else site_s


class Watchdog:
    """Call :meth:`check` from the runner's loop; it looks at most every :data:`WATCH_S` seconds.

    ``timeouts`` maps task names to their member's ``stall_timeout`` (None: derived); tasks not in it
    (stages, analytics) take the site's. Each silent attempt, block and interchange is reported once.
    Tasks in ``ignored`` run in blocks of an earlier runner (adopted attempts, watched by
    :class:`~resilient_flows.workflow._adopt.Adoption`): their block numbers are not this runner's.
    """

    def __init__(
        self,
        run_dir: Path,
        site_stall_s: float,
        timeouts: Mapping[str, float | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.heartbeats = run_layout(run_dir).heartbeats
        self.site_stall_s = site_stall_s
        self.timeouts = timeouts
        self.clock = clock
        self._beats: dict[str, _Beat] = {}
        self._quiet_since: dict[tuple[str, str], float] = {}  # (executor, block) holding tasks, none beating
        self._held: dict[tuple[str, str], int] = {}  # tasks each block held at the last look
        self._starting: set[tuple[str, str]] = set()  # blocks that took a task and have not beaten since
        self._reported: set[tuple[Any, ...]] = set()
        self._looked = float("-inf")
        self.ignored: set[str] = set()

    def check(self, executors: Iterable[Any]) -> list[Lost]:
        now = self.clock()
        if now - self._looked < WATCH_S:
            return []
        self._looked = now
        self._read_beats(now)
        found = [*self._lost_pools(now), *self._silent_attempts(now)]
        for executor in executors:
            if not isinstance(executor, HighThroughputExecutor):
                continue
            reason = interchange_gone(executor)
            if reason is not None:
                found.append(Lost(reason, executor=executor.label))
                continue
            managers = interchange_managers(executor)
            if managers is None:
                reason = f"the interchange of executor {executor.label} did not answer within {ANSWER_S:.0f} s"
                found.append(Lost(reason, executor=executor.label))
                continue
            found.extend(self._quiet_blocks(executor.label, managers, now))
        fresh = [lost for lost in found if _key(lost) not in self._reported]
        self._reported.update(_key(lost) for lost in fresh)
        return fresh

    def beats(self) -> dict[str, dict[str, Any]]:
        """The latest heartbeat record of each running attempt, by task name, as last read."""
        return {name: beat.record for name, beat in self._beats.items()}

    def forget_block(self, executor: str, block: str) -> None:
        """The block was cancelled: its tasks' silence is no longer news."""
        self._quiet_since.pop((executor, block), None)
        self._held.pop((executor, block), None)
        self._starting.discard((executor, block))

    def _read_beats(self, now: float) -> None:
        try:
            names = os.listdir(self.heartbeats)
        except FileNotFoundError:
            names = []
        for name in set(self._beats) - set(names):
            del self._beats[name]
        for name in names:
            if name in self.ignored:
                self._beats.pop(name, None)
                continue
            path = self.heartbeats / name
            try:
                mtime = os.stat(path).st_mtime_ns
            except FileNotFoundError:
                self._beats.pop(name, None)
                continue
            beat = self._beats.get(name)
            if beat is None or beat.mtime_ns != mtime:
                record = read_attempt_heartbeat(path)
                previous = {} if beat is None else beat.record
                self._beats[name] = _Beat(mtime, now, record if record is not None else previous)

    def _lost_pools(self, now: float) -> Iterable[Lost]:
        """The blocks whose pool a running attempt saw gone, once each (the first to say so); then
        those whose pool the runner sees gone on its own host (``pool_gone``): the attempts of a
        killed pool may die with it before they look."""
        said: set[str] = set()
        for name, beat in sorted(self._beats.items()):
            why, block = beat.record.get("pool_lost"), beat.record.get("block")
            if why is None or block is None or str(block) in said:
                continue
            said.add(str(block))
            yield Lost(
                f"the worker pool of block {block} is gone, as {name} saw (pid {beat.record.get('pid', '?')} on "
                f"{beat.record.get('host', '?')}): {why}",
                block=str(block),
                seen_by=name,
            )
        for name, beat in sorted(self._beats.items()):
            block = beat.record.get("block")
            if block is None or str(block) in said or now - beat.changed > self.site_stall_s:
                continue
            why = _local_pool_gone(beat.record)
            if why is not None:
                said.add(str(block))
                yield Lost(
                    f"the worker pool of block {block} is gone, as the runner saw on {beat.record.get('host')} "
                    f"(running {name}): {why}",
                    block=str(block),
                    seen_by=name,
                    pool_gone=why,
                )

    def _silent_attempts(self, now: float) -> Iterable[Lost]:
        for name, beat in self._beats.items():
            member_s = self.timeouts.get(name)
            limit = stall_timeout(member_s, beat.record.get("step_s"), self.site_stall_s)
            silent = now - beat.changed
            if silent > limit:
                yield Lost(
                    f"no heartbeat for {silent:.0f} s (stall_timeout {limit:.0f} s) from pid "
                    f"{beat.record.get('pid', '?')} on {beat.record.get('host', '?')}",
                    task=name,
                    attempt=beat.record.get("attempt"),
                    block=beat.record.get("block"),
                    silent_s=round(silent, 3),
                )

    def _quiet_blocks(self, label: str, managers: list[dict[str, Any]], now: float) -> Iterable[Lost]:
        holding: dict[str, int] = {}
        for manager in managers:
            if manager.get("active", True) and manager.get("tasks", 0) > 0:
                block = str(manager.get("block_id"))
                holding[block] = holding.get(block, 0) + int(manager["tasks"])
        beating = {
            str(beat.record.get("block"))
            for beat in self._beats.values()
            if now - beat.changed <= self.site_stall_s and beat.record.get("block") is not None
        }
        for key in [k for k in self._held if k[0] == label and k[1] not in holding]:
            self.forget_block(*key)
        for block, tasks in holding.items():
            key = (label, block)
            took = tasks > self._held.get(key, 0)
            self._held[key] = tasks
            if block in beating:
                self._quiet_since.pop(key, None)
                self._starting.discard(key)
                continue
            if took:  # a task that has just been taken cannot have beaten yet
                self._starting.add(key)
                self._quiet_since[key] = now
            since = self._quiet_since.setdefault(key, now)
            limit = self.site_stall_s * (START_FACTOR if key in self._starting else 1.0)
            if now - since > limit:
                yield Lost(
                    f"block {block} holds {tasks} task(s) but none has beaten for {now - since:.0f} s "
                    f"(stall_timeout {limit:.0f} s): its workers are gone or hung",
                    block=block,
                    executor=label,
                )


def _local_pool_gone(record: dict[str, Any]) -> str | None:
    """Why an attempt's pool (:meth:`~resilient_flows.rundir.PoolLook.process`), on this host, can
    no longer run it; None while it runs, or where this host cannot look."""
    pool = record.get("pool")
    if record.get("host") != socket.gethostname() or not isinstance(pool, dict):
        return None
    pid, started = pool.get("pid"), pool.get("started")
    if not isinstance(pid, int) or not isinstance(started, int):
        return None
    return pool_exited(pid) if pool_process_gone(pid, started) else None


def _key(lost: Lost) -> tuple[Any, ...]:
    if lost.task is not None:
        return ("task", lost.task, lost.attempt)
    return ("block", lost.executor, lost.block)
