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
from resilient_flows.training.events import read_events

__all__ = ["MemberStatus", "MetricsReader", "member_statuses"]

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


def member_statuses(
    run_dir: str | os.PathLike, members: list[tuple[str, int]], previous: dict[str, MemberStatus] | None = None
) -> dict[str, MemberStatus]:
    """Status of ``members`` ((name, steps) pairs); pass ``previous`` to read only new metric lines."""
    statuses = {
        name: MemberStatus(name, steps, metrics=(previous[name].metrics if previous and name in previous else None))
        for name, steps in members
    }
    for event in read_events(run_dir):
        status = statuses.get(event.get("member"))
        if status is None:
            continue
        kind = event["kind"]
        status.state = _STATE_AFTER.get(kind, status.state)
        if kind == "started":
            status.attempts = max(status.attempts, int(event.get("attempt", 1)))
        elif kind in ("checkpointed", "resumed", "preempted"):
            status.checkpoint = max(status.checkpoint or -1, int(event["step"]))
        elif kind == "failed" and event.get("cause") != "preempted":  # a preemption is no failure
            status.failures += 1
            status.errors.append(str(event.get("error")))
        if kind == "preempted":
            status.preemptions += 1
    for status in statuses.values():
        directory = member_dir(run_dir, status.name)
        if status.metrics is None:
            status.metrics = MetricsReader(directory / "metrics.jsonl")
        status.metrics.update()
        result = directory / "result.json"
        if result.exists():
            status.result = json.loads(result.read_text())
            status.state = "retired" if "retired" in status.result else "finished"
    return statuses
