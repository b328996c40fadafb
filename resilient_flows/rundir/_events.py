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
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from resilient_flows.capped import LINE_CAP, CappedLines, parse_json
from resilient_flows.errors import is_storage_full
from resilient_flows.rundir._damage import DamageLog
from resilient_flows.rundir._layout import run_layout

#: How long an event waits for space on a full file system before the error is raised.
FULL_WAIT_S = 60.0
#: Seconds between two looks for space on a full file system: space that returns is used within
#: this (a look is one ``statvfs``), so that what waited for it (an event, a Parsl instance to
#: start again) goes on at once, not half a second later.
ROOM_LOOK_S = 0.1

#: What a line's ``kind`` may be, in the order a member usually goes through them.
EVENT_KINDS = (
    "submitted",
    "started",
    "declined",
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
    "block_started",
    "draining",
    "drained",
)

#: The ``warning`` field of a ``warning`` event from a member that trains without checkpoints
#: (see :mod:`resilient_flows.training.boundary._unsaved`), which ``status`` shows as a note.
NO_CHECKPOINT = "no_checkpoint"


class EventLog:
    """Appends events to the run's event log; cheap to construct in every worker.

    The first event creates the run directory when there is none yet: a plain Parsl script hands
    its apps a run directory that nothing has made, and the first to write to it may be a retry
    handler recording that the task failed before it could make it.
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = run_layout(run_dir).events

    def emit(self, kind: str, member: str | None = None, **fields: Any) -> None:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}; one of {', '.join(EVENT_KINDS)}")
        record = {"time": round(time.time(), 6), "kind": kind, "member": member, **fields}
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        deadline = time.monotonic() + FULL_WAIT_S
        fd = self._open()
        try:
            while not _has_room(os.fstatvfs, fd, len(line)) and time.monotonic() < deadline:
                time.sleep(ROOM_LOOK_S)
            while line:
                try:
                    line = line[os.write(fd, line) :]  # a full file system may take part of it
                except OSError as exc:
                    if not is_storage_full(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(ROOM_LOOK_S)
        finally:
            os.close(fd)

    def _open(self) -> int:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        try:
            return os.open(self.path, flags, 0o644)
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, flags, 0o644)


def wait_for_room(path: str | os.PathLike, size: int, deadline: float) -> bool:
    """Wait until the file system of ``path`` has room for ``size`` more bytes, or until the
    ``time.monotonic()`` ``deadline``; whether it has. For writers that cannot look at a
    descriptor first: those that failed on a full file system and try again once it has room. A
    ``path`` not made yet is looked at through its nearest existing parent, on the same file system
    as far as this can tell (a look at a missing path would see room, and not wait)."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    while not _has_room(os.statvfs, where, size):
        if time.monotonic() >= deadline:
            return False
        time.sleep(ROOM_LOOK_S)
    return True


def _has_room(look: Callable[[Any], os.statvfs_result], where: Any, size: int) -> bool:
    """Whether the file system that ``look`` finds for ``where`` (a descriptor or a path) has room
    for ``size`` more bytes and a block to spare (the line may start a block, the directory may
    need one). Quotas do not show here."""
    try:
        found = look(where)
    except OSError:
        return True  # cannot tell: let the write find out
    return found.f_bavail * found.f_frsize >= size + found.f_frsize


#: Fields every reader of the log may convert with ``float``/``int`` where an event has them.
_NUMBERS = ("time", "step", "attempt")

#: Of those, the ones that may be null: unknown (a block the watchdog found silent has no attempt
#: of its own, nor has a retry waiting out its backoff). Readers take null for unknown; a field its
#: kind always has (:data:`_REQUIRED`) is never null.
_NULLABLE = ("attempt",)

#: Fields an event of a kind always has, which its readers index without looking.
_REQUIRED = {
    "checkpointed": ("step",),
    "resumed": ("step",),
    "preempted": ("step",),
    "stage_started": ("attempt", "time"),
    "stage_finished": ("time",),
    "analytics_started": ("request", "time"),
    "analytics": ("request",),
}


def read_events(run_dir: str | os.PathLike, damage: DamageLog | None = None) -> Iterator[dict[str, Any]]:
    """The events of a run in file order; a torn last line (a writer killed mid-write) is left
    out, and so is a damaged line (see :func:`event_problem`) or one over
    :data:`~resilient_flows.capped.LINE_CAP`: recorded in ``damage`` when given, else an oversized
    line is logged and a damaged one passed over."""
    path = run_layout(run_dir).events
    lines = _lines(path, 0, 0, damage)
    for raw in lines:
        record = _parse(raw, path, lines.line, damage)
        if record is not None:
            yield record


class EventTail:
    """Follows the event log: each :meth:`new` returns only the complete lines appended since the
    last, so that a runner polling a long run does not parse its whole history every time.
    ``damage``: where its damaged lines are recorded (see :func:`read_events`)."""

    def __init__(self, run_dir: str | os.PathLike, damage: DamageLog | None = None) -> None:
        self.path = run_layout(run_dir).events
        self.damage = damage
        self._offset = 0
        self._line = 0

    def new(self) -> list[dict[str, Any]]:
        """The events of the complete lines appended since the last call; a line still being
        written waits for the next call."""
        lines = _lines(self.path, self._offset, self._line, self.damage)
        found = [record for raw in lines if (record := _parse(raw, self.path, lines.line, self.damage)) is not None]
        self._offset, self._line = lines.offset, lines.line
        return found


def event_problem(record: Any) -> str | None:
    """What is wrong with a parsed line, or None for an event: an object with a ``kind``, a
    ``member`` that is a name or null, numbers where readers convert them (an ``attempt`` may be
    null: unknown), and the fields its kind always has. Such a line was not written by
    :meth:`EventLog.emit`."""
    if not isinstance(record, dict):
        return f"not a JSON object (a {type(record).__name__})"
    if not isinstance(record.get("kind"), str):
        return "no kind"
    if not isinstance(record.get("member"), (str, type(None))):
        return "its member is not a name"
    kind = record["kind"]
    required = _REQUIRED.get(kind, ())
    for name in required:
        if name not in record:
            return f"a {kind} event without {name}"
    for name in _NUMBERS:
        if name not in record or _finite(record[name]):
            continue
        if record[name] is None and name in _NULLABLE and name not in required:
            continue
        return f"its {name} is not a number"
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _lines(path: Path, offset: int, line: int, damage: DamageLog | None) -> CappedLines:
    if damage is None:
        return CappedLines(path, LINE_CAP, "event log", offset, line)
    return CappedLines(
        path,
        LINE_CAP,
        "event log",
        offset,
        line,
        oversized=lambda number, why: damage.line(path, number, why),
        refused=lambda why: damage.file(path, why),
    )


def _parse(raw: bytes, path: Path, number: int, damage: DamageLog | None) -> dict[str, Any] | None:
    try:
        record = parse_json(raw)
    except ValueError as exc:  # UnicodeDecodeError too
        problem: str | None = f"not JSON ({exc})"
    else:
        problem = event_problem(record)
    if problem is None:
        return record
    if damage is not None:
        damage.line(path, number, problem)
    return None
