"""The run's report: a summary table (terminal and text file) and a loss plot with failures marked.

Up to :data:`~resilient_flows.workflow._families.GROUP_ABOVE` members every member has its row;
above, a row per family, then the best members and every member that failed or is retrying.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table

from resilient_flows.rundir import read_events
from resilient_flows.training import MemberSpec, StageSpec, newest_iteration
from resilient_flows.workflow._families import (
    GROUP_ABOVE,
    STATES,
    best_members,
    family_stats,
    troubled_members,
)
from resilient_flows.workflow._member_table import MemberTable, format_loss
from resilient_flows.workflow._output_tails import OutputTails, failed_tails
from resilient_flows.workflow._plots import plot_losses
from resilient_flows.workflow._status import MemberStatus

#: The width ``summary.txt`` is drawn at: wider than any row, so that the tables take their own.
SUMMARY_WIDTH = 1000
#: How many of the best members the grouped view lists.
BEST_SHOWN = 5


def status_table(
    statuses: dict[str, MemberStatus], title: str, all_members: bool = False, cut_errors: bool = True
) -> RenderableType:
    """Every member's row (up to :data:`GROUP_ABOVE` members, or with ``all_members``), with the last
    error of each that failed or was retried; else the family table, the best members and the
    members that failed or are retrying, with their last errors (whole, without ``cut_errors``)."""
    if all_members or len(statuses) <= GROUP_ABOVE:
        errors = any(s.errors for s in statuses.values())
        return MemberTable(statuses.values(), title, errors=errors, cut_errors=cut_errors)
    parts: list[RenderableType] = [
        family_table(statuses.values(), title),
        MemberTable(best_members(statuses.values(), BEST_SHOWN), f"best {BEST_SHOWN} members (lowest loss)"),
    ]
    troubled = troubled_members(statuses.values())
    if troubled:
        title = f"{len(troubled)} member(s) failed or retrying"
        parts.append(MemberTable(troubled, title, errors=True, cut_errors=cut_errors))
    return Group(*parts)


def member_notes(statuses: Iterable[MemberStatus]) -> list[str]:
    """A line per note a member left for its user (see :attr:`MemberStatus.notes`), whole: the
    table has no room for advice, and cut advice is no advice."""
    return [f"{s.name}: {note}" for s in statuses for note in s.notes.values()]


def family_table(statuses: Iterable[MemberStatus], title: str) -> Table:
    """A row per family: members by state (the states that occur), steps trained, best and median
    of the members' newest losses, failures."""
    stats = family_stats(statuses)
    states = [state for state in STATES if any(f.states[state] for f in stats)]
    table = Table(title=title)
    table.add_column("family")
    for column in ("members", *states, "steps", "best loss", "median loss", "failures"):
        table.add_column(column, justify="right")
    for f in stats:
        table.add_row(
            f.family,
            str(f.members),
            *(str(f.states[state]) for state in states),
            f"{f.steps_done}/{f.steps_total}",
            format_loss(f.best_loss),
            format_loss(f.median_loss),
            str(f.failures),
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
        trained = sum(len(metrics.curve) for s in done if (metrics := s.history()) is not None)
        scored = [
            (s, s.result["test_accuracy"])
            for s in done
            if s.result and "test_accuracy" in s.result and "retired" not in s.result
        ]
        best = max(scored, key=lambda pair: pair[1], default=None)
        table.add_row(
            campaign.name,
            campaign.strategy,
            str(len(done)),
            str(sum(1 for s in done if s.state == "retired")),
            str(trained),
            "-" if best is None else best[0].name,
            "-" if best is None else f"{best[1]:.4f}",
        )
    return table


def ondemand_table(run_dir: Path) -> Table:
    """Per on-demand analytics request: what the policy decided, whom it preempted, how long it waited."""
    from resilient_flows.workflow._ondemand import part_names  # imports Parsl: the runner's table only

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
    """Per stage: its state, attempts, newest committed iteration and run time (see :func:`stage_rows`)."""
    table = Table(title="stages")
    for column in ("stage", "state", "attempts", "failures", "checkpoint", "time"):
        table.add_column(column, justify="left" if column in ("stage", "state") else "right")
    for row in stage_rows(run_dir, stages, events):
        seconds, newest = row["seconds"], row["checkpoint"]
        table.add_row(
            row["name"],
            row["state"],
            str(row["attempts"]),
            str(row["failures"]),
            "-" if newest is None else str(newest),
            "-" if seconds is None else f"{seconds:.1f} s",
        )
    return table


def stage_rows(
    run_dir: Path, stages: list[StageSpec], events: Iterable[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Per stage, in order: ``name``, ``state``, ``attempts``, ``failures``, ``checkpoint`` (its
    newest committed iteration, or None) and ``seconds`` (its run time, None until it finished);
    from ``events`` (the stages' events, as a :class:`StatusTracker` keeps them) or else the run's
    whole log."""
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
    rows = []
    for stage in stages:
        name = stage.name
        newest = newest_iteration(run_dir, name)
        rows.append(
            {
                "name": name,
                "state": state[name],
                "attempts": attempts[name],
                "failures": failures[name],
                "checkpoint": None if newest < 0 else newest,
                "seconds": ended[name] - began[name] if name in ended and name in began else None,
            }
        )
    return rows


def write_report(
    statuses: dict[str, MemberStatus],
    summary: Path,
    plot: Path,
    title: str,
    extra: tuple[RenderableType, ...] = (),
    run_dir: Path | None = None,
) -> RenderableType:
    """Write the summary text (the status table, the end of each failed member's output when
    ``run_dir`` is given, then ``extra``) and the plot; the table, for the terminal. The file is
    read in an editor or a pager, which scroll: nothing in it is cut to a width."""
    table = status_table(statuses, title)
    summary.parent.mkdir(parents=True, exist_ok=True)
    tails = () if run_dir is None else (OutputTails(run_dir, failed_tails(run_dir, statuses.values()), cut=False),)
    with summary.open("w") as f:
        console = Console(file=f, width=SUMMARY_WIDTH, color_system=None)
        for part in (status_table(statuses, title, cut_errors=False), *tails, *extra):
            console.print(part)
    plot_losses(statuses, plot, title)
    return table
