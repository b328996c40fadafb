"""A member's own output: each attempt's stdout and stderr in a file of its member's directory.

Without this, what a member prints goes wherever its process's descriptors 1 and 2 lead: for a
Parsl worker, a submit script's output file shared by every task the worker ran, on whichever
node ran it. Here each attempt writes to ``members/<name>/logs/attempt-<n>.log`` (see
:meth:`~resilient_flows.rundir.TaskLayout.attempt_log`), stdout and stderr interleaved in the
order they were written, as a terminal would show them, the traceback of a failed attempt last.

The redirection is of the descriptors, not of ``sys.stdout``: a C extension's output and the
processes the member starts land in the file too. In a worker that runs many tasks
(:func:`attempt_output`), the descriptors are put back when the attempt ends, so that the next
task's output goes to its own file. A log that cannot be written (a full file system) leaves the
output where it went, with a warning: the attempt runs all the same. Python's streams are flushed
at both ends, and are line buffered meanwhile so that stdout and stderr keep their order in the
file. Only a process's main thread redirects its descriptors: in a thread of the runner (Parsl's
``ThreadPoolExecutor``) they are the runner's own, so there the file gets the header and a failed
attempt's traceback only.

Nothing here imports torch or Parsl.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping

from resilient_flows.errors import Preempted
from resilient_flows.rundir import TaskLayout

logger = logging.getLogger(__name__)

#: Created without following a symbolic link (one planted in the run directory would send the
#: output anywhere), appended to by every writer (the launcher and its ranks), never inherited
#: by processes the opener starts other than through descriptors 1 and 2.
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


def open_attempt_log(layout: TaskLayout, attempt: int, rank: int = 0, header: str | None = "") -> int:
    """A descriptor appending to the attempt's log for ``rank``, with a header line: the attempt,
    where it runs, and ``header`` (what it runs; None: no header line). An attempt that ended before
    it was counted shares its file with the next, each under its own header."""
    path = layout.attempt_log(attempt, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, _FLAGS, 0o644)
    if header is not None:
        on = f"rank {rank} on " if rank else "on "
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        what = f": {header}" if header else ""
        line = f"--- attempt {attempt} {on}{socket.gethostname()}, pid {os.getpid()}, {when}{what}\n"
        os.write(fd, line.encode(errors="replace"))
    return fd


def next_attempt(layout: TaskLayout) -> int:
    """The number the attempt about to start will count itself as (see :meth:`TaskLayout.count_attempt`):
    its output is redirected before the member counts it."""
    return layout.read_attempts() + 1


@contextlib.contextmanager
def attempt_output(layout: TaskLayout, attempt: int, rank: int = 0) -> Iterator[None]:
    """Send this process's stdout and stderr to the attempt's log while the block runs, then put
    them back; an exception leaving the block is written there first, whole (a stop on request,
    :class:`~resilient_flows.errors.Preempted`, as one line: it is no failure)."""
    try:
        fd = open_attempt_log(layout, attempt, rank)
    except OSError as exc:  # a full file system, a link in its place: the attempt runs all the same
        logger.warning("member output of attempt %d not captured in %s: %s", attempt, layout.logs, exc)
        yield
        return
    redirect = threading.current_thread() is threading.main_thread()
    try:
        with _redirected(fd) if redirect else contextlib.nullcontext():
            try:
                yield
            except BaseException as exc:
                _write_ending(fd, exc)
                raise
    finally:
        os.close(fd)


def redirect_for_good(layout: TaskLayout, attempt: int, rank: int = 0) -> None:
    """Send this process's stdout and stderr to the attempt's log until it exits: one rank of a
    member, a process of its own (an exception it dies of is printed there by the interpreter).
    Rank 0's file has its launcher's header already."""
    try:
        fd = open_attempt_log(layout, attempt, rank, header=None if rank == 0 else "")
    except OSError as exc:  # the output goes where the launcher sends it, as before
        logger.warning("rank %d's output of attempt %d not captured in %s: %s", rank, attempt, layout.logs, exc)
        return
    _flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    _line_buffered((True, True))


def launched_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank as its launcher says it, in the order of
    :func:`~resilient_flows.training._distributed.read_launch_env` (which imports torch: a rank's
    output is redirected before that); 0 where none says it or it is no number."""
    env = os.environ if env is None else env
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PALS_RANKID", "PMI_RANK", "SLURM_PROCID"):
        if name in env:
            return int(env[name]) if env[name].isdigit() else 0
    return 0


@contextlib.contextmanager
def _redirected(fd: int) -> Iterator[None]:
    _flush()  # what the worker printed before belongs where it was going
    saved = os.dup(1), os.dup(2)
    buffered = _line_buffered((True, True))
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        _flush()  # what the attempt printed belongs to its own file
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        _line_buffered(buffered)


def _write_ending(fd: int, exc: BaseException) -> None:
    """How the attempt ended, written to its log: the traceback of an error, one line for a stop."""
    _flush()
    if isinstance(exc, Preempted):
        text = f"{exc}\n"
    else:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:  # from where it was raised
            tb = tb.tb_next
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    with contextlib.suppress(OSError):  # a full file system: the runner still reports the error
        os.write(fd, text.encode(errors="replace"))


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, or replaced by something without flush
            stream.flush()


def _line_buffered(on: tuple[bool, bool]) -> tuple[bool, bool]:
    """Make Python's stdout and stderr line buffered (or not), each; whether each was before."""
    out, err = sys.stdout, sys.stderr
    before = bool(getattr(out, "line_buffering", False)), bool(getattr(err, "line_buffering", False))
    _reconfigure(out, on[0])
    _reconfigure(err, on[1])
    return before


def _reconfigure(stream: object, on: bool) -> None:
    """A stream that is no ``TextIOWrapper`` (a test's capture) is left as it is."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        with contextlib.suppress(Exception):  # closed, or a wrapper that refuses
            reconfigure(line_buffering=on)
