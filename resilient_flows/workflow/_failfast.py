"""Fail the tasks of a lost block at once, instead of when the interchange gives up on its pool.

Once the runner knows a block is lost (its pool gone, as its members saw; its tasks silent), it
holds and cancels it; but Parsl fails the tasks that ran there only when the interchange has
missed the pool's heartbeats for ``heartbeat_threshold`` seconds, and never when the pool's
heartbeat thread outlived the rest of it. Until then the members wait to be retried. Here the
runner fails each such task itself, with the ``ManagerLost`` that the interchange would send:
the retry handler takes it for the machine's fault (no retry charged) and Parsl retries the task
on a healthy block.

A task's current try, and failing it from outside its executor, rely on Parsl's internals:
:func:`~resilient_flows.sites._parsl.current_try` and :func:`~resilient_flows.sites._parsl.fail_try`
do it (whichever completion of the try comes first, this one or the interchange's, wins).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from parsl.executors.high_throughput.errors import ManagerLost

from resilient_flows.sites._parsl import CurrentTry, current_try, fail_try

logger = logging.getLogger(__name__)


def fail_lost_tasks(
    executor: Any, block: str, futures: Mapping[str, Future], beats: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Fail, with ``ManagerLost``, the current try of each task in ``futures`` (by name) whose
    latest heartbeat in ``beats`` says it runs in ``block`` of ``executor``; the names failed."""
    failed = []
    for name in _in_block(block, beats):
        future = futures.get(name)
        attempt = None if future is None or future.done() else current_try(future)
        if attempt is None or attempt.executor != executor.label or attempt.future.done():
            continue
        if _earlier_try(beats[name], attempt):
            continue
        lost = ManagerLost(f"block-{block}".encode(), str(beats[name].get("host") or socket.gethostname()))
        if fail_try(attempt, lost):  # else its result came in the meantime, and Parsl handles that
            failed.append(name)
    if failed:
        logger.info("failed the tasks of lost block %s of %s at once: %s", block, executor.label, ", ".join(failed))
    return failed


def _earlier_try(beat: Mapping[str, Any], attempt: CurrentTry) -> bool:
    """Whether ``beat`` is left by an attempt that started before the task's current try was
    launched: the attempt saw its pool gone, stopped and was retried before the runner looked, and
    the retry, sent elsewhere, must not be failed for it (two tries of one member would then run).
    A clock skew between the attempt's node and the runner can only make a lost try wait for the
    interchange's own report, never fail a try that was not lost."""
    started = beat.get("started")
    if not isinstance(started, int | float) or attempt.launched is None:
        return False
    return started < attempt.launched.timestamp()


def _in_block(block: str, beats: Mapping[str, Mapping[str, Any]]) -> Iterable[str]:
    return sorted(name for name, beat in beats.items() if beat.get("block") is not None and str(beat["block"]) == block)
