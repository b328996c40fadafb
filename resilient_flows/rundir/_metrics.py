"""A member's metrics log: a line per step, appended in batches and never torn
(:class:`MetricsLog`), followed by the views without parsing every line (:class:`MetricsReader`).

Its place in the run directory is :attr:`~resilient_flows.rundir._layout.TaskLayout.metrics`.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, BinaryIO

from resilient_flows.capped import LINE_CAP, CappedLines, open_regular, parse_json, unfinished_over_cap
from resilient_flows.errors import DamagedFileError, is_storage_full
from resilient_flows.rundir._damage import DamageLog

logger = logging.getLogger(__name__)


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


#: Bytes read from the end of a metrics file to find its newest line; doubled until one fits,
#: or until a line that long would be over the line cap.
_TAIL_BYTES = 4096


class MetricsReader:
    """Follows a member's metrics log: the loss curve with later attempts replacing redone steps.

    ``curve`` maps step -> loss as the final model saw it; ``attempt_spans`` maps each attempt to
    the (first, last) step it logged, which is where the report marks failures and resumes;
    ``attempt_times`` to the (first, last) times it logged, from which its pace follows. ``last``
    is the newest line.

    A runner follows every running member twice a second while each logs a line per step: it
    cannot afford to parse them all. :meth:`update` parses the first and last of the lines that
    arrived (all of them only when those two belong to different attempts), which keeps ``last``,
    the spans and the times exact while one attempt writes at a time; the curve is read when a
    view asks (:meth:`read_curve`), or sampled for a plot (:meth:`sampled_curve`).

    A damaged line (see :func:`metrics_problem`) or one over the line cap is passed over, and
    recorded in ``damage`` when one is given: only among the lines parsed, so a view that reads
    the newest line says nothing of a damaged line in the middle, which it did not need.
    """

    def __init__(self, path: Path, damage: DamageLog | None = None) -> None:
        self.path = path
        self.damage = damage
        self.curve: dict[int, float] = {}
        self.attempt_spans: dict[int, tuple[int, int]] = {}
        self.attempt_times: dict[int, tuple[float, float]] = {}
        self.last: dict[str, Any] | None = None
        self._followed = (0, 0)  # bytes and lines :meth:`update` has seen
        self._curved = (0, 0)  # bytes and lines :meth:`read_curve` has seen

    def update(self) -> None:
        """Take in the complete lines appended since the last update (the curve excepted)."""
        lines, self._followed = self._lines_after(self._followed)
        if not lines:
            return
        first, last = self._record(*lines[0]), self._record(*lines[-1])
        if first is not None and last is not None and _attempt(first) == _attempt(last):
            records = [first, last]
        else:
            records = [record for number, raw in lines if (record := self._record(number, raw)) is not None]
        for record in records:
            self._note(record)
        if records:
            self.last = records[-1]

    def read_curve(self) -> None:
        """Take in the loss of every line not read for the curve yet."""
        lines, self._curved = self._lines_after(self._curved)
        for number, raw in lines:
            record = self._record(number, raw)
            if record is None:
                continue
            if "loss" in record:
                self.curve[int(record["step"])] = float(record["loss"])
            self._note(record)
            if self._curved[0] >= self._followed[0]:
                self.last = record
        self._followed = max(self._followed, self._curved)

    def sampled_curve(self, points: int) -> dict[int, float]:
        """About ``points`` (step, loss) of the curve, evenly spread over the file's lines and
        including its newest, parsed without the rest: enough for a band over many members."""
        lines, _ = self._lines_after((0, 0))
        stride = max(1, len(lines) // max(1, points))
        curve: dict[int, float] = {}
        for number, raw in [*lines[::stride], *lines[-1:]]:
            record = self._record(number, raw)
            if record is not None and "loss" in record:
                curve[int(record["step"])] = float(record["loss"])
        return curve

    def _lines_after(self, seen: tuple[int, int]) -> tuple[list[tuple[int, bytes]], tuple[int, int]]:
        """The complete lines after the ``seen`` (bytes, lines), numbered, each within the line cap;
        the (bytes, lines) seen then."""
        offset, line = seen
        lines = CappedLines(self.path, LINE_CAP, "metrics log", offset, line, self._oversized, self._refused)
        numbered = [(lines.line, raw) for raw in lines]
        return numbered, (lines.offset, lines.line)

    def _oversized(self, number: int, problem: str) -> None:
        if self.damage is not None:
            self.damage.line(self.path, number, problem)

    def _refused(self, problem: str) -> None:
        """The log is not a regular file (see :func:`~resilient_flows.capped.open_regular`)."""
        if self.damage is not None:
            self.damage.file(self.path, problem)
        else:
            logger.warning("metrics log %s is %s; not read", self.path, problem)

    def _record(self, number: int, raw: bytes) -> dict[str, Any] | None:
        """Line ``number``, or None for a line that is damaged (then recorded)."""
        record, problem = _parse(raw)
        if problem is not None and self.damage is not None:
            self.damage.line(self.path, number, problem)
        return record

    def _note(self, record: dict[str, Any]) -> None:
        step, attempt = int(record["step"]), _attempt(record)
        first, last = self.attempt_spans.get(attempt, (step, step))
        self.attempt_spans[attempt] = (min(first, step), max(last, step))
        if "time" in record:
            when = float(record["time"])
            began, latest = self.attempt_times.get(attempt, (when, when))
            self.attempt_times[attempt] = (min(began, when), max(latest, when))

    def peek(self) -> None:
        """Set ``last`` to the newest complete line, reading the file's end only; the curve stays
        as it was (:meth:`read_curve` continues where it stopped). Damaged lines at the end are
        passed over, and numbered by counting the lines before them only then."""
        try:
            with open_regular(self.path, "metrics log") as f:
                size = f.seek(0, os.SEEK_END)
                want = _TAIL_BYTES
                while True:
                    start = max(0, size - want)
                    f.seek(start)
                    chunk = f.read(size - start)
                    lines = chunk[: chunk.rfind(b"\n") + 1].split(b"\n")[:-1]
                    if len(lines) > 1 or start == 0 or want > LINE_CAP:  # the first may be cut short
                        break
                    want *= 2
                unfinished = start + chunk.rfind(b"\n") + 1  # where the last line, not ended yet, begins (or before)
                if size - unfinished > LINE_CAP and self.damage is not None:
                    self.damage.line(self.path, _line_number(f, unfinished), unfinished_over_cap(LINE_CAP))
                begins = list(itertools.accumulate((len(raw) + 1 for raw in lines), initial=start))
                for index in reversed(range(0 if start == 0 else 1, len(lines))):
                    record, problem = _parse(lines[index])
                    if record is not None:
                        self.last = record
                        return
                    if self.damage is not None:
                        self.damage.line(self.path, _line_number(f, begins[index]), str(problem))
        except FileNotFoundError:
            return
        except DamagedFileError as exc:
            self._refused(exc.problem)


def _line_number(f: BinaryIO, offset: int) -> int:
    """The number of the line that starts at byte ``offset`` of ``f``: the newlines before it, plus one."""
    f.seek(0)
    count, left = 0, offset
    while left > 0 and (block := f.read(min(left, CappedLines.BLOCK))):
        count += block.count(b"\n")
        left -= len(block)
    return count + 1


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """A metrics line and None, or None and what is wrong with it."""
    try:
        record = parse_json(raw)
    except ValueError as exc:  # UnicodeDecodeError too
        return None, f"not JSON ({exc})"
    problem = metrics_problem(record)
    return (record, None) if problem is None else (None, problem)


def metrics_problem(record: Any) -> str | None:
    """What is wrong with a parsed metrics line, or None: an object with a number ``step``, and a
    number wherever it has a ``loss`` (NaN and infinities too), ``time`` or ``attempt``."""
    if not isinstance(record, dict):
        return f"not a JSON object (a {type(record).__name__})"
    if "step" not in record:
        return "no step"
    for name in ("step", "time", "attempt", "loss"):
        value = record.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"its {name} is not a number"
        if name != "loss" and not math.isfinite(value):
            return f"its {name} is not finite"
    return None


def _attempt(record: dict[str, Any]) -> int:
    return int(record.get("attempt", 1))
