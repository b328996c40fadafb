"""The event log: the one record of what happened in a run, appended by the runner and by members.

Every line is one JSON object written with a single ``write`` on an ``O_APPEND`` descriptor, so
lines from concurrent writers (workers on several nodes, the runner) interleave but never tear on
POSIX and Lustre file systems. ``status``, ``resume`` and the report are computed from it alone.

A full file system (or quota) is waited out for a while, not turned into a crash: it passes (a
purge, another job ending), and a member or runner that dies of it loses more than it waits. A
writer waits for room *before* it writes: a file system that fills up mid-line takes part of the
line, and a writer killed before it could add the rest would leave a torn line that the next
writer's line is glued to. Only writers racing for the last free block can still split a line;
the rest follows once there is room.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from resilient_flows.capped import LINE_CAP, CappedLines
from resilient_flows.errors import is_storage_full
from resilient_flows.rundir import run_layout

__all__ = ["EVENT_KINDS", "FULL_WAIT_S", "EventLog", "EventTail", "MetricsLog", "read_events"]

logger = logging.getLogger(__name__)

#: How long an event waits for space on a full file system before the error is raised.
FULL_WAIT_S = 60.0

#: What a line's ``kind`` may be, in the order a member usually goes through them.
EVENT_KINDS = (
    "submitted",
    "started",
    "resumed",
    "checkpointed",
    "tuned",
    "failed",
    "lost",
    "retried",
    "preempted",
    "finished",
    "warning",
    "analytics_started",
    "analytics",
    "ondemand",
    "clone_requested",
    "forked",
    "cloned",
    "retired",
    "exploited",
    "stage_started",
    "stage_finished",
)


class EventLog:
    """Appends events to the run's event log; cheap to construct in every worker."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = run_layout(run_dir).events

    def emit(self, kind: str, member: str | None = None, **fields: Any) -> None:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}; one of {', '.join(EVENT_KINDS)}")
        record = {"time": round(time.time(), 6), "kind": kind, "member": member, **fields}
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        deadline = time.monotonic() + FULL_WAIT_S
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            while not _has_room(fd, len(line)) and time.monotonic() < deadline:
                time.sleep(0.5)
            while line:
                try:
                    line = line[os.write(fd, line) :]  # a full file system may take part of it
                except OSError as exc:
                    if not is_storage_full(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        finally:
            os.close(fd)


def _has_room(fd: int, size: int) -> bool:
    """Whether the file system of ``fd`` has room for ``size`` more bytes and a block to spare
    (the line may start a block, the directory may need one). Quotas do not show here."""
    try:
        found = os.fstatvfs(fd)
    except OSError:
        return True  # cannot tell: let the write find out
    return found.f_bavail * found.f_frsize >= size + found.f_frsize


class MetricsLog:
    """Appends a member's per-step metrics lines to its metrics log, in batches.

    A write per step costs a short step (0.3 ms) several percent; lines are therefore held here
    and written at most every ``FLUSH_S`` (the runner's view of progress lags by up to that) and at
    every ``flush`` (before each checkpoint), each batch in one ``write`` on an ``O_APPEND``
    descriptor. A killed member thus never leaves a torn line, and every step up to its newest
    checkpoint is on disk; steps after it are logged again by the resumed attempt.
    """

    FLUSH_S = 0.25

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lines: list[str] = []
        self._flushed = time.monotonic()
        self._fd: int | None = None
        self._unwritten = b""
        self._templates: dict[tuple[str, ...], str] = {}

    def append(self, record: dict[str, int | float]) -> None:
        """One step's numbers; formatted through a template per key set, as ``json.dumps`` would write them."""
        values = tuple(record.values())
        if all(map(math.isfinite, values)):
            keys = tuple(record)
            template = self._templates.get(keys)
            if template is None:
                fields = ", ".join(json.dumps(key).replace("%", "%%") + ": %r" for key in keys)
                template = self._templates[keys] = "{" + fields + "}\n"
            self._lines.append(template % values)
        else:  # NaN and infinities as json writes them
            self._lines.append(json.dumps(record) + "\n")
        if time.monotonic() - self._flushed >= self.FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Write the held lines. On a full file system they are kept, whatever part got in is cut
        back, and the next flush writes them again: a line is never torn, only late."""
        self._flushed = time.monotonic()
        if not self._lines and not self._unwritten:
            return
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        data, self._lines = self._unwritten + "".join(self._lines).encode(), []
        size = os.fstat(self._fd).st_size
        try:
            rest = data
            while rest:
                rest = rest[os.write(self._fd, rest) :]
        except OSError as exc:
            if not is_storage_full(exc):
                raise
            # this file has no other writer: cut back the part of a line that got in, so that a kill
            # before the next flush leaves no torn line, and write all of it again later
            os.ftruncate(self._fd, size)
            logger.warning("%s: file system full, %d bytes of metrics held back", self.path, len(data))
            self._unwritten = data
            return
        self._unwritten = b""

    def close(self) -> None:
        self.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_events(run_dir: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The events of a run in file order; a torn last line (a writer killed mid-write) is skipped,
    and so is a line over :data:`~resilient_flows.capped.LINE_CAP`, with a warning."""
    for raw in CappedLines(run_layout(run_dir).events, LINE_CAP, "event log"):
        record = _parse(raw)
        if record is not None:
            yield record


class EventTail:
    """Follows the event log: each :meth:`new` returns only the complete lines appended since the
    last, so that a runner polling a long run does not parse its whole history every time."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = run_layout(run_dir).events
        self._offset = 0

    def new(self) -> list[dict[str, Any]]:
        """The events of the complete lines appended since the last call; a line still being
        written waits for the next call."""
        lines = CappedLines(self.path, LINE_CAP, "event log", self._offset)
        found = [record for raw in lines if (record := _parse(raw)) is not None]
        self._offset = lines.offset
        return found


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and "kind" in record else None
