"""The run's report: a summary table (terminal and text file) and a loss plot with failures marked."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from resilient_flows.training.events import read_events
from resilient_flows.training.spec import MemberSpec, StageSpec
from resilient_flows.training.stage import newest_iteration
from resilient_flows.workflow.ondemand import part_names
from resilient_flows.workflow.status import MemberStatus

__all__ = ["campaign_table", "ondemand_table", "plot_losses", "stage_table", "status_table", "write_report"]


def status_table(statuses: dict[str, MemberStatus], title: str) -> Table:
    table = Table(title=title)
    for column in ("member", "state", "step", "loss", "checkpoint", "attempts", "failures", "preempted", "test acc."):
        table.add_column(column, justify="left" if column in ("member", "state") else "right")
    for s in statuses.values():
        accuracy = None if s.result is None else s.result.get("test_accuracy")
        table.add_row(
            s.name,
            s.state,
            "-" if s.step is None else f"{s.step + 1}/{s.steps}",
            "-" if s.loss is None else f"{s.loss:.4g}",
            "-" if s.checkpoint is None else str(s.checkpoint),
            str(s.attempts),
            str(s.failures),
            str(s.preemptions),
            "-" if accuracy is None else f"{accuracy:.3f}",
        )
    return table


def campaign_table(workflow: Any, members: list[MemberSpec], statuses: dict[str, MemberStatus]) -> Table:
    """Per exploration campaign: its members (clones included), the steps they trained, the best."""
    table = Table(title="exploration campaigns")
    for column in ("campaign", "strategy", "members", "retired", "steps trained", "best member", "test acc."):
        table.add_column(column, justify="left" if column in ("campaign", "strategy", "best member") else "right")
    for campaign in workflow.explore:
        family = {m.name for m in members if m.name.startswith(f"{campaign.name}-")}
        for m in members:  # clones of clones, in registration order
            if m.parent is not None and m.parent.member in family:
                family.add(m.name)
        done = [statuses[n] for n in sorted(family) if n in statuses]
        trained = sum(len(s.metrics.curve) for s in done if s.metrics is not None)
        scored = [s for s in done if s.result and "test_accuracy" in s.result and "retired" not in s.result]
        best = max(scored, key=lambda s: s.result["test_accuracy"], default=None)
        table.add_row(
            campaign.name,
            campaign.strategy,
            str(len(done)),
            str(sum(1 for s in done if s.state == "retired")),
            str(trained),
            "-" if best is None else best.name,
            "-" if best is None else f"{best.result['test_accuracy']:.4f}",
        )
    return table


def ondemand_table(run_dir: Path) -> Table:
    """Per on-demand analytics request: what the policy decided, whom it preempted, how long it waited."""
    table = Table(title="on-demand analytics")
    for column in ("request", "slots", "policy", "free", "decision", "cost", "latency"):
        table.add_column(column, justify="left" if column in ("request", "policy", "decision") else "right")
    events = list(read_events(run_dir))
    begun = {str(e["request"]): float(e["time"]) for e in events if e["kind"] == "analytics_started"}
    for e in (e for e in events if e["kind"] == "ondemand"):
        name, slots = str(e["request"]), int(e["slots"])
        parts = part_names(name, slots)
        starts = [begun[p] for p in parts if p in begun]
        latency = f"{max(starts) - e['now']:.1f} s" if len(starts) == len(parts) else "not started"
        victims = ", ".join(e["preempt"])
        if victims:
            decision = f"preempt {victims}" + (f" after {e['delay']:.1f} s" if e["delay"] else "")
        else:
            decision = "run now" if e["delay"] == 0 else f"wait {e['delay']:.1f} s"
        table.add_row(name, str(slots), e["policy"], str(e["free"]), decision, f"{e['cost']:.3g}", latency)
    return table


def stage_table(run_dir: Path, stages: list[StageSpec], events: Iterable[dict[str, Any]] | None = None) -> Table:
    """Per stage: its state, attempts, newest committed iteration and run time; from ``events``
    (the stages' events, as a :class:`StatusTracker` keeps them) or else the run's whole log."""
    table = Table(title="stages")
    for column in ("stage", "state", "attempts", "failures", "checkpoint", "time"):
        table.add_column(column, justify="left" if column in ("stage", "state") else "right")
    names = {stage.name for stage in stages}
    state = dict.fromkeys(names, "planned")
    attempts, failures, began, ended = dict.fromkeys(names, 0), dict.fromkeys(names, 0), {}, {}
    for e in read_events(run_dir) if events is None else events:
        name = e.get("member")
        if name not in names:
            continue
        if e["kind"] == "stage_started":
            state[name], attempts[name] = "running", int(e["attempt"])
            began.setdefault(name, float(e["time"]))
        elif e["kind"] == "stage_finished":
            state[name], ended[name] = "finished", float(e["time"])
        elif e["kind"] == "failed":
            state[name], failures[name] = "failed", failures[name] + 1
        elif e["kind"] == "retried":
            state[name] = "retrying"
    for stage in stages:
        name = stage.name
        newest = newest_iteration(run_dir, name)
        took = f"{ended[name] - began[name]:.1f} s" if name in ended and name in began else "-"
        table.add_row(
            name, state[name], str(attempts[name]), str(failures[name]), "-" if newest < 0 else str(newest), took
        )
    return table


def plot_losses(statuses: dict[str, MemberStatus], path: Path, title: str) -> None:
    """Each member's loss against steps (raw, faint, and a running mean); X where an attempt was
    lost, o where the next one resumed from a checkpoint, ^ where a clone branched off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for s in statuses.values():
        if s.metrics is None or not s.metrics.curve:
            continue
        steps = sorted(s.metrics.curve)
        losses = np.array([s.metrics.curve[k] for k in steps])
        smooth = _running_mean(losses, max(1, len(steps) // 50))
        (line,) = axes.plot(steps, losses, linewidth=0.6, alpha=0.25)
        color = line.get_color()
        axes.plot(steps, smooth, color=color, linewidth=1.6, label=s.name)
        at = dict(zip(steps, smooth, strict=True))
        if steps[0] > 0:  # a clone: its curve branches off its source's at the fork
            axes.plot(steps[0], smooth[0], "^", color=color, markersize=9, markeredgecolor="black")
        spans = sorted(s.metrics.attempt_spans.values())
        for (_, died), (resumed, _) in itertools.pairwise(spans):
            axes.axvline(died, color=color, linestyle=":", linewidth=1)
            axes.plot(died, at.get(died, np.nan), "X", color=color, markersize=10, markeredgecolor="black")
            axes.plot(resumed, at.get(resumed, np.nan), "o", color=color, markersize=8, markeredgecolor="black")
    axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    legend = "X: attempt lost, o: resumed from its checkpoint, ^: clone branches off"
    axes.set_title(f"{title}\n{legend}", fontsize="medium")
    axes.legend(fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _running_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean over the last ``window`` values (fewer at the start), so the curve keeps its length."""
    sums = np.cumsum(np.insert(values, 0, 0.0))
    index = np.arange(1, len(values) + 1)
    start = np.maximum(index - window, 0)
    return (sums[index] - sums[start]) / (index - start)


def write_report(
    statuses: dict[str, MemberStatus], summary: Path, plot: Path, title: str, extra: tuple[Table, ...] = ()
) -> Table:
    """Write the summary text (the status table, then ``extra``) and the plot; the table, for the terminal."""
    table = status_table(statuses, title)
    summary.parent.mkdir(parents=True, exist_ok=True)
    with summary.open("w") as f:
        console = Console(file=f, width=120, color_system=None)
        for part in (table, *extra):
            console.print(part)
    plot_losses(statuses, plot, title)
    return table
