"""The plan's file in the run directory: written once when the run is created, read by every later command.

What a plan holds (the validated workflow, its site, the members' specs) is the workflow's
business (:mod:`resilient_flows.workflow._recorded_plan`); here is only the document on disk, which must
stay under :data:`~resilient_flows.capped.PLAN_CAP` so that a resume can read it back.
"""

from __future__ import annotations

import json
from typing import Any

from resilient_flows.capped import PLAN_CAP
from resilient_flows.durable import write_atomically
from resilient_flows.errors import WorkflowError
from resilient_flows.rundir._files import read_json
from resilient_flows.rundir._layout import RunLayout


def refuse_occupied(layout: RunLayout) -> None:
    """Refuse a directory that holds a run (``resume`` continues it) or anything else."""
    root = layout.root
    if layout.plan.exists():
        raise WorkflowError(f"{root} already holds a run; continue it with `resilient-flows resume {root}`")
    if root.exists() and any(root.iterdir()):
        raise WorkflowError(f"run directory {root} exists and is not empty; choose another with --run-dir")


def encode_plan(document: dict[str, Any]) -> str:
    """The plan's text; refused now, before the run starts, when it is over the cap that a resume reads."""
    text = json.dumps(document, indent=2)
    if len(text.encode()) > PLAN_CAP:
        members = len(document.get("members", ()))
        raise WorkflowError(f"the plan of {members} members is over the {PLAN_CAP >> 20} MiB a run may have")
    return text


def write_plan(layout: RunLayout, text: str) -> None:
    """Written last when a run is created: a directory with a plan holds a complete run."""
    write_atomically(layout.plan, text)


def read_plan_document(layout: RunLayout) -> dict[str, Any]:
    """The plan's document; WorkflowError when ``layout`` is no run directory or its plan is unreadable."""
    try:
        document = read_json(layout.plan, PLAN_CAP, "run plan")
    except FileNotFoundError:
        raise WorkflowError(
            f"{layout.root} is not a run directory (no {layout.plan.name}); start one with `resilient-flows run`"
        ) from None
    except (OSError, ValueError) as exc:
        raise WorkflowError(f"{layout.plan}: unreadable ({exc})") from None
    if not isinstance(document, dict):
        raise WorkflowError(f"{layout.plan}: not a plan this version understands (not a JSON object)")
    return document
