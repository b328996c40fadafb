"""Hung workers: a worker process stopped on a node whose pool still runs, found by that pool.

A worker stopped by a signal (``SIGSTOP``: state ``T`` in ``/proc``) holds its task and never
exits, so Parsl's pool never reports it; the runner's watchdog finds the attempt silent only after
its stall timeout, and then cancels the whole block: every member on it loses its attempt and
waits for a new block. The pool itself can tell at once. A warm pool
(:mod:`resilient_flows.sites._warmpool`) looks at its workers every :data:`LOOK_S` seconds with a
:class:`HangWatch`; a worker seen stopped at every look for :data:`HUNG_S` is killed, its task
reported as :class:`WorkerHung` (the machine's fault: the retry handler charges no retry and keeps
the block, whose other workers are sound) and a new worker forked in its place, ready for the retry.

What is left alone: a traced stop (``t``: a debugger or a profiler attached for a moment), and a
worker stopped while the pool was stopped too (a suspended job: the whole job is continued
together). A look that comes :data:`LATE_S` after the previous one (the pool itself was stopped, or
starved of CPU) starts every count again. A node that hangs whole, pool included, is left to the
runner's watchdog and its stall timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from parsl.executors.high_throughput.errors import WorkerLost

from resilient_flows.rundir._lease import stat_fields

__all__ = ["HUNG_S", "LATE_S", "LOOK_S", "HangWatch", "WorkerHung", "process_state"]

#: Seconds between two looks at the pool's workers.
LOOK_S = 0.5
#: Seconds a worker must be seen stopped, look after look, before it is taken for hung.
HUNG_S = 2.0
#: A look this long after the previous one starts the counts again: the stops it would measure
#: may have been the pool's own.
LATE_S = 2.0


class WorkerHung(WorkerLost):
    """A worker that its pool found stopped for ``stopped_s`` seconds, killed and replaced: a lost
    worker that the machine, not the member, lost."""

    def __init__(self, worker_id: int, hostname: str, stopped_s: float) -> None:
        super().__init__(worker_id, hostname)
        self.stopped_s = stopped_s

    def __str__(self) -> str:
        return (
            f"worker {self.worker_id} on host {self.hostname} was stopped for {self.stopped_s:.1f} s: "
            "its pool killed it and started another"
        )


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` in ``/proc`` (``R``, ``S``, ``T``, ...); None when it is gone
    or there is no ``/proc``."""
    try:
        fields = stat_fields(pid)
    except OSError:
        return None
    return fields[0] if fields else None


class HangWatch:
    """Counts, for each process looked at, how long it has been seen stopped; :meth:`look` says
    which are hung. ``state`` and ``clock`` are for tests."""

    def __init__(
        self,
        state: Callable[[int], str | None] = process_state,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._state = state
        self._clock = clock
        self._since: dict[int, float] = {}
        self._looked: float | None = None

    def look(self, pids: Iterable[int]) -> dict[int, float]:
        """The processes among ``pids`` stopped at every look for :data:`HUNG_S` or more, with
        for how long; each is reported at each look until it is gone from ``pids``."""
        now = self._clock()
        late = self._looked is not None and now - self._looked > LATE_S
        self._looked = now
        previous = {} if late else self._since
        self._since = {pid: previous.get(pid, now) for pid in pids if self._state(pid) == "T"}
        return {pid: now - since for pid, since in self._since.items() if now - since >= HUNG_S}
