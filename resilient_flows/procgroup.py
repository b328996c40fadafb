"""Processes by id: whether one still runs, and killing a process group for good (what a command
member leaves behind, a local block's workers).

Kept free of torch and Parsl: the runner, a member's launcher and the checkpoint engine use it.
"""

from __future__ import annotations

import contextlib
import os
import signal

__all__ = ["kill_group", "process_runs"]


def process_runs(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs: a zombie has ended, and a process of
    another user's still runs (its id may be recycled: a caller errs towards leaving things be)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read()
    except OSError:
        return False
    return fields[fields.rfind(b")") + 2 :][:1] != b"Z"


def kill_group(group: int) -> None:
    """SIGKILL every process of ``group``; a group that is gone already, or whose processes are no
    longer this user's (its ids recycled), is left alone: there is nothing of ours left to stop."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
