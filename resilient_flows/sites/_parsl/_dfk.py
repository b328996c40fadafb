"""What the runner relies on inside Parsl's DataFlowKernel: task records, its shutdown, its logs
(see the package's docstring).

A retry handler is given the task's record (``parsl.dataflow.taskrecord.TaskRecord``) to judge
the failure: reading it is Parsl's interface. Changing what the retry runs with (its keyword
arguments, its priority), failing a task's current try from outside the executor, and finding
the log files Parsl attached are not: each is one function here.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DFK_LOGGER",
    "CurrentTry",
    "close_parsl_logs",
    "current_try",
    "fail_try",
    "parsl_file_logs",
    "quiet_when_full",
    "retry_with_kwarg",
    "retry_with_priority",
    "shutdown_started",
    "start_initial_blocks",
]

#: The logger Parsl's DataFlowKernel logs each task's failure to.
DFK_LOGGER = "parsl.dataflow.dflow"
#: The loggers Parsl attaches its log files to.
_FILE_LOGGERS = ("parsl", "concurrent.futures")


@dataclass(frozen=True)
class CurrentTry:
    """A task's current try: the executor's future of it (``task_record["exec_fu"]``), its
    executor's label and when it was launched (None where the record does not say)."""

    future: Future
    executor: str | None
    launched: datetime.datetime | None


def current_try(future: Any) -> CurrentTry | None:
    """The current try of the task behind the app future ``future`` (its ``task_record``); None
    when it has no executor future yet."""
    record = getattr(future, "task_record", None)
    if not isinstance(record, dict):
        return None
    exec_fu, label, launched = record.get("exec_fu"), record.get("executor"), record.get("try_time_launched")
    if not isinstance(exec_fu, Future):
        return None
    return CurrentTry(
        exec_fu,
        label if isinstance(label, str) else None,
        launched if isinstance(launched, datetime.datetime) else None,
    )


def fail_try(attempt: CurrentTry, error: BaseException) -> bool:
    """Fail the try with ``error``, as the executor would; whether ``error`` is its outcome (else a
    result or another error came first). HTEX's result thread completes the same future when the
    interchange reports the task later, and ends on a future completed twice: the future is first
    made to ignore any completion after its first."""
    _completed_once(attempt.future)
    attempt.future.set_exception(error)
    return attempt.future.exception() is error


def _completed_once(future: Future) -> None:
    """Make ``future`` ignore any completion after its first, rather than raise."""
    for name in ("set_result", "set_exception"):
        method = getattr(future, name)

        def once(value: Any, _method: Any = method) -> None:
            with contextlib.suppress(InvalidStateError):
                _method(value)

        setattr(future, name, once)


def retry_with_kwarg(task_record: dict[str, Any], name: str, value: Any) -> bool:
    """Have the task's next try called with the keyword argument ``name=value``: the DataFlowKernel
    launches a retry with the record's ``kwargs``. False when the record holds none."""
    kwargs = task_record.get("kwargs")
    if not isinstance(kwargs, dict):
        return False
    kwargs[name] = value
    return True


def retry_with_priority(task_record: dict[str, Any], priority: int) -> None:
    """Have the task's next try sent at ``priority`` (HTEX's queue order, lower first): the
    DataFlowKernel launches a retry with the record's ``resource_specification``."""
    task_record["resource_specification"] = {**(task_record.get("resource_specification") or {}), "priority": priority}


def start_initial_blocks(dfk: Any) -> None:
    """Have a new DataFlowKernel submit its executors' initial blocks now.

    Parsl submits them at its job status poller's first scaling pass after the executors were
    added; the poller makes a pass as it starts, before they are, so the blocks waited a whole
    ``strategy_period`` (5 s by default) at every start. The poller's passes (its ``callback``,
    made by ``make_callback``) are made to take one lock, and one is made now: two passes never
    scale out together.
    """
    poller = dfk.job_status_poller
    passes, lock = poller.callback, threading.Lock()

    def one_pass(*args: Any) -> None:
        with lock:
            passes(*args)

    poller.callback = one_pass
    poller.make_callback()  # as the poller's thread makes it: a failure is logged, as Parsl logs its own


def shutdown_started(dfk: Any) -> bool:
    """Whether the DataFlowKernel's shutdown (``cleanup``) was called: it refuses a second one."""
    return bool(getattr(dfk, "cleanup_called", False))


def parsl_file_logs(directory: str) -> list[logging.FileHandler]:
    """The log files Parsl keeps open under ``directory``. Its shutdown detaches them but leaves
    them open, and an instance that failed to start keeps them attached: one more open file, and
    one more copy of every later log line, per Parsl instance of a run."""
    root = str(Path(directory).resolve())
    handlers = logging.getLogger("parsl").handlers
    return [h for h in handlers if isinstance(h, logging.FileHandler) and h.baseFilename.startswith(root)]


def quiet_when_full(handlers: list[logging.FileHandler], full: Callable[[BaseException], bool]) -> None:
    """Have ``handlers`` drop the lines a full file system refuses (``full`` says which errors
    are that), instead of printing a traceback for each to the runner's terminal: a run rides out
    a full shared tier, and Parsl logs many lines a second meanwhile. Any other error is
    reported as logging reports it."""
    for handler in handlers:
        report = handler.handleError

        def handle(record: logging.LogRecord, _report: Callable[[logging.LogRecord], None] = report) -> None:
            error = sys.exc_info()[1]
            if error is None or not full(error):
                _report(record)

        handler.handleError = handle  # type: ignore[method-assign]


def close_parsl_logs(handlers: list[logging.FileHandler]) -> None:
    """Detach ``handlers`` from the loggers Parsl attaches them to, and close them."""
    for handler in handlers:
        for name in _FILE_LOGGERS:
            logging.getLogger(name).removeHandler(handler)
        with contextlib.suppress(OSError):  # its last lines cannot be flushed to a full disk
            handler.close()
