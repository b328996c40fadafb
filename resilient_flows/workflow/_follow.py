"""``status --follow``: the status table of a run, redrawn until its runner lets go of the run.

A detached runner (``run --detach``) shows nothing in the terminal; this is its live view, from any
session. It costs what the run changed: one :class:`StatusTracker` reads the events appended since
the last look and the newest metrics of running members, the member index lists the member
directories only when a clone was added, and the table is drawn only at each refresh, never by a
timer of its own.

The run is over for the view when no runner holds it (:func:`~resilient_flows.rundir.holding_runner`):
its lease was let go of, its runner's process ended on this host, or a runner on another host left
it unrenewed for two renewals.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.live import Live

from resilient_flows.rundir import holding_runner
from resilient_flows.workflow._recorded_plan import MemberIndex, read_plan
from resilient_flows.workflow._report import stage_table, status_table
from resilient_flows.workflow._status import StatusTracker

#: Seconds between two redraws: a run's state changes at the pace of steps and checkpoints,
#: and a table of thousands of members takes a while to draw.
REFRESH_S = 2.0


def follow_run(run_dir: Path, console: Console, all_members: bool = False, refresh_s: float = REFRESH_S) -> None:
    """Redraw the run's status table every ``refresh_s`` seconds while its runner holds it, or
    until Ctrl-C; returns at once for a run that no runner holds. The table vanishes when it
    returns: the caller prints the final one, whose exit status says how the run ended, and who
    holds the run now (a runner that died without letting go of it), with how to continue it."""
    plan = read_plan(run_dir)
    stages = plan.workflow.stage_specs()
    index = MemberIndex(run_dir, plan)
    tracker = StatusTracker(run_dir, follow=False)
    title = f"{plan.workflow.name} on {plan.site}: {run_dir} (following; Ctrl-C to stop)"
    try:
        with Live(console=console, auto_refresh=False, transient=True) as live:
            while holding_runner(run_dir) is not None:
                members = index.members()
                statuses = tracker.update([(m.name, m.steps) for m in members], {m.name: m.family for m in members})
                table: RenderableType = status_table(statuses, title, all_members=all_members)
                if stages:
                    events = tracker.events_of([s.name for s in stages])
                    table = Group(stage_table(run_dir, stages, events), table)
                live.update(table, refresh=True)
                time.sleep(refresh_s)
    except KeyboardInterrupt:
        return
