"""``events.jsonl``: the one record of what happened in a run, appended by the runner and by members.

Every line is one JSON object written with a single ``write`` on an ``O_APPEND`` descriptor, so
lines from concurrent writers (workers on several nodes, the runner) interleave but never tear on
POSIX and Lustre file systems. ``status``, ``resume`` and the report are computed from it alone.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["EVENT_KINDS", "EventLog", "read_events"]

#: What a line's ``kind`` may be, in the order a member usually goes through them.
EVENT_KINDS = (
    "submitted",
    "started",
    "resumed",
    "checkpointed",
    "tuned",
    "failed",
    "retried",
    "preempted",
    "finished",
    "analytics_started",
    "analytics",
    "ondemand",
    "clone_requested",
    "forked",
    "cloned",
    "retired",
    "exploited",
)


class EventLog:
    """Appends events to ``<run_dir>/events.jsonl``; cheap to construct in every worker."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / "events.jsonl"

    def emit(self, kind: str, member: str | None = None, **fields: Any) -> None:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}; one of {', '.join(EVENT_KINDS)}")
        record = {"time": round(time.time(), 6), "kind": kind, "member": member, **fields}
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def read_events(run_dir: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The events of a run in file order; a torn last line (a writer killed mid-write) is skipped."""
    path = Path(run_dir) / "events.jsonl"
    if not path.exists():
        return
    with path.open("rb") as f:
        for raw in f:
            try:
                record = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "kind" in record:
                yield record
