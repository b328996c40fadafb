"""What every member does at a step boundary, whichever loop it runs in: the pieces that
:class:`~resilient_flows.training.TrainContext` and the Lightning callback share, so that stop
semantics are written once.

- :class:`StopSignals`: SIGTERM and SIGUSR1 (a batch system's warning, or the launcher forwarding
  one) become a stop reason that the next step boundary honours, instead of ending the process.
- :func:`pending_request`: what this rank asks for at a boundary: a stop after a signal, or the
  runner's request (preempt, retire) that rank 0 reads from the member's directory.
- :func:`agreed_request`: the request of any rank, the same on every rank, so that all ranks
  stop at the same step.
- :func:`fire_faults`: injected faults, on the first attempt only, so that the retry shows the
  recovery.
- :func:`consume_request`: the runner's request is done with once the member stopped.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from resilient_flows.rundir import TaskLayout
from resilient_flows.training.contract import STOP_SIGNALS
from resilient_flows.training.control import read_stop_request
from resilient_flows.training.spec import FaultSpec

__all__ = ["Request", "StopSignals", "agreed_request", "consume_request", "fire_faults", "pending_request"]

logger = logging.getLogger(__name__)

#: A stop request: ``(action, reason)``, the action ``"preempt"`` or ``"retire"``.
Request = tuple[str, str]


class StopSignals:
    """SIGTERM and SIGUSR1 set :attr:`reason` while installed, on the main thread only (where
    Python delivers signals); elsewhere installing does nothing. Installs nest (a script's run
    holds them while its loop's context does too); the last :meth:`restore` puts back the
    handlers the first :meth:`install` replaced. Also a context manager."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._previous: dict[int, Any] = {}
        self._depth = 0

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if self._depth == 0:
            self._previous = {sig: signal.signal(sig, self._request_stop) for sig in STOP_SIGNALS}
        self._depth += 1

    def restore(self) -> None:
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._previous = {}

    def __enter__(self) -> StopSignals:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def _request_stop(self, signum: int, _frame: Any) -> None:
        self.reason = f"signal {signal.Signals(signum).name}"


def pending_request(stop_reason: str | None, look: bool, directory: Path | None) -> Request | None:
    """This rank's request at a boundary: a stop for ``stop_reason`` (a signal, the runner gone),
    else the runner's request in the member's ``directory`` when rank 0 ``look``s (its
    :class:`~resilient_flows.training.control.RequestWatch` says the directory may hold one)."""
    if stop_reason is not None:
        return ("preempt", stop_reason)
    return read_stop_request(directory) if look and directory is not None else None


def agreed_request(request: Request | None, allgather: Callable[[Any], list[Any]] | None) -> Request | None:
    """The first request any rank has (``allgather`` over the member's ranks; None on one rank),
    the same on every rank: all stop at the same step, or none does."""
    if allgather is None:
        return request
    return next((r for r in allgather(request) if r is not None), None)


def fire_faults(
    faults: Iterable[FaultSpec], step: int, attempt: int, member: str, before: Callable[[], None] | None = None
) -> None:
    """Fire the faults injected at ``step``, on the first attempt only; ``before`` runs first (a
    flush of the metrics, so that the steps up to the fault are on disk)."""
    for fault in faults:
        if fault.at_step != step or attempt != 1:
            continue
        logger.warning("member %s: injecting fault %s at step %d", member, fault.kind, step)
        if before is not None:
            before()
        fault.fire(f"member {member} at step {step}")


def consume_request(directory: Path) -> None:
    """The member stopped as the runner asked: its request is done with."""
    with contextlib.suppress(FileNotFoundError):
        TaskLayout(directory).control.unlink()
