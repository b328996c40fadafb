"""How an attempt of a member on several ranks failed, as its ranks saw it: its own error, or a peer gone.

When the node of one rank dies, the launcher (``srun``, ``mpiexec``) reports only an exit status,
the same as for a bug in the member: the retry handler could not tell the machine's fault from the
member's. The ranks can: a rank whose collective fails because its peer's connection closed or
reset saw a peer rank gone; a rank that raised anything else failed on its own. Each failing rank
records what it saw in the member's ``fault.json`` before it exits, and the retry handler reads it
for the attempt that just failed (:func:`attempt_fault`).

A rank's own error wins: a rank that raises its own error exits, and only then do its peers see
its connection close, so a peer never overwrites the record of the attempt's real error.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from typing import Any

from resilient_flows.rundir import TaskLayout
from resilient_flows.rundir._block import current_block

#: :func:`attempt_fault`'s kinds: a peer rank gone, the attempt's worker pool gone
#: (:mod:`resilient_flows.training._pool`), the rank's own error.
PEER_LOST = "peer-lost"
POOL_LOST = "pool-lost"
OWN_ERROR = "error"

#: What the collectives' transports say when the process at the other end is gone (gloo, NCCL, MPI).
_PEER_GONE = (
    "connection closed by peer",
    "connection reset by peer",
    "remote process exited",
    "broken pipe",
    "ncclremoteerror",
    "mpi_err_proc_failed",
)


def peer_gone(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from or while handling) says a peer rank's
    process or connection is gone."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = f"{type(current).__name__}: {current}".lower()
        if isinstance(current, (ConnectionResetError, BrokenPipeError)) or any(p in text for p in _PEER_GONE):
            return True
        current = current.__cause__ or current.__context__
    return False


def record_fault(directory: Path, rank: int | None, exc: BaseException) -> None:
    """Record how this rank's attempt failed, in the member's directory. Never raises: the rank's
    own error is what must come through."""
    layout = TaskLayout(directory)
    with contextlib.suppress(OSError, ValueError):
        attempt = layout.read_attempts()
        kind = PEER_LOST if peer_gone(exc) else OWN_ERROR
        if kind == PEER_LOST and attempt_fault(directory, attempt) is not None:
            return  # a rank recorded the attempt's failure first: its own error, or the same loss
        layout.write_fault(
            {
                "attempt": attempt,
                "kind": kind,
                "rank": rank,
                "host": socket.gethostname(),
                "block": current_block(),
                "reason": f"{type(exc).__name__}: {exc}"[:400],
                "time": round(time.time(), 3),
            }
        )


def record_silent_peer(directory: Path, rank: int | None, host: str, reason: str) -> None:
    """Record that the node ``host`` of a peer rank stopped answering (see
    :mod:`resilient_flows.training._peerwatch`): a ``peer-lost`` fault whose ``silent_hosts`` the
    node watcher records as lost. A record of the attempt's failure already there wins. Never raises."""
    layout = TaskLayout(directory)
    with contextlib.suppress(OSError, ValueError):
        attempt = layout.read_attempts()
        if attempt_fault(directory, attempt) is not None:
            return
        layout.write_fault(
            {
                "attempt": attempt,
                "kind": PEER_LOST,
                "rank": rank,
                "host": socket.gethostname(),
                "block": current_block(),
                "reason": reason[:400],
                "silent_hosts": [host],
                "time": round(time.time(), 3),
            }
        )


def record_pool_lost(directory: Path, reason: str) -> None:
    """Record that the attempt's worker pool is gone (the attempt stops, and its end is the
    machine's fault whatever error it then reports). Never raises."""
    layout = TaskLayout(directory)
    with contextlib.suppress(OSError, ValueError):
        _write_pool_lost(layout, layout.read_attempts(), socket.gethostname(), current_block(), reason)


def record_pool_seen_lost(directory: Path, attempt: int, host: str, block: str, reason: str) -> None:
    """Record, for attempt ``attempt`` (which ran in ``block`` on ``host``), that the runner saw its
    worker pool gone: the attempt may have died with its pool before it could look and say so.
    A record of the attempt's failure already there wins. Never raises."""
    layout = TaskLayout(directory)
    with contextlib.suppress(OSError, ValueError):
        if layout.read_attempts() == attempt and attempt_fault(directory, attempt) is None:
            _write_pool_lost(layout, attempt, host, block, reason)


def _write_pool_lost(layout: TaskLayout, attempt: int, host: str, block: str | None, reason: str) -> None:
    layout.write_fault(
        {
            "attempt": attempt,
            "kind": POOL_LOST,
            "rank": 0,
            "host": host,
            "block": block,
            "reason": reason[:400],
            "time": round(time.time(), 3),
        }
    )


def attempt_fault(directory: Path, attempt: int | None = None) -> dict[str, Any] | None:
    """The record of how the member's attempt ``attempt`` failed (default: its latest attempt);
    None when no rank recorded one for it."""
    layout = TaskLayout(directory)
    try:
        record = layout.read_fault()
        current = layout.read_attempts() if attempt is None else attempt
    except (OSError, ValueError):
        return None
    if (
        not isinstance(record, dict)
        or record.get("attempt") != current
        or record.get("kind") not in (PEER_LOST, POOL_LOST, OWN_ERROR)
    ):
        return None
    return record
