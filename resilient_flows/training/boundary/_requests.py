"""What a rank asks for at a step boundary, and the faults a workflow injects there."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from resilient_flows.rundir import TaskLayout
from resilient_flows.rundir._control import read_stop_request
from resilient_flows.training._spec import FaultSpec

logger = logging.getLogger(__name__)

#: A stop request: ``(action, reason)``, the action ``"preempt"`` or ``"retire"``.
Request = tuple[str, str]


def pending_request(stop_reason: str | None, look: bool, directory: Path | None) -> Request | None:
    """This rank's request at a boundary: a stop for ``stop_reason`` (a signal, the runner gone),
    else the runner's request in the member's ``directory`` when rank 0 ``look``s (its
    :class:`~resilient_flows.rundir._control.RequestWatch` says the directory may hold one)."""
    if stop_reason is not None:
        return ("preempt", stop_reason)
    return read_stop_request(directory) if look and directory is not None else None


def fire_faults(
    faults: Iterable[FaultSpec], step: int, attempt: int, member: str, before: Callable[[], None] | None = None
) -> None:
    """Fire the faults injected at ``step``, on the first attempt only, so that the retry shows
    the recovery; ``before`` runs first (a flush of the metrics, so that the steps up to the
    fault are on disk)."""
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
