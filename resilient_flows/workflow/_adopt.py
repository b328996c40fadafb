"""Attempts that a killed runner left training, adopted by the runner that resumes the run.

A runner killed with SIGKILL (a login node's ssh session dropped, an operator's mistake) leaves its
interchange and worker pools running, and their members training on: nothing of theirs needs the
runner until they end. Cancelling them at ``resume`` throws away every step since their last
checkpoint and costs each a new block, a new worker and a restore. Instead, the resuming runner
adopts them: it does not submit those members, watches each adopted attempt by its heartbeat, and
once one ends, takes its result or submits the member to its own executors, which resume it from
its newest checkpoint. When no adopted attempt is left, the earlier runners' blocks and
interchanges are cancelled as before.

Two attempts of one member never write at once:

- only an attempt that beat within :data:`FRESH_S` (and, on this host, whose process lives) is
  adopted, and only while the interchanges of the runner before lives (its pools would end with
  them, and their attempts); adoption is all or nothing: a live task that cannot be adopted (a
  stage, an analytics request, a retry waiting out its backoff, an attempt whose pool is lost)
  makes the runner cancel every earlier block, as it did before, and submit everything;
- the earlier interchanges still hold the tasks they had queued and hand them to the adopted
  attempts' workers as these free up: such a task refuses to start, since the lease now names
  another runner's token than the one its block carries
  (:func:`~resilient_flows.rundir.superseded`). The runner writes its lease before it looks for
  attempts to adopt, and a task looks at the lease again once its heartbeat file exists: either
  the runner sees that file, or the task sees the new lease;
- an adopted attempt is resubmitted only once it is over: its heartbeat file removed (the attempt
  ended, and wrote its result first when it finished), its process gone (on this host), or silent
  for its stall timeout, stopped (on this host, state ``T`` for :data:`~resilient_flows.sites._hung.HUNG_S`,
  as its pool would judge a worker that its pool can no longer look after), or its pool lost. In
  the last three cases it may still be alive, so every earlier block is cancelled first, and
  every adopted member is submitted again.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resilient_flows.rundir import (
    BEAT_S,
    has_result,
    process_start_time,
    read_attempt_heartbeat,
    read_records,
    run_layout,
    stat_fields,
)
from resilient_flows.sites._hung import HUNG_S, process_state
from resilient_flows.training import MemberSpec

__all__ = ["FRESH_S", "RESULT_GRACE_S", "Adoption", "adoptable"]

#: Seconds since its last beat within which an earlier runner's attempt counts as alive (as the
#: runner's guard judges: three beats).
FRESH_S = 3 * BEAT_S

#: Seconds an adopted attempt has, once its heartbeat file is gone, to write its result: it stops
#: beating as its context closes, just before it writes it (a member that finishes, or retires).
#: An attempt that ended without one (stopped by a drain, or failed) is submitted again this late.
RESULT_GRACE_S = 10.0


def live_attempts(run_dir: Path, now: float | None = None) -> dict[str, dict[str, Any]]:
    """The heartbeat records that changed within :data:`FRESH_S`, by task name."""
    directory = run_layout(run_dir).heartbeats
    now = time.time() if now is None else now
    found = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    for name in names:
        path = directory / name
        try:
            fresh = now - path.stat().st_mtime <= FRESH_S
        except OSError:  # it ended meanwhile
            continue
        record = read_attempt_heartbeat(path)
        if fresh and _alive(record or {}):
            found[name] = record if record is not None else {}
    return found


def _local_pid(record: dict[str, Any]) -> int | None:
    """The process that beats, where it runs on this host (which can look at it); else None."""
    pid = record.get("pid")
    return pid if record.get("host") == socket.gethostname() and isinstance(pid, int) else None


def _alive(record: dict[str, Any]) -> bool:
    """Whether the process that beats lives, where this host can tell (it runs here)."""
    pid = _local_pid(record)
    if pid is None:
        return True
    try:
        return stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def interchanges_alive(run_dir: Path) -> bool:
    """Whether the newest interchange of each executor of the runner before this one still runs
    on this host (recorded in the block ledger with its start time; a runner's interchange runs on
    its host). Its worker pools end once it is gone, and the attempts they run with them."""
    records = list(read_records(run_layout(run_dir)))
    me = os.getpid()
    earlier = [r for r in records if r.get("runner") != me]
    if not earlier:
        return False
    last = earlier[-1].get("runner")
    newest = {r.get("executor"): r for r in earlier if r.get("runner") == last and "interchange" in r}
    pids = [(r["interchange"], r.get("started")) for r in newest.values()]
    return bool(pids) and all(isinstance(p, int) and process_start_time(p) == s for p, s in pids)


def adoptable(
    run_dir: Path, pending: Iterable[MemberSpec], planned: Mapping[str, int] | None = None
) -> dict[str, dict[str, Any]] | None:
    """The live attempts of earlier runners by member name, when every live task is an attempt of
    one of the ``pending`` members that has started and whose pool is not lost; None when some live
    task cannot be adopted (see the module's docstring). Call it after taking the lease.

    ``planned``: the rank count each member was planned with; a member resumed on another
    (``resume --ranks``) cannot be adopted, its live attempt runs on the old one."""
    planned = planned or {}
    names = {m.name for m in pending if planned.get(m.name, m.ranks) == m.ranks}
    live = live_attempts(run_dir)
    if live and not interchanges_alive(run_dir):
        return None
    for name, record in live.items():
        if name not in names or not isinstance(record.get("attempt"), int) or "waiting_s" in record:
            return None
        if record.get("pool_lost") is not None:
            return None
    return live


@dataclass
class _Adoptee:
    spec: MemberSpec
    record: dict[str, Any]
    future: Future = field(default_factory=Future)
    gone_at: float | None = None  # monotonic: when its heartbeat file was first seen gone
    stopped_at: float | None = None  # monotonic: since when its process was seen stopped, look after look


class Adoption:
    """The adopted attempts of one resume: call :meth:`update` from the runner's loop.

    ``records``: what :func:`adoptable` found; ``specs``: the members by name; ``stall_s``: an
    attempt's stall timeout from its member and heartbeat record (the watchdog's rule). Each
    adopted member has a :class:`Future`, resolved once its attempt ended: with its result when it
    finished, else with None (the member is then submitted, and its Parsl future replaces this one).
    """

    def __init__(
        self,
        run_dir: Path,
        records: dict[str, dict[str, Any]],
        specs: dict[str, MemberSpec],
        stall_s: Callable[[MemberSpec, dict[str, Any]], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_dir, self.stall_s, self.clock = run_dir, stall_s, clock
        self.heartbeats = run_layout(run_dir).heartbeats
        self.adopted = {name: _Adoptee(specs[name], record) for name, record in records.items()}
        now = clock()
        self._changed = {name: (self._mtime(name), now) for name in self.adopted}

    def names(self) -> set[str]:
        """The members whose adopted attempt has not ended yet."""
        return set(self.adopted)

    def future(self, name: str) -> Future:
        return self.adopted[name].future

    def update(self) -> tuple[list[MemberSpec], str | None]:
        """Look at every adopted attempt once: the members whose attempt ended without a result
        (to submit), and why, when one may still be alive but cannot be waited for (silent past
        its stall timeout, or its pool lost): then call :meth:`abandon`, once the earlier blocks
        were cancelled."""
        resubmit = []
        for name in list(self.adopted):
            adoptee = self.adopted[name]
            mtime = self._mtime(name)
            if mtime is None:
                if self._over(name, adoptee):
                    resubmit.extend(self._end(name))
                continue
            now = self.clock()
            if mtime != self._changed[name][0]:
                self._changed[name] = (mtime, now)
                record = read_attempt_heartbeat(self.heartbeats / name)
                adoptee.record = record if record is not None else adoptee.record
            if not _alive(adoptee.record):  # killed on this host: it writes nothing more
                resubmit.extend(self._end(name))
                continue
            if adoptee.record.get("pool_lost") is not None:
                return resubmit, f"adopted attempt of {name} lost its pool: {adoptee.record['pool_lost']}"
            stopped = self._stopped_s(adoptee, now)
            if stopped >= HUNG_S:
                return resubmit, f"adopted attempt of {name} has been stopped for {stopped:.0f} s (hung)"
            silent, limit = now - self._changed[name][1], self.stall_s(adoptee.spec, adoptee.record)
            if silent > limit:
                why = f"has not beaten for {silent:.0f} s (stall timeout {limit:.0f} s)"
                return resubmit, f"adopted attempt of {name} {why}"
        return resubmit, None

    def abandon(self) -> list[MemberSpec]:
        """Give up every adopted attempt left (their blocks were cancelled): their heartbeat files
        removed, their futures resolved; the members to submit, those that finished left out."""
        resubmit = []
        for name in list(self.adopted):
            resubmit.extend(self._end(name))
        return resubmit

    def _over(self, name: str, adoptee: _Adoptee) -> bool:
        """Whether an attempt whose heartbeat file is gone is over: it wrote its result, or had
        :data:`RESULT_GRACE_S` to write it."""
        if has_result(self.run_dir, name):
            return True
        now = self.clock()
        adoptee.gone_at = now if adoptee.gone_at is None else adoptee.gone_at
        return now - adoptee.gone_at > RESULT_GRACE_S

    def _stopped_s(self, adoptee: _Adoptee, now: float) -> float:
        """How long the attempt's process (on this host) has been seen stopped, look after look;
        0 when it runs. A stopped worker never beats again, and its pool, which would replace it,
        may be the reason its runner was lost: waiting out the stall timeout costs its member that
        much more."""
        pid = _local_pid(adoptee.record)
        if pid is None or process_state(pid) != "T":
            adoptee.stopped_at = None
            return 0.0
        adoptee.stopped_at = now if adoptee.stopped_at is None else adoptee.stopped_at
        return now - adoptee.stopped_at

    def _end(self, name: str) -> list[MemberSpec]:
        """Forget an attempt that is over, and its heartbeat file: left in place, it would be taken
        for a silent attempt of this runner's blocks once the member is submitted again."""
        (self.heartbeats / name).unlink(missing_ok=True)
        adoptee = self.adopted.pop(name)
        del self._changed[name]
        finished = has_result(self.run_dir, name)
        adoptee.future.set_result({"member": name} if finished else None)
        return [] if finished else [adoptee.spec]

    def _mtime(self, name: str) -> int | None:
        try:
            return (self.heartbeats / name).stat().st_mtime_ns
        except OSError:
            return None
