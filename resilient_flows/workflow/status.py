"""What each member of a run is doing, computed from ``events.jsonl`` and ``metrics.jsonl`` alone.

The same computation serves the live display, ``resilient-flows status`` and the final report, so
that all three always agree.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resilient_flows.training.context import member_dir
from resilient_flows.training.events import EventTail

__all__ = ["MemberStatus", "MetricsReader", "StatusTracker", "member_statuses"]

#: The state a member is in after each kind of event.
_STATE_AFTER = {
    "submitted": "queued",
    "started": "running",
    "resumed": "running",
    "failed": "failed",
    "retried": "retrying",
    "preempted": "preempted",
    "finished": "finished",
    "retired": "retired",
}


class MetricsReader:
    """Follows a member's ``metrics.jsonl``: the loss curve with later attempts replacing redone steps.

    ``curve`` maps step -> loss as the final model saw it; ``attempt_spans`` maps each attempt to
    the (first, last) step it logged, which is where the report marks failures and resumes;
    ``attempt_times`` to the (first, last) times it logged, from which its pace follows.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.curve: dict[int, float] = {}
        self.attempt_spans: dict[int, tuple[int, int]] = {}
        self.attempt_times: dict[int, tuple[float, float]] = {}
        self.last: dict[str, Any] | None = None
        self._offset = 0

    def update(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for raw in complete.splitlines():
            try:
                record = json.loads(raw)
            except json.JSONDecodeError:
                continue
            step, attempt = int(record["step"]), int(record.get("attempt", 1))
            if "loss" in record:
                self.curve[step] = float(record["loss"])
            first, _ = self.attempt_spans.get(attempt, (step, step))
            self.attempt_spans[attempt] = (first, step)
            if "time" in record:
                began, _ = self.attempt_times.get(attempt, (float(record["time"]),) * 2)
                self.attempt_times[attempt] = (began, float(record["time"]))
            self.last = record


@dataclass
class MemberStatus:
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

    @property
    def step(self) -> int | None:
        return None if self.metrics is None or self.metrics.last is None else int(self.metrics.last["step"])

    @property
    def loss(self) -> float | None:
        last = None if self.metrics is None else self.metrics.last
        return None if last is None or "loss" not in last else float(last["loss"])

    def apply(self, event: dict[str, Any]) -> None:
        """Take one of this member's events into account, in file order."""
        kind = event["kind"]
        self.state = _STATE_AFTER.get(kind, self.state)
        if kind == "started":
            self.attempts = max(self.attempts, int(event.get("attempt", 1)))
        elif kind in ("checkpointed", "resumed", "preempted"):
            self.checkpoint = max(self.checkpoint or -1, int(event["step"]))
        elif kind == "failed" and event.get("cause") != "preempted":  # a preemption is no failure
            self.failures += 1
            self.errors.append(str(event.get("error")))
        if kind == "preempted":
            self.preemptions += 1

    def refresh(self, directory: Path) -> None:
        """Read the member's new metric lines and, once it exists, its result."""
        if self.metrics is None:
            self.metrics = MetricsReader(directory / "metrics.jsonl")
        self.metrics.update()
        if self.result is None and (directory / "result.json").exists():
            self.result = json.loads((directory / "result.json").read_text())
        if self.result is not None:
            self.state = "retired" if "retired" in self.result else "finished"


class StatusTracker:
    """The members' statuses over a run, each update reading only the events and metric lines
    appended since the last one (a run of thousands of members has a long ``events.jsonl``).

    Events of names that are not (yet) members, such as stages and clones not yet registered,
    are kept by name: a member that appears later gets its own, and :meth:`events_of` gives the rest.
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self._tail = EventTail(run_dir)
        self._statuses: dict[str, MemberStatus] = {}
        self._others: dict[str, list[dict[str, Any]]] = {}

    def update(self, members: list[tuple[str, int]]) -> dict[str, MemberStatus]:
        """Status of ``members`` ((name, steps) pairs), in their order."""
        for name, steps in members:
            if name not in self._statuses:
                status = self._statuses[name] = MemberStatus(name, steps)
                for event in self._others.pop(name, []):
                    status.apply(event)
        for event in self._tail.new():
            name = event.get("member")
            if name in self._statuses:
                self._statuses[name].apply(event)
            elif isinstance(name, str):
                self._others.setdefault(name, []).append(event)
        chosen = {name: self._statuses[name] for name, _ in members}
        for status in chosen.values():
            status.refresh(member_dir(self.run_dir, status.name))
        return chosen

    def events_of(self, names: list[str]) -> list[dict[str, Any]]:
        """The events seen so far of ``names`` that are not members (stages), each name's in file order."""
        return [e for name in names for e in self._others.get(name, [])]


def member_statuses(run_dir: str | os.PathLike, members: list[tuple[str, int]]) -> dict[str, MemberStatus]:
    """Status of ``members`` ((name, steps) pairs) now, from the run's files."""
    return StatusTracker(run_dir).update(members)
