"""What each member of a run is doing, computed from the event log and the metrics logs alone.

The same computation serves the live display, ``resilient-flows status`` and the final report, so
that all three always agree.

A run of a thousand members is polled twice a second for hours, so an update reads only what
changed: the events appended since the last one, the metric lines of members that are running
(they log without sending events), and a member's result once, when it says it finished. A
member that is not followed shows its newest metrics line, read from the end of its file; its
whole loss curve is read only when a view asks for it (:meth:`MemberStatus.history`).

A damaged line or result is passed over, never a crash of the runner or a view: the tracker's
:class:`~resilient_flows.rundir.DamageLog` records it, for the view to say what it skipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resilient_flows.errors import DamagedFileError, FileTooLargeError
from resilient_flows.rundir import (
    NO_CHECKPOINT,
    DamageLog,
    EventTail,
    MetricsReader,
    TaskLayout,
    member_dir,
    member_layout,
)

#: The state a member is in after each kind of event.
_STATE_AFTER = {
    "submitted": "queued",
    "started": "running",
    "declined": "queued",
    "resumed": "running",
    "failed": "failed",
    "retried": "retrying",
    "preempted": "preempted",
    "finished": "finished",
    "retired": "retired",
}

#: Events a member keeps with their times, for the failure timeline of the report.
TIMELINE_KINDS = ("failed", "lost", "preempted", "resumed")


def free_stop(event: Mapping[str, Any]) -> bool:
    """Whether a ``failed`` event records a stop that cost nothing rather than a failure: a
    preemption (its member stopped on request, making progress) or a start declined near its
    block's drain (by design). Neither is counted among the member's failures nor shown as its
    last error; a stop charged for lack of progress is."""
    cause = str(event.get("cause") or "")
    return cause == "preempted" or (cause.startswith("declined to start") and not event.get("cost"))


@dataclass
class MemberStatus:
    """One member as its events and files describe it.

    ``family`` is the workflow entry it came from (see :func:`~resilient_flows.workflow._families.family_of`
    for runs that did not record it); ``timeline`` holds its :data:`TIMELINE_KINDS` events as
    (time, kind), ``since`` the time of its first event. ``notes``: what the member warned of
    that its user should act on (training without checkpoints), by kind, until it no longer holds.
    ``nodes``: how many nodes its latest attempt ran on, for a member on several nodes or one that
    may shrink (None: not said), fewer than it spans after it shrank onto the nodes its block had left.
    """

    name: str
    steps: int
    state: str = "planned"
    attempts: int = 0
    checkpoint: int | None = None
    failures: int = 0
    preemptions: int = 0
    errors: list[str] = field(default_factory=list)
    result: dict[str, Any] | None = None
    metrics: MetricsReader | None = None
    family: str = ""
    timeline: list[tuple[float, str]] = field(default_factory=list)
    since: float | None = None
    notes: dict[str, str] = field(default_factory=dict)
    nodes: int | None = None
    _result_due: bool = field(default=True, init=False, repr=False, compare=False)

    @property
    def step(self) -> int | None:
        return None if self.metrics is None or self.metrics.last is None else int(self.metrics.last["step"])

    @property
    def loss(self) -> float | None:
        last = None if self.metrics is None else self.metrics.last
        return None if last is None or "loss" not in last else float(last["loss"])

    @property
    def active(self) -> bool:
        """Whether it may be logging metrics without sending events: an attempt runs, or may."""
        return self.state in ("running", "retrying") or (self.state == "queued" and self.attempts > 0)

    @property
    def awaiting_result(self) -> bool:
        """Whether it said it finished or retired and its result is not read yet (a retiring member
        writes it after the event)."""
        return self._result_due and self.state in ("finished", "retired")

    def apply(self, event: dict[str, Any]) -> None:
        """Take one of this member's events into account, in file order."""
        kind = event["kind"]
        if self.since is None and "time" in event:
            self.since = float(event["time"])
        self.state = _STATE_AFTER.get(kind, self.state)
        if kind == "started":
            self.attempts = max(self.attempts, int(event.get("attempt") or 1))
            self.nodes = event.get("nodes") if isinstance(event.get("nodes"), int) else self.nodes
        elif kind in ("checkpointed", "resumed", "preempted"):
            self.checkpoint = max(self.checkpoint or -1, int(event["step"]))
        elif kind == "failed" and not free_stop(event):
            self.attempts = max(self.attempts, int(event.get("attempt") or 0))  # it may fail before it starts
            self.failures += 1
            self.errors.append(str(event.get("error")))
        if kind == "preempted":
            self.preemptions += 1
        if kind == "warning" and event.get("warning") == NO_CHECKPOINT:
            self.notes[NO_CHECKPOINT] = str(event.get("reason"))
        elif kind == "checkpointed":
            self.notes.pop(NO_CHECKPOINT, None)
        if kind in ("finished", "retired"):
            self._result_due = True
        if kind in TIMELINE_KINDS and "time" in event and not (kind == "failed" and free_stop(event)):
            self.timeline.append((float(event["time"]), kind))

    def refresh(self, directory: Path, follow: bool, damage: DamageLog | None = None) -> None:
        """Read the member's new metric lines (``follow``) or only its newest one, and its result
        once it is due: on first sight, and when the member said it finished or retired. What is
        damaged is recorded in ``damage`` (see :func:`_read_result`)."""
        layout = TaskLayout(directory)
        if self.metrics is None:
            self.metrics = MetricsReader(layout.metrics, damage)
        if follow:
            self.metrics.update()
        else:
            self.metrics.peek()
        if self._result_due:
            self.result = _read_result(layout, damage)
            self._result_due = self.result is None and self.state in ("finished", "retired")
        if self.result is not None:
            self.state = "retired" if "retired" in self.result else "finished"

    def history(self) -> MetricsReader | None:
        """The metrics with the whole loss curve, read up to now (once: later calls read what was added)."""
        if self.metrics is not None:
            self.metrics.read_curve()
        return self.metrics


class StatusTracker:
    """The members' statuses over a run; each update costs in proportion to what changed.

    An update reads the events appended since the last one, and refreshes only the members that
    are new, had events, are :attr:`~MemberStatus.active` or :attr:`~MemberStatus.awaiting_result`;
    with ``follow`` (the runner) the active ones' metric lines are all read as they come, which the
    runner's controllers need, otherwise (``status`` of a run) only the newest line of each
    refreshed member.

    Events of names that are not (yet) members, such as stages and clones not yet registered,
    are kept by name: a member that appears later gets its own, and :meth:`events_of` gives the rest.

    :attr:`damage` holds the damaged lines and files it passed over: ``damage`` when given (a
    command that reports them), else a log of its own that also logs each as a warning (the runner).
    ``observe``, when given, is handed every event as it is read, so that a view that shows more
    than the states (the dashboard's timeline) reads the event log once with the tracker.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        follow: bool = True,
        damage: DamageLog | None = None,
        observe: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.observe = observe
        self.follow = follow
        self.damage = DamageLog(warn=True) if damage is None else damage
        self._tail = EventTail(run_dir, self.damage)
        self._statuses: dict[str, MemberStatus] = {}
        self._others: dict[str, list[dict[str, Any]]] = {}
        self._active: set[str] = set()  # active at the last update: followed
        self._watched: set[str] = set()  # refreshed at every update

    def update(
        self, members: Sequence[tuple[str, int]], families: Mapping[str, str] | None = None
    ) -> dict[str, MemberStatus]:
        """Status of ``members`` ((name, steps) pairs), in their order; ``families`` names the
        family of members by name (see :class:`MemberStatus`)."""
        changed = set()
        for name, steps in members:
            if name not in self._statuses:
                family = "" if families is None else families.get(name, "")
                status = self._statuses[name] = MemberStatus(name, steps, family=family)
                for event in self._others.pop(name, []):
                    status.apply(event)
                changed.add(name)
        for event in self._tail.new():
            if self.observe is not None:
                self.observe(event)
            name = event.get("member")
            if name in self._statuses:
                self._statuses[name].apply(event)
                changed.add(name)
            elif isinstance(name, str):
                self._others.setdefault(name, []).append(event)
        for name in changed | self._watched:
            status = self._statuses[name]
            followed = status.active or name in self._active  # a member that just stopped: its last lines
            status.refresh(member_dir(self.run_dir, name), follow=self.follow and followed, damage=self.damage)
            _mark(self._active, name, status.active)
            _mark(self._watched, name, status.active or status.awaiting_result)
        return {name: self._statuses[name] for name, _ in members}

    def events_of(self, names: list[str]) -> list[dict[str, Any]]:
        """The events seen so far of ``names`` that are not members (stages), each name's in file order."""
        return [e for name in names for e in self._others.get(name, [])]


def _mark(names: set[str], name: str, member: bool) -> None:
    if member:
        names.add(name)
    else:
        names.discard(name)


def _read_result(layout: TaskLayout, damage: DamageLog | None) -> dict[str, Any] | None:
    """The member's result; one damaged or oversized is recorded in ``damage`` and counts as none
    yet (without ``damage`` it is the reader's error)."""
    if damage is None:
        return layout.read_result()
    try:
        result = layout.read_result()
    except DamagedFileError as exc:
        damage.file(layout.result, exc.problem)
        return None
    except FileTooLargeError as exc:
        damage.file(layout.result, f"over its cap of {exc.cap} bytes")
        return None
    damage.repaired(layout.result)
    return result


def member_statuses(
    run_dir: str | os.PathLike,
    members: Sequence[tuple[str, int]],
    families: Mapping[str, str] | None = None,
    damage: DamageLog | None = None,
) -> dict[str, MemberStatus]:
    """Status of ``members`` ((name, steps) pairs) now, from the run's files, each read once:
    right for a run whose runner is gone as for a live one. ``damage`` collects what was passed
    over (see :class:`StatusTracker`)."""
    return StatusTracker(run_dir, follow=False, damage=damage).update(members, families)


def loss_curve(run_dir: str | os.PathLike, name: str) -> dict[int, float]:
    """A member's loss per step as its final model saw it (a redone step keeps its last loss)."""
    reader = MetricsReader(member_layout(run_dir, name).metrics)
    reader.read_curve()
    return reader.curve
