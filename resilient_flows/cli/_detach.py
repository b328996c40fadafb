"""``run --detach`` and ``resume --detach``: the runner as a daemon that outlives the terminal.

A runner in the foreground of an ssh session on a login node dies with the session (SIGHUP), and
its members stop once its lease expires. A detached runner is ``resilient-flows resume RUN_DIR``
started in a session of its own, with no controlling terminal (so no hang-up ever reaches it, nor
the signals of the terminal's process group), stdin from ``/dev/null`` and its output appended to
the run's ``runner.log``. It is a fresh interpreter, not a fork of this one: the command line may
hold Parsl's and torch's threads by the time it detaches, and a fork keeps their locks but not them.

The command waits until the runner has taken the run (its lease names the runner's process), so
that a runner that cannot start (a site that fails, a run another runner holds) is reported here,
with the error line from its log and exit status 2, not discovered later in the log.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from resilient_flows.errors import WorkflowError
from resilient_flows.rundir import holding_runner, process_start_time, read_lease, run_layout

__all__ = ["detach_runner"]

#: Seconds the runner has to take the run: it imports Parsl, reads its site and may wait out a
#: full file system (60 s) before it writes its lease.
START_TIMEOUT_S = 120.0
#: Seconds between two looks at the lease while the runner starts.
POLL_S = 0.1
#: Seconds a runner stopped before it took the run has to exit (one that took it may need longer:
#: its members commit a checkpoint first, see :func:`~resilient_flows.workflow._leaseguard.stop_wait_s`).
STOP_S = 30.0
#: How much of the log's end is searched for the error that stopped a runner from starting.
LOG_TAIL_BYTES = 64 * 1024


def detach_runner(run_dir: Path, options: Sequence[str], console: Console) -> int:
    """Start ``resume RUN_DIR OPTIONS`` as a detached runner of the run in ``run_dir`` (planned
    already), wait until it holds the run and say where to find it; 0 then, a
    :class:`WorkflowError` when it ended or hung before taking the run."""
    run_dir = run_dir.resolve()
    holder = holding_runner(run_dir)
    if holder is not None:  # refused before its log is touched; the runner's own check closes the race
        raise WorkflowError(
            f"{run_dir} is being run by process {holder.pid} on {holder.host}; wait for it to end, or stop it, "
            "before resuming"
        )
    log_path = run_layout(run_dir).runner_log
    command = [sys.executable, "-m", "resilient_flows.cli", "resume", str(run_dir), *options]
    with log_path.open("ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} detached: {shlex.join(command)}\n".encode())
        log.flush()
        began = log.tell()
        with _interruptible():
            runner = subprocess.Popen(  # the working directory stays: relative paths mean what they meant
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},  # a log that is followed with tail -f
            )
    ended = _wait_until_held(runner, run_dir, log_path, began)
    follow = shlex.join(["resilient-flows", "status", str(run_dir), "--follow"])
    console.print(f"runner started in the background: pid {runner.pid} on {socket.gethostname()}")
    console.print(f"  run directory: {escape(str(run_dir))}")
    console.print(f"  its output:    {escape(str(log_path))} (tail -f to watch it)")
    console.print(f"  follow it:     {escape(follow)}")
    if ended is not None:
        console.print(f"it has already ended, with exit status {ended}")
    return 0


def _wait_until_held(runner: subprocess.Popen, run_dir: Path, log_path: Path, began: int) -> int | None:
    """Wait until ``runner``'s record is the run's lease; its exit status if it has already ended
    (having held the run), None while it runs. A :class:`WorkflowError` if it ended without taking
    the run (with the error from what it wrote to its log after ``began``); if it did not take it
    within :data:`START_TIMEOUT_S`, or the user gave up (Ctrl-C), it is stopped first: a runner
    that nobody knows of must not go on."""
    born = process_start_time(runner.pid)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            ended = runner.poll()
            if _holds(run_dir, runner.pid, born):
                return ended
            if ended is not None:
                error = _last_error(log_path, began)
                raise WorkflowError(f"the runner did not start: {error} (its output: {log_path})")
            if time.monotonic() > deadline:
                _stop(runner)
                raise WorkflowError(
                    f"the runner (pid {runner.pid}) did not take the run within {START_TIMEOUT_S:g} s and was "
                    f"stopped; its output: {log_path}"
                )
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        _stop(runner)
        raise WorkflowError(f"interrupted: the runner (pid {runner.pid}) was stopped; its output: {log_path}") from None


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGINT not ignored in the runner started meanwhile, as it is in this command when it was
    started in the background by a shell without job control (``&`` in a script): the runner is
    stopped with it, as a foreground one with Ctrl-C. A signal ignored stays ignored across exec."""
    ignored = (
        threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    )
    if ignored:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop(runner: subprocess.Popen) -> None:
    """SIGINT, as Ctrl-C stops a foreground runner (:mod:`resilient_flows.workflow._interrupt`):
    one that took the run already has its members commit a checkpoint and stop, cancels its blocks
    and lets go of the run; SIGKILL if it does not stop (stuck on a hung file system): what it
    started is then its guard's to cancel, as after any runner that dies."""
    runner.send_signal(signal.SIGINT)
    try:
        runner.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        runner.kill()
        runner.wait()


def _holds(run_dir: Path, pid: int, born: int | None) -> bool:
    """Whether the run's lease names the process ``pid`` that started at ``born`` (a record of an
    earlier runner with a recycled pid does not), held or already let go of."""
    lease = read_lease(run_dir)
    return lease is not None and lease.pid == pid and lease.host == socket.gethostname() and lease.started == born


def _last_error(log_path: Path, began: int) -> str:
    """The runner's last ``error:`` line (the command line's one-line report of a mistake), else
    its last line (a traceback's), from the end of what it wrote to its log after ``began``."""
    with log_path.open("rb") as log:
        log.seek(max(began, os.fstat(log.fileno()).st_size - LOG_TAIL_BYTES))
        lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    errors = [line.removeprefix("error:").strip() for line in lines if line.startswith("error:")]
    return (errors or lines or ["it wrote nothing"])[-1]
