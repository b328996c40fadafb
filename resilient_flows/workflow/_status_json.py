"""The ``status --json`` document: what the status tables show, for scripts.

A script reads this instead of scraping a table whose columns change with the terminal's width
and the number of members. The document is an object with a ``version``: within a version
fields are only ever added; a change to what a field means, or its removal, takes a new version.
docs/guides/inspect-export.md ("Output for scripts") lists every field.
"""

from __future__ import annotations

import os
from typing import Any

from resilient_flows.rundir import DamageLog, TaskLayout, attempt_logs, member_layout, stage_layout
from resilient_flows.workflow._status import MemberStatus

#: The version of the ``status --json`` document.
STATUS_VERSION = 1


def member_document(status: MemberStatus) -> dict[str, Any]:
    """One member as ``status`` shows it; ``steps_done`` counts the steps its newest metrics line
    says it trained (0 before any); ``nodes`` the nodes its latest attempt ran on (None: not said)."""
    accuracy = None if status.result is None else status.result.get("test_accuracy")
    return {
        "name": status.name,
        "family": status.family,
        "state": status.state,
        "steps_done": 0 if status.step is None else status.step + 1,
        "steps": status.steps,
        "loss": status.loss,
        "checkpoint": status.checkpoint,
        "attempts": status.attempts,
        "failures": status.failures,
        "preemptions": status.preemptions,
        "nodes": status.nodes,
        "errors": list(status.errors),
        "notes": list(status.notes.values()),
        "test_accuracy": accuracy if isinstance(accuracy, (int, float)) and not isinstance(accuracy, bool) else None,
    }


def log_documents(run_dir: str | os.PathLike, layout: TaskLayout) -> dict[str, Any]:
    """Where a member's or stage's output is, so that a script reads it without knowing the layout:
    ``logs``, every attempt's files in order (``attempt``, ``rank``, ``file``: rank 0's carries
    the launcher's messages of a member on several ranks), and ``log``, the latest attempt's
    lowest rank's file (what ``resilient-flows logs RUN NAME --follow`` shows; None before any
    attempt started). Files are named relative to the run directory, as ``damage`` names them."""
    found = attempt_logs(layout)
    files = [
        {"attempt": attempt, "rank": rank, "file": str(path.relative_to(run_dir))}
        for attempt, ranks in found.items()
        for rank, path in ranks.items()
    ]
    latest = [f["file"] for f in files if f["attempt"] == max(found)] if found else [None]
    return {"logs": files, "log": latest[0]}


def status_document(
    run_dir: str | os.PathLike,
    workflow: str,
    site: str,
    statuses: dict[str, MemberStatus],
    stages: list[dict[str, Any]],
    damage: DamageLog,
    done: bool,
    runner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run (its directory, workflow name and site), every member (never grouped by family:
    a script groups as it likes), the stages' rows (see
    :func:`~resilient_flows.workflow._report.stage_rows`, with their output as a member's), what
    was passed over as damaged, whether everything finished (the exit status says the same), and
    who holds the run
    (``runner``: :meth:`~resilient_flows.workflow._liveness.Liveness.document`)."""
    return {
        "version": STATUS_VERSION,
        "run_dir": str(run_dir),
        "workflow": workflow,
        "site": site,
        "done": done,
        "members": [
            {**member_document(s), **log_documents(run_dir, member_layout(run_dir, s.name))} for s in statuses.values()
        ],
        "stages": [{**row, **log_documents(run_dir, stage_layout(run_dir, row["name"]))} for row in stages],
        "damage": damage.documents(run_dir),
        "runner": runner,
    }
