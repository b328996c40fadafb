"""Where the time one fault costs goes, read from what a run wrote: shared by ``goodput.py`` and ``chaos.py``.

A fault that ends a member's attempt costs the member the time from the fault until it trains
again, plus the steps it must compute a second time. That time splits into four parts, each
bounded by a timestamp the run already writes (``events.jsonl`` and the member's
``metrics.jsonl``) or the injector's own clock (the fault's wall-clock time):

- **detection**: the fault -> the runner notices: the attempt's ``failed`` (the retry handler)
  or ``lost`` (the watchdog) event, the ``lost`` event of the whole Parsl instance (its
  interchange lost: every attempt it ran ended then, and the runner starts another), or a new
  runner's ``submitted`` after the runner died;
- **restart**: -> the next attempt runs: its ``started`` event;
- **restore**: -> training again: the next attempt's ``resumed`` event (its checkpoint restored),
  or for an attempt with nothing to restore, its first step's line less one step time;
- **redone steps**: steps the ended attempt logged and a later attempt logged again, each
  costing one fault-free step time.

Two corrections keep the split to what the fault itself cost (``chaos.py`` applies both; a run of
one member per worker, as ``goodput.py``'s, needs neither):

- **queued** (part of restart, not counted in the recovery): in an ensemble larger than its
  workers, the retry waits for a free worker; the seconds between the notice and the next
  ``started`` during which every worker ran another member's attempt (``busy``: the spans of the
  other attempts, each ended at the fault that ended it, if one did; ``slots``: the workers) are
  the queue the member joined, which it would have waited in without the fault too, while the
  workers trained. The seconds with a worker free, or gone with the fault, count in full.
- **cut**: when another fault ended the next attempt before it trained again, or struck what the
  member waited for (``until``), this fault's recovery stops there, and the rest of the wait is
  that fault's (``waiting``: a split from that fault, with nothing to detect): one outage is never
  counted twice, nor left out.

The recovery is then detection + restart - queued + restore: the fault -> training again.

Goodput at one fault every ``period`` seconds is then ``1 - cost / period``: the share of the
wall time spent on steps that count.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NOTICES",
    "Split",
    "ends_every_attempt",
    "goodput",
    "percentile",
    "queued_s",
    "split_of",
    "step_time_s",
    "summary",
]

#: The events by which the runner notices that an attempt ended.
NOTICES = ("failed", "lost", "submitted")


def ends_every_attempt(event: Mapping[str, Any]) -> bool:
    """Whether ``event`` is the loss of a whole Parsl instance (its interchange exited or hung):
    the runner's notice for every attempt that instance ran, which name no member."""
    return event.get("kind") == "lost" and event.get("member") is None and event.get("block") is None


#: ``(step, attempt, wall-clock time)`` of each line of a member's ``metrics.jsonl``.
MetricLine = tuple[int, int, float]


@dataclass(frozen=True)
class Split:
    """What one fault cost one member: the attempt it ended, and the recovery's parts (seconds;
    None where the run wrote no later attempt)."""

    member: str
    attempt: int
    fault_time: float
    detected_by: str  # the first notice: failed, lost, submitted, started when none came first, or waiting
    detection_s: float | None
    restart_s: float | None
    restore_s: float | None
    redone_steps: int
    redone_s: float
    retries_charged: float  # the ``cost`` of the attempt's ``failed`` events
    queued_s: float = 0.0  # of restart: waiting for a free worker while every worker ran another member
    cut: bool = False  # another fault ended the next attempt before it trained: the split ends there

    @property
    def training_again_s(self) -> float | None:
        """The fault -> training again: what a spare node or a warm restart shortens."""
        parts = (self.detection_s, self.restart_s, self.restore_s)
        return None if any(p is None for p in parts) else sum(parts)

    @property
    def recovery_s(self) -> float | None:
        """What the fault cost before the member trained again: training again, less the queue."""
        again = self.training_again_s
        return None if again is None else again - self.queued_s

    @property
    def total_s(self) -> float | None:
        """The whole cost the split accounts for: training again, then the redone steps."""
        again = self.training_again_s
        return None if again is None else again + self.redone_s


def split_of(
    events: Iterable[Mapping[str, Any]],
    metrics: Iterable[MetricLine],
    member: str,
    attempt: int,
    fault_time: float,
    step_s: float,
    until: float | None = None,
    busy: Sequence[tuple[float, float]] = (),
    slots: int | None = None,
    waiting: bool = False,
) -> Split:
    """The split of the fault at ``fault_time`` that ended ``attempt`` of ``member``.

    ``events``: the run's events (any member's; others are skipped); ``metrics``: the member's
    lines; ``step_s``: one step's time without faults (:func:`step_time_s` of the fault-free run).
    ``until``: when another fault ended the next attempt, or struck what the member waited for (the
    split is cut there if it had not trained again by then); ``busy`` and ``slots``: the other
    members' attempts and the workers, for the queue (see the module's docstring; no ``slots``, no
    queue). ``waiting``: the split of a fault that found the member waiting to restart, its attempt
    ended by an earlier one: no detection, no redone steps.
    """
    mine = [e for e in events if e.get("member") == member or ends_every_attempt(e)]
    started = {e["attempt"]: e["time"] for e in mine if e["kind"] == "started"}
    resumed = {e["attempt"]: e["time"] for e in mine if e["kind"] == "resumed"}
    charged = sum(
        e["cost"]
        for e in mine
        if e["kind"] == "failed" and e.get("attempt") == attempt and isinstance(e.get("cost"), int | float)
    )
    steps: dict[int, set[int]] = {}
    first_line: dict[int, float] = {}
    for step, line_attempt, when in metrics:
        steps.setdefault(line_attempt, set()).add(step)
        first_line[line_attempt] = min(first_line.get(line_attempt, when), when)
    later = set().union(*(s for a, s in steps.items() if a > attempt))
    redone = len(steps.get(attempt, set()) & later)
    following = min((a for a in started if a > attempt), default=None)
    if following is None:
        return Split(member, attempt, fault_time, "", None, None, None, redone, redone * step_s, charged)
    restarted = started[following]
    if waiting:  # its attempt had ended before: nothing to notice, and its redone steps are not this fault's
        detected, how, redone = fault_time, "waiting", 0
    else:
        notices = sorted(
            (e["time"], e["kind"]) for e in mine if e["kind"] in NOTICES and fault_time <= e["time"] <= restarted
        )
        detected, how = notices[0] if notices else (restarted, "started")
    if following in resumed:
        again = resumed[following]
    elif following in first_line:
        again = max(restarted, first_line[following] - step_s)
    else:  # it never trained: until the fault that ended it, if one did
        again = restarted if until is None else math.inf
    cut = until is not None and until < again
    end = until if cut else again
    noticed, running = min(detected, end), min(restarted, end)
    return Split(
        member,
        attempt,
        fault_time,
        how,
        noticed - fault_time,
        max(0.0, running - noticed),
        max(0.0, end - running),
        redone,
        redone * step_s,
        charged,
        queued_s(noticed, running, busy, slots),
        cut,
    )


def queued_s(start: float, end: float, busy: Sequence[tuple[float, float]], slots: int | None) -> float:
    """Seconds of ``start`` -> ``end`` during which at least ``slots`` of the spans ``busy`` (start,
    end) ran at once: every worker was taken by another member (0 without ``slots``)."""
    if slots is None or end <= start:
        return 0.0
    edges = sorted({start, end, *(t for span in busy for t in span if start < t < end)})
    full = 0.0
    for a, b in itertools.pairwise(edges):
        middle = (a + b) / 2
        if sum(s <= middle < e for s, e in busy) >= slots:
            full += b - a
    return full


def step_time_s(metrics: Iterable[MetricLine]) -> float:
    """One step's time: the median gap between consecutive lines of one attempt (0 with fewer than two)."""
    by_attempt: dict[int, list[float]] = {}
    for _, attempt, when in metrics:
        by_attempt.setdefault(attempt, []).append(when)
    gaps = [b - a for times in by_attempt.values() for a, b in zip(sorted(times), sorted(times)[1:], strict=False)]
    return statistics.median(gaps) if gaps else 0.0


def goodput(cost_s: float, period_s: float = 60.0) -> float:
    """The share of wall time that trains, at one fault every ``period_s`` costing ``cost_s`` each."""
    return 1.0 - cost_s / period_s


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile, nearest rank (of few rounds, p95 is the largest but a stray one)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(splits: Iterable[Split]) -> dict[str, float]:
    """Median and p95 of each part over ``splits`` (those with a later attempt): ``detection_median``,
    ``detection_p95``, ..., ``redone_p95``, ``training_again_*``, ``recovery_*`` and
    ``redone_steps_median``."""
    complete = [s for s in splits if s.training_again_s is not None]
    if not complete:
        return {}
    parts = {
        "detection": [s.detection_s for s in complete],
        "restart": [s.restart_s for s in complete],
        "queued": [s.queued_s for s in complete],
        "restore": [s.restore_s for s in complete],
        "redone": [s.redone_s for s in complete],
        "training_again": [s.training_again_s for s in complete],
        "recovery": [s.recovery_s for s in complete],
    }
    found = {}
    for name, values in parts.items():
        found[f"{name}_median"] = statistics.median(values)
        found[f"{name}_p95"] = percentile(values, 0.95)
    found["redone_steps_median"] = statistics.median(s.redone_steps for s in complete)
    return found
