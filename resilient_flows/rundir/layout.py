"""Where everything of a run lies. ::

    <run>/workflow.yaml        the workflow file as given
    <run>/plan.json            the validated workflow, its site and every member's spec
    <run>/events.jsonl         everything that happened (resilient_flows.rundir.events)
    <run>/blocks.jsonl         the pilot jobs and interchanges of every runner (the block ledger)
    <run>/runner.json          the runner's lease; <run>/guard.log its guard's output
    <run>/heartbeats/<task>    one file per running attempt (members, stages, analytics)
    <run>/parsl/               Parsl's run directory: submit scripts, interchange and worker logs
    <run>/report/              summary table and loss plot (where the workflow's report: says)
    <run>/members/<name>/      a member (clones included), laid out as a TaskLayout
    <run>/stages/<name>/       a stage of a pipeline, laid out as a TaskLayout

A member's or stage's directory::

    spec.json                  its spec (members registered after planning: clones)
    attempts                   how many attempts have started
    checkpoints/               its shared checkpoint tier
    metrics.jsonl              a line per step logged
    control.json               a request to stop or retire, from the runner or the CLI
    clone-order.<request>.json (an order to clone it), seed.json (what a clone started from), handoff.json
    (a fork's hand-off), output.log (a command's output), command-result.json (a command's
    report), output/ (a stage's output), result.json (written last: the task finished)

Nothing here touches the disk: these are names, so the runner, the members and the views agree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunLayout", "TaskLayout", "member_layout", "run_layout", "stage_layout"]


@dataclass(frozen=True)
class TaskLayout:
    """The directory of one member or stage."""

    root: Path

    @property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @property
    def attempts(self) -> Path:
        return self.root / "attempts"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def control(self) -> Path:
        return self.root / "control.json"

    @property
    def seed(self) -> Path:
        return self.root / "seed.json"

    @property
    def handoff(self) -> Path:
        return self.root / "handoff.json"

    @property
    def output_log(self) -> Path:
        return self.root / "output.log"

    @property
    def command_report(self) -> Path:
        return self.root / "command-result.json"

    @property
    def output(self) -> Path:
        """A stage's output, which later stages read."""
        return self.root / "output"

    @property
    def result(self) -> Path:
        return self.root / "result.json"

    def clone_order(self, request: str, suffix: str = ".json") -> Path:
        """An order to clone this member for ``request`` (``.forking`` once being served)."""
        return self.root / f"clone-order.{request}{suffix}"

    def clone_orders(self) -> list[Path]:
        """Every pending clone order here, in no particular order."""
        return list(self.root.glob(self.clone_order("*").name))


@dataclass(frozen=True)
class RunLayout:
    """The run directory ``root``."""

    root: Path

    @property
    def workflow(self) -> Path:
        return self.root / "workflow.yaml"

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def blocks(self) -> Path:
        return self.root / "blocks.jsonl"

    @property
    def lease(self) -> Path:
        return self.root / "runner.json"

    @property
    def guard_log(self) -> Path:
        return self.root / "guard.log"

    @property
    def heartbeats(self) -> Path:
        return self.root / "heartbeats"

    @property
    def parsl(self) -> Path:
        return self.root / "parsl"

    @property
    def members(self) -> Path:
        return self.root / "members"

    @property
    def stages(self) -> Path:
        return self.root / "stages"

    def member(self, name: str) -> TaskLayout:
        return TaskLayout(self.members / name)

    def stage(self, name: str) -> TaskLayout:
        return TaskLayout(self.stages / name)


def run_layout(run_dir: str | os.PathLike) -> RunLayout:
    return RunLayout(Path(run_dir))


def member_layout(run_dir: str | os.PathLike, name: str) -> TaskLayout:
    return RunLayout(Path(run_dir)).member(name)


def stage_layout(run_dir: str | os.PathLike, name: str) -> TaskLayout:
    return RunLayout(Path(run_dir)).stage(name)
