"""The control channel to a running member: requests it reads at step boundaries.

Parsl cannot signal a running task, and a batch job's processes may sit on any node; a file in
the member's directory on the shared file system reaches it wherever it runs. Two requests,
read at step boundaries:

- the control request (:attr:`TaskLayout.control`): stop after committing a checkpoint
  (preemption), consumed by the member; it may also say ``retire``: commit a checkpoint and
  finish now (an exploration campaign replaced the member);
- a clone order (:meth:`TaskLayout.clone_order`): fork into the named clones at the next step
  boundary; the member renames it ``.forking`` while it hands its state over.

Both live in the member's directory itself, so that one ``stat`` of it per step (its mtime
moves when a request file appears) tells the member whether to look; it also looks once a
second, for file systems whose directory times lag behind (NFS attribute caching).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from resilient_flows.rundir._block import current_block
from resilient_flows.rundir._layout import TaskLayout, member_layout


def request_preemption(
    run_dir: str | os.PathLike, name: str, reason: str = "preemption requested", block: str | None = None
) -> Path:
    """Ask a running member to commit a checkpoint and stop after its current step.

    The member consumes the request and raises ``Preempted``; the retry handler requeues it
    without spending a retry. ``block``: only its attempt on that Parsl block is asked (the
    block's drain), never a later one on a fresh block.
    """
    return member_layout(run_dir, name).write_control("preempt", reason, block)


def request_retirement(run_dir: str | os.PathLike, name: str, reason: str) -> Path:
    """Ask a running member to commit a checkpoint and finish now, for good (an exploration
    campaign replaced it); unlike a preemption, nothing requeues it."""
    return member_layout(run_dir, name).write_control("retire", reason)


def read_stop_request(directory: Path) -> tuple[str, str] | None:
    """A pending ``(action, reason)``: ``preempt`` (stop, to be requeued) or ``retire`` (finish)."""
    try:
        request = TaskLayout(directory).read_control()
    except (OSError, ValueError):
        return None  # absent, being written (read again after the next step), or oversized: no request
    if not isinstance(request, dict) or request.get("block", current_block()) != current_block():
        return None  # meant for its attempt on a block it is no longer on
    if request.get("action") in ("preempt", "retire"):
        return str(request["action"]), str(request.get("reason", f"{request['action']} requested"))
    return None


@dataclass(frozen=True)
class CloneOrder:
    """Fork into ``clones`` (member names already registered in the run directory).

    ``at_step``: fork with the state after this step (or at the next step boundary if the member
    is already past it); None for the next step boundary.
    """

    request: str
    clones: tuple[str, ...]
    requested_at: float
    at_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CloneOrder:
        at_step = data.get("at_step")
        return cls(
            str(data["request"]),
            tuple(str(c) for c in data["clones"]),
            float(data["requested_at"]),
            None if at_step is None else int(at_step),
        )


def clone_order_path(directory: Path, request: str, suffix: str = ".json") -> Path:
    """Where an order for ``request`` lies in a member's directory (``.forking`` once being served)."""
    return TaskLayout(directory).clone_order(request, suffix)


def write_clone_order(run_dir: str | os.PathLike, source: str, order: CloneOrder) -> Path:
    return member_layout(run_dir, source).write_clone_order(order.request, order.to_dict())


def read_clone_orders(directory: Path) -> list[CloneOrder]:
    """Pending orders, oldest first; the member marks an order ``.forking`` when it serves it."""
    found = []
    layout = TaskLayout(directory)
    for path in layout.clone_orders():
        try:
            found.append(CloneOrder.from_dict(layout.read_clone_order(path)))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or oversized: no order
    return sorted(found, key=lambda o: o.requested_at)


class RequestWatch:
    """Tells a member, cheaply at every step, whether its directory may hold a new request.

    A request shows as a change of the directory's mtime; ``stat`` looks at most every
    ``STAT_GAP_S`` (a few microseconds a step matter on sub-millisecond steps, 20 ms of latency
    do not), and every ``FULL_LOOK_S`` the member reads its requests whatever the mtime says.
    """

    STAT_GAP_S = 0.02
    FULL_LOOK_S = 1.0

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._mtime = -1
        self._looked = 0.0
        self._statted = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._statted < self.STAT_GAP_S:
            return False
        self._statted = now
        try:
            mtime = os.stat(self.directory).st_mtime_ns
        except FileNotFoundError:
            return False
        if mtime != self._mtime or now - self._looked >= self.FULL_LOOK_S:
            self._mtime, self._looked = mtime, now
            return True
        return False
