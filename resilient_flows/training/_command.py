"""Run a command member: the body of :func:`resilient_flows.apps.command_app`.

The command runs in its own process group with its run contract in the environment
(:mod:`resilient_flows.training._contract`), in the workflow file's directory, its stdout and
stderr in the attempt's log (``members/<name>/logs/attempt-<n>.log``). While it runs, this process
beats for it (the runner's watchdog declares silent attempts lost) and forwards SIGTERM and
SIGUSR1 to the whole group; a group still alive ``grace_s`` after the first forwarded signal is
killed.

How the command ended decides what the retry costs (see :class:`~resilient_flows.apps.ResumingRetryHandler`):

- status 0: the member finished; its result is what the script reported, if it did;
- status 75: it stopped after committing a checkpoint, :class:`~resilient_flows.errors.Preempted`: free;
- killed by a signal: :class:`CommandKilled`, a lost worker: free only after progress;
- status 127 or 126, or no process at all: :class:`CommandCannotRun`, the program is not there or
  not executable: the member fails at once, no retry would start it;
- any other status: :class:`CommandFailed`: costs a retry.

Nothing here imports torch or Parsl.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from resilient_flows.capped import open_regular
from resilient_flows.errors import PermanentError, Preempted, ResilientFlowsError
from resilient_flows.procgroup import kill_group
from resilient_flows.rundir import EventLog, member_layout
from resilient_flows.rundir._heartbeat import Heartbeat
from resilient_flows.training._contract import EXIT_CANNOT_RUN, EXIT_PREEMPTED, STOP_SIGNALS, RunContract
from resilient_flows.training._faults import record_pool_lost
from resilient_flows.training._members import latest_committed_step
from resilient_flows.training._output import open_attempt_log
from resilient_flows.training._pool import PoolWatch
from resilient_flows.training._spec import MemberSpec

logger = logging.getLogger(__name__)

#: Seconds a command has, after a forwarded stop signal, to commit a checkpoint and exit.
DEFAULT_GRACE_S = 60.0


#: Seconds between two looks at the command while it runs.
POLL_S = 0.1

#: Run first, before the command: SIGKILL it when this process dies (a killed worker must not leave
#: it training beside the next attempt), unless this process is gone already, then exec it. A
#: program it cannot exec ends it as a shell would end: 127 not found, 126 not executable.
_ORPHAN_GUARD = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(137)\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as exc:\n"
    "    print(f'{sys.argv[2]}: {exc.strerror}', file=sys.stderr)\n"
    "    sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)\n"
)


class CommandFailed(ResilientFlowsError):
    """A command member's command exited with a status other than 0 and 75: costs a retry."""

    def __init__(self, member: str, status: int | None, last_line: str = "") -> None:
        super().__init__(member, status, last_line)
        self.member, self.status, self.last_line = member, status, last_line

    def __str__(self) -> str:
        tail = f": {self.last_line}" if self.last_line else ""
        return f"command of member {self.member} exited with status {self.status}{tail}"


class CommandCannotRun(CommandFailed, PermanentError):
    """A command member's program could not be started: not found (status 127) or not executable
    (126), as a shell reports it, or no process at all (``status`` None: no working directory, say).
    No retry would start it: the member fails at once."""

    def __str__(self) -> str:
        how = "" if self.status is None else f" (exit status {self.status})"
        tail = f": {self.last_line}" if self.last_line else ""
        return f"command of member {self.member} could not be started{how}{tail}"


class CommandKilled(ResilientFlowsError):
    """A command member's command was killed by a signal: a lost worker, free after progress."""

    def __init__(self, member: str, signal_name: str, why: str = "") -> None:
        super().__init__(member, signal_name, why)
        self.member, self.signal_name, self.why = member, signal_name, why

    def __str__(self) -> str:
        why = f" ({self.why})" if self.why else ""
        return f"command of member {self.member} was killed by {self.signal_name}{why}"


def run_command(spec_dict: dict[str, Any], run_dir: str) -> dict[str, Any]:
    """Run one attempt of a command member to its end; its result, or the exception its exit means."""
    spec = MemberSpec.from_dict(spec_dict)
    if not spec.command:
        raise ResilientFlowsError(f"member {spec.name} has no command to run")
    layout = member_layout(run_dir, spec.name)
    layout.root.mkdir(parents=True, exist_ok=True)
    attempt = layout.count_attempt()
    layout.command_report.unlink(missing_ok=True)  # a report counts only from this attempt
    contract = RunContract.for_member(spec, run_dir, attempt)
    events = EventLog(run_dir)
    grace = DEFAULT_GRACE_S if spec.grace_s is None else spec.grace_s
    log_path = layout.attempt_log(attempt)
    stop = _Stop()
    orphaned = functools.partial(stop.request, signal.SIGTERM)  # as a batch system warns a job: commit, exit 75

    def pool_lost(reason: str) -> None:  # the machine's fault: the command commits and exits 75 all the same
        record_pool_lost(layout.root, reason)
        orphaned(reason)

    beating = Heartbeat(
        run_dir, spec.name, attempt, on_orphaned=orphaned, on_pool_lost=pool_lost, pool=PoolWatch.find()
    )
    with open(open_attempt_log(layout, attempt, header=shlex.join(spec.command)), "ab") as log, beating:
        try:
            process = subprocess.Popen(
                _guarded(spec.command),
                cwd=spec.workdir,
                env={**os.environ, **contract.to_env()},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: signals reach every process it starts
            )
        except OSError as exc:  # no orphan guard to report it (not Linux), or no working directory
            raise CommandCannotRun(spec.name, None, str(exc)) from None
        events.emit(
            "started", spec.name, attempt=attempt, host=socket.gethostname(), pid=os.getpid(), command_pid=process.pid
        )
        stop.attach(process)
        try:
            with _forwarding(stop):
                status, why = _wait(process, stop, grace)
        finally:
            kill_group(process.pid)  # whatever it left behind must not write into the next attempt
    if status == 0:
        return _finish(spec, run_dir, attempt, events)
    if status < 0 and layout.command_report.is_file():
        # Its report is written durably once its last checkpoint is committed: the member finished,
        # and a signal at exit (gloo's threads torn down with the interpreter abort) must not undo that.
        reason = f"the command was killed by {_signal_name(-status)} after reporting its result"
        events.emit("warning", spec.name, attempt=attempt, reason=reason)
        return _finish(spec, run_dir, attempt, events, status)
    if status == EXIT_PREEMPTED:
        reason = stop.reason or "the command exited with status 75"
        raise Preempted(spec.name, latest_committed_step(run_dir, spec), reason)
    if status < 0:
        raise CommandKilled(spec.name, _signal_name(-status), why)
    if status in EXIT_CANNOT_RUN:
        raise CommandCannotRun(spec.name, status, _last_line(log_path))
    raise CommandFailed(spec.name, status, _last_line(log_path))


class _Stop:
    """The first stop request made of a command (a forwarded signal, the runner gone), and when;
    the grace runs from then."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.since: float | None = None
        self.process: subprocess.Popen | None = None
        self._pending: int | None = None  # a signal requested before the command started
        self._lock = threading.Lock()  # requests come from the heartbeat's thread too

    def request(self, signum: int, reason: str) -> None:
        """Send ``signum`` to the command's group (once it runs), remembering the first reason."""
        with self._lock:
            if self.since is None:
                self.reason, self.since = reason, time.monotonic()
            if self.process is None:
                self._pending = signum
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)

    def attach(self, process: subprocess.Popen) -> None:
        """The command now runs: it gets a signal requested before it started."""
        with self._lock:
            self.process = process
            if self._pending is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, self._pending)


@contextlib.contextmanager
def _forwarding(stop: _Stop) -> Iterator[None]:
    """Forward SIGTERM and SIGUSR1 to the command's group while it runs (main thread only: a
    thread cannot install signal handlers, and then the group gets the batch system's signals
    directly or not at all)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, _frame: Any) -> None:
        stop.request(signum, f"signal {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _guarded(argv: list[str]) -> list[str]:
    """``argv`` behind the orphan guard where Linux offers one (``prctl``), else as it is."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-c", _ORPHAN_GUARD, str(os.getpid()), *argv]


def _wait(process: subprocess.Popen, stop: _Stop, grace: float) -> tuple[int, str]:
    """The command's exit status (negative: the signal that killed it), and why it was killed
    when it was this process that killed it."""
    killed = ""
    while True:
        try:
            return process.wait(timeout=POLL_S), killed
        except subprocess.TimeoutExpired:
            pass
        if stop.since is not None and not killed and time.monotonic() - stop.since > grace:
            killed = f"still running {grace:g} s after {stop.reason}"
            kill_group(process.pid)


def _signal_name(number: int) -> str:
    """``SIGABRT``, or ``signal 40`` for a number Python has no name for (a real-time signal)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _finish(spec: MemberSpec, run_dir: str, attempt: int, events: EventLog, status: int = 0) -> dict[str, Any]:
    """The member's result: what its script reported, if it did, and how the command ended."""
    layout = member_layout(run_dir, spec.name)
    try:
        reported = layout.read_command_report()
    except FileNotFoundError:
        reported = {}
    except (OSError, ValueError) as exc:  # the member did finish: its result says what the report lacks
        logger.warning("member %s: its report is not used: %s", spec.name, exc)
        reported = {}
    result = {**(reported if isinstance(reported, dict) else {}), "member": spec.name, "attempts": attempt}
    result["exit_status"] = status
    layout.write_result(result)
    scalars = {k: v for k, v in result.items() if isinstance(v, int | float | str) and k not in ("member", "attempts")}
    events.emit("finished", spec.name, attempt=attempt, **scalars)
    return result


def _last_line(path: Path) -> str:
    """The command's last line of output, for the failure's message (what a traceback ends with)."""
    try:
        with open_regular(path, "command log") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = [line for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    except (OSError, ValueError):  # none, or not a regular file
        return ""
    last = lines[-1].strip() if lines else ""
    return "" if last.startswith("--- attempt ") else last[:300]
