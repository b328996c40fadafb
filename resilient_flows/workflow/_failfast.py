"""Fail the tasks of a lost block at once, instead of when the interchange gives up on its pool.

Once the runner knows a block is lost (its pool gone, as its members saw; its tasks silent), it
holds and cancels it; but Parsl fails the tasks that ran there only when the interchange has
missed the pool's heartbeats for ``heartbeat_threshold`` seconds, and never when the pool's
heartbeat thread outlived the rest of it. Until then the members wait to be retried. Here the
runner fails each such task itself, with the ``ManagerLost`` that the interchange would send:
the retry handler takes it for the machine's fault (no retry charged) and Parsl retries the task
on a healthy block.

This relies on Parsl internals (2026.10.26), kept here until one module adapts Parsl:
``AppFuture.task_record["exec_fu"]``, ``["executor"]`` and ``["try_time_launched"]``, the
executor future of the task's current try, its executor's label and when the try was launched.
HTEX's result thread completes that future when the interchange reports the task (its own, later
report of the same loss, or a late result) and ends on a future completed twice; so the future is
first made to ignore a second completion, and whichever completion comes first wins.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import socket
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, InvalidStateError
from typing import Any

from parsl.executors.high_throughput.errors import ManagerLost

logger = logging.getLogger(__name__)


def fail_lost_tasks(
    executor: Any, block: str, futures: Mapping[str, Future], beats: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Fail, with ``ManagerLost``, the current try of each task in ``futures`` (by name) whose
    latest heartbeat in ``beats`` says it runs in ``block`` of ``executor``; the names failed."""
    failed = []
    for name in _in_block(block, beats):
        future = futures.get(name)
        record = getattr(future, "task_record", None)
        if future is None or future.done() or not isinstance(record, dict):
            continue
        exec_fu = record.get("exec_fu")
        if record.get("executor") != executor.label or not isinstance(exec_fu, Future) or exec_fu.done():
            continue
        if _earlier_try(beats[name], record):
            continue
        lost = ManagerLost(f"block-{block}".encode(), str(beats[name].get("host") or socket.gethostname()))
        _completed_once(exec_fu)
        exec_fu.set_exception(lost)
        if exec_fu.exception() is lost:  # else its result came in the meantime, and Parsl handles that
            failed.append(name)
    if failed:
        logger.info("failed the tasks of lost block %s of %s at once: %s", block, executor.label, ", ".join(failed))
    return failed


def _earlier_try(beat: Mapping[str, Any], record: dict[str, Any]) -> bool:
    """Whether ``beat`` is left by an attempt that started before the task's current try was
    launched: the attempt saw its pool gone, stopped and was retried before the runner looked, and
    the retry, sent elsewhere, must not be failed for it (two tries of one member would then run).
    A clock skew between the attempt's node and the runner can only make a lost try wait for the
    interchange's own report, never fail a try that was not lost."""
    started, launched = beat.get("started"), record.get("try_time_launched")
    if not isinstance(started, int | float) or not isinstance(launched, datetime.datetime):
        return False
    return started < launched.timestamp()


def _completed_once(future: Future) -> None:
    """Make ``future`` ignore any completion after its first, rather than raise."""
    for name in ("set_result", "set_exception"):
        method = getattr(future, name)

        def once(value: Any, _method: Any = method) -> None:
            with contextlib.suppress(InvalidStateError):
                _method(value)

        setattr(future, name, once)


def _in_block(block: str, beats: Mapping[str, Mapping[str, Any]]) -> Iterable[str]:
    return sorted(name for name, beat in beats.items() if beat.get("block") is not None and str(beat["block"]) == block)
