"""Killing a process group for good: what a command member leaves behind, a local block's workers.

Kept free of torch and Parsl: the runner and a member's launcher both use it.
"""

from __future__ import annotations

import contextlib
import os
import signal

__all__ = ["kill_group"]


def kill_group(group: int) -> None:
    """SIGKILL every process of ``group``; a group that is gone already, or whose processes are no
    longer this user's (its ids recycled), is left alone: there is nothing of ours left to stop."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
