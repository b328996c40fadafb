"""Loss curves for a page of a thousand members: a few hundred points each, never every line.

A member logs a line per step for hours; the dashboard draws each family's median and band, which
need a few hundred points per member, not millions. :class:`LossSampler` keeps the lines found at
evenly spaced byte positions of a member's metrics log, and its newest line, reading only those:
a long log is sampled by short reads at those positions, and what is appended later is taken in
from where the last look stopped. When the points grow past twice the budget every other one
goes and the spacing doubles, so the budget holds however long the run.

A later attempt redoes the steps after the checkpoint it resumed from: a line whose step is not
past the newest point drops the points from that step on, so the curve is the one the final
model saw (as :class:`~resilient_flows.rundir.MetricsReader` keeps it).

:func:`family_band` turns the members' points into a median and a 10-90 % band on one step grid.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from resilient_flows.capped import open_regular, parse_json
from resilient_flows.errors import DamagedFileError

#: Points a member's curve keeps (between this and twice this): a band's grid has fewer.
POINTS = 128
#: Sections of a log up to this many bytes are read whole; longer ones by a short read per point.
READ_WHOLE = 1 << 20
#: Bytes read around a sampled position to find the line there; longer lines are passed over.
WINDOW = 4096
#: Steps of a family's band grid.
BAND_STEPS = 160


@dataclass
class Point:
    """One sampled metrics line."""

    step: int
    loss: float | None
    time: float | None
    attempt: int


class LossSampler:
    """A member's sampled loss curve and newest metrics line, followed as its log grows."""

    def __init__(self, path: Path, points: int = POINTS) -> None:
        self.path = path
        self.budget = points
        self._reset()

    def _reset(self) -> None:
        self.points: list[Point] = []
        self.newest: Point | None = None
        self.attempt_began: dict[int, Point] = {}  # the first point seen of each attempt
        self.attempt_ended: dict[int, Point] = {}  # and its last
        self._offset = 0  # bytes taken in
        self._spacing = 0  # bytes between two kept lines; 0 until the first look
        self._target = 0  # the next line kept is the first that starts here or later

    def update(self) -> bool:
        """Take in what was appended since the last look; whether anything was. A log that is not
        a regular file has nothing to take in (the member's status records it as damage)."""
        try:
            with open_regular(self.path, "metrics log") as f:
                end = os.fstat(f.fileno()).st_size
                if end < self._offset:  # replaced by a shorter file: start again
                    self._reset()
                if end <= self._offset:
                    return False
                if self._spacing == 0:
                    self._spacing = max(1, end // self.budget)
                lines, self._target = _sampled_lines(f, self._offset, end, self._target, self._spacing)
        except (FileNotFoundError, DamagedFileError):
            return False
        if not lines:
            return False
        for _, raw, keep in lines:
            point = _point(raw)
            if point is not None:
                self._take(point, keep)
        offset, raw, _ = lines[-1]
        self._offset = offset + len(raw) + 1
        return True

    def _take(self, point: Point, keep: bool) -> None:
        if self.points and point.step <= self.points[-1].step:
            self.points = [p for p in self.points if p.step < point.step]
        self.attempt_began.setdefault(point.attempt, point)
        self.attempt_ended[point.attempt] = point
        self.newest = point
        if keep:
            self.points.append(point)
            if len(self.points) > 2 * self.budget:
                self.points = self.points[::2]
                self._spacing *= 2

    def curve(self) -> tuple[list[int], list[float]]:
        """The sampled (steps, losses) with the newest line last; lines without a loss left out."""
        points = list(self.points)
        if self.newest is not None and (not points or self.newest.step > points[-1].step):
            points.append(self.newest)
        kept = [(p.step, p.loss) for p in points if p.loss is not None]
        return [step for step, _ in kept], [loss for _, loss in kept]

    def rate(self) -> float | None:
        """Steps per second of the newest attempt, from its first and newest lines seen."""
        newest = self.newest
        first = None if newest is None else self.attempt_began.get(newest.attempt)
        if newest is None or first is None or newest.time is None or first.time is None:
            return None
        elapsed = newest.time - first.time
        return (newest.step - first.step) / elapsed if elapsed > 0 and newest.step > first.step else None


def _sampled_lines(
    f: Any, start: int, end: int, target: int, spacing: int
) -> tuple[list[tuple[int, bytes, bool]], int]:
    """The complete lines of ``f`` in [start, end) to look at, as (offset, line, kept): the first
    line starting at or after ``target`` and after each later multiple of ``spacing`` (kept), and
    the last line (kept or not); then the next target."""
    found: list[tuple[int, bytes, bool]] = []
    if end - start <= READ_WHOLE:  # one read; then a search per kept line, not a step per line
        f.seek(start)
        data = f.read(end - start)
        last = data.rfind(b"\n")
        if last < 0:
            return found, target
        while True:
            wanted = target - start
            begin = 0 if wanted <= 0 else data.find(b"\n", wanted - 1) + 1
            if (wanted > 0 and begin == 0) or begin > last:
                break
            newline = data.index(b"\n", begin)
            found.append((start + begin, data[begin:newline], True))
            target = ((start + begin) // spacing + 1) * spacing
        last_begin = data.rfind(b"\n", 0, last) + 1
        if not found or found[-1][0] != start + last_begin:
            found.append((start + last_begin, data[last_begin:last], False))
        return found, target
    target = max(target, start)
    while target < end:
        line = _line_from(f, target, end)
        if line is None:
            target += spacing
            continue
        found.append((line[0], line[1], True))
        target = (line[0] // spacing + 1) * spacing
    last = _last_line(f, start, end)
    if last is not None and (not found or last[0] > found[-1][0]):
        found.append((last[0], last[1], False))
    return found, target


def _line_from(f: Any, position: int, end: int) -> tuple[int, bytes] | None:
    """The first complete line that starts at or after ``position`` (within a window)."""
    f.seek(max(0, position - 1))
    window = f.read(min(WINDOW, end - max(0, position - 1)))
    begin = 0 if position == 0 else window.find(b"\n") + 1
    if position != 0 and begin == 0:
        return None
    newline = window.find(b"\n", begin)
    if newline < 0:
        return None
    return max(0, position - 1) + begin, window[begin:newline]


def _last_line(f: Any, start: int, end: int) -> tuple[int, bytes] | None:
    """The last complete line in [start, end)."""
    begin = max(start, end - WINDOW)
    f.seek(begin)
    window = f.read(end - begin)
    newline = window.rfind(b"\n")
    if newline < 0:
        return None
    previous = window.rfind(b"\n", 0, newline)
    if previous < 0 and begin > start:
        return None
    return begin + previous + 1, window[previous + 1 : newline]


def _point(raw: bytes) -> Point | None:
    """The sampled line, or None for one that is damaged (the views that read every line say
    which: :func:`~resilient_flows.rundir._metrics.metrics_problem`)."""
    try:
        record = parse_json(raw)
    except ValueError:  # UnicodeDecodeError too
        return None
    if not isinstance(record, dict):
        return None
    step, loss, when, attempt = record.get("step"), record.get("loss"), record.get("time"), record.get("attempt", 1)
    if not (_is_number(step) and _is_number(attempt)) or not all(v is None or _is_number(v) for v in (loss, when)):
        return None
    if not math.isfinite(step):
        return None
    return Point(
        step=int(step),
        loss=float(loss) if loss is not None and math.isfinite(loss) else None,
        time=None if when is None or not math.isfinite(when) else float(when),
        attempt=int(attempt) if math.isfinite(attempt) else 1,
    )


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Band:
    """A family's losses on a step grid: median and the 10th and 90th percentiles, over the
    members whose curves reach each step (None where a value is not finite); ``count`` members had any."""

    steps: list[int]
    p10: list[float | None]
    p50: list[float | None]
    p90: list[float | None]
    count: int


def family_band(curves: list[tuple[list[int], list[float]]], grid_steps: int = BAND_STEPS) -> Band | None:
    """The band of ``curves`` ((steps, losses) each), interpolated on a common grid; None
    without a curve of two points."""
    usable = [(np.asarray(s, dtype=float), np.asarray(v, dtype=float)) for s, v in curves if len(s) >= 2]
    if not usable:
        return None
    top = max(s[-1] for s, _ in usable)
    grid = np.unique(np.linspace(0, top, grid_steps).round())
    values = np.full((len(usable), len(grid)), np.nan)
    for row, (steps, losses) in enumerate(usable):
        inside = (grid >= steps[0]) & (grid <= steps[-1])
        values[row, inside] = np.interp(grid[inside], steps, losses)
    present = ~np.all(np.isnan(values), axis=0)
    grid, values = grid[present], values[:, present]
    p10, p50, p90 = (_percentile(values, q) for q in (0.1, 0.5, 0.9))
    return Band(
        steps=[int(s) for s in grid],
        p10=_finite(p10),
        p50=_finite(p50),
        p90=_finite(p90),
        count=len(usable),
    )


def _percentile(values: np.ndarray, q: float) -> np.ndarray:
    """Each column's ``q`` quantile over its values that are not NaN, interpolated linearly as
    ``np.nanpercentile`` does, without its loop over columns (most of a live page's look)."""
    ordered = np.sort(values, axis=0)  # NaN last
    count = (~np.isnan(values)).sum(axis=0)
    position = q * (count - 1)
    low = np.floor(position).astype(int)
    high = np.minimum(low + 1, count - 1)
    columns = np.arange(values.shape[1])
    fraction = position - low
    return ordered[low, columns] * (1 - fraction) + ordered[high, columns] * fraction


def _finite(values: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in values]
