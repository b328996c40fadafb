"""Ctrl-C and SIGTERM: the runner stops its run cleanly, and a second one stops it at once.

A terminal's Ctrl-C sends SIGINT to its whole foreground process group: the runner and whatever it
started there. Parsl's interchange, started by ``parsl.load``, would die of it with a traceback,
and the runner would then wait for good for the dead interchange's answers. So:

- :func:`shielded` blocks SIGINT in the thread that starts Parsl: the processes started meanwhile
  (the interchange, monitoring's) inherit the blocked signal, a terminal's Ctrl-C never reaches
  them, and the runner stops them itself. Worker pools already run in process groups of their own
  (Parsl's LocalProvider starts them so; a batch job is not on this terminal at all).
- :class:`Interrupts` takes SIGINT and SIGTERM in the runner. The first asks for a stop, which the
  runner carries out between two looks at the run: a :class:`Drain` holds every block (the
  interchange starts no more tasks), asks each running member through its control file to commit
  a checkpoint and stop, as a block's walltime drain does, and waits until none beats any more;
  the retry handler requeues nothing meanwhile. Parsl then shuts down as after a run, cancelling
  the blocks, and the runner exits 128 + the signal's number (130 for SIGINT, 143 for SIGTERM),
  naming the ``resume`` command.
- A second one, while Parsl runs, raises :class:`StopNow` in the runner, which kills the blocks
  and the interchange at once (:func:`~resilient_flows.workflow._blocks.BlockLedger.cancel_own`):
  every process of the run goes with them (a command member dies with its launcher), and the
  members resume from their newest committed checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parsl.executors import HighThroughputExecutor

from resilient_flows.errors import Preempted
from resilient_flows.rundir import BEAT_S, member_layout, read_attempt_heartbeat, request_preemption, run_layout
from resilient_flows.sites._parsl import DFK_LOGGER, hold_managers

#: The signals that stop a run.
INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


class StopNow(BaseException):
    """A second stop signal came while Parsl ran: everything of the run is killed at once. Not an
    ``Exception``, as ``KeyboardInterrupt`` is not: no ``except Exception`` on its way stops it."""


class Interrupts:
    """SIGINT and SIGTERM, taken on the main thread while installed (a context manager; elsewhere
    it installs nothing). The first names the signal in :attr:`signum`; a second raises
    :class:`StopNow` where :meth:`armed` allows it, and is only recorded elsewhere (in the middle
    of letting go of the lease, it would leave a half-released run)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.again = False
        self._armed = False
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return "" if self.signum is None else signal.Signals(self.signum).name

    @property
    def status(self) -> int:
        """The exit status of a runner stopped by the signal, as a shell reports a process killed by it."""
        return 128 + (self.signum or signal.SIGINT)

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._take) for sig in INTERRUPTS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """While in this block, a second signal raises :class:`StopNow` (one that came before, at once)."""
        if self.again:
            raise StopNow(self.signum)
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    def _take(self, signum: int, _frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        elif not self.again:
            self.again = True
            if self._armed:
                raise StopNow(signum)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """SIGINT blocked in this thread while in the block, so that the processes started from it
    inherit it blocked (a signal mask survives fork and exec). A SIGINT meanwhile goes to another
    thread of the runner, whose handler runs all the same; none taking it, it waits until the end
    of the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@dataclass
class Drain:
    """The clean stop of a run's running members (see the module's docstring); :meth:`update` from
    the runner's loop until it says they stopped, or ``wait_s`` passed; then :meth:`finish`."""

    run_dir: Path
    members: set[str]
    reason: str
    wait_s: float
    asked: set[tuple[str, Any]] = field(default_factory=set)  # (member, attempt) asked to stop
    deadline: float = field(init=False)

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.wait_s

    def hold(self, executors: Iterable[Any]) -> None:
        """Hold every block's managers: no task starts any more, nor a stopped member's retry."""
        for executor in executors:
            if isinstance(executor, HighThroughputExecutor):
                hold_managers(executor)

    def update(self) -> bool:
        """Ask the members newly seen beating to stop; whether none beats any more, or the time is up."""
        beating = _beating(self.run_dir, self.members)
        for name, record in beating.items():
            key = (name, record.get("attempt"))
            if key in self.asked:
                continue
            block = record.get("block")
            with contextlib.suppress(OSError):  # a full file system: asked again at the next look
                request_preemption(self.run_dir, name, self.reason, block=None if block is None else str(block))
                self.asked.add(key)
        return not beating or time.monotonic() > self.deadline

    def finish(self) -> None:
        """Withdraw the requests nobody took (a member that ended otherwise, or is killed now): a
        ``resume`` must not find them and stop its members after their first step."""
        for name in {name for name, _ in self.asked}:
            layout = member_layout(self.run_dir, name)
            with contextlib.suppress(OSError, ValueError):
                request = layout.read_control()
                if isinstance(request, dict) and request.get("reason") == self.reason:
                    layout.control.unlink()


class _QuietStops(logging.Filter):
    """Parsl logs each task that ends without a retry as an error, with its traceback: a member
    that stopped as the runner asked is no error, and its traceback would read like one in the
    runner's log (the output of a detached runner)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], Preempted))


_QUIET = _QuietStops()


@contextlib.contextmanager
def quiet_stops() -> Iterator[None]:
    """Leave out of the logs the failures of the tasks of members that stopped while in the block."""
    logger = logging.getLogger(DFK_LOGGER)
    logger.addFilter(_QUIET)
    try:
        yield
    finally:
        logger.removeFilter(_QUIET)


def _beating(run_dir: Path, members: set[str]) -> dict[str, dict[str, Any]]:
    """The heartbeat records of the members' attempts that beat now: each removes its file when it
    stops; one killed leaves its file to go stale."""
    try:
        paths = list(run_layout(run_dir).heartbeats.iterdir())
    except OSError:
        return {}
    now = time.time()
    found = {}
    for path in paths:
        if path.name not in members:
            continue
        try:
            fresh = now - path.stat().st_mtime < 3 * BEAT_S
        except OSError:
            continue
        record = read_attempt_heartbeat(path)
        if fresh and record is not None:
            found[path.name] = record
    return found


def resume_line(run_dir: Path) -> str:
    """The command that continues the run."""
    return shlex.join(["resilient-flows", "resume", os.fspath(run_dir)])
