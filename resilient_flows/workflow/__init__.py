"""Workflows: a YAML file describing an ensemble, validated, planned onto a site, run through Parsl.

``run`` creates a run directory and submits every member; ``resume`` continues one; ``status``
reads one. Everything is recorded in the run directory, so any of them can happen in a later
session, from another login node.

Names are imported on first use: ``validate`` and ``status`` need the schema, the plan and the
statuses, and must not pay for the runner's Parsl import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilient_flows.lazy import lazy_exports

if TYPE_CHECKING:
    from resilient_flows.workflow.plan import plan_workflow
    from resilient_flows.workflow.rundir import Plan, read_plan
    from resilient_flows.workflow.runner import resume_run, start_run
    from resilient_flows.workflow.schema import Workflow, load_workflow
    from resilient_flows.workflow.status import MemberStatus, member_statuses

__all__ = [
    "MemberStatus",
    "Plan",
    "Workflow",
    "load_workflow",
    "member_statuses",
    "plan_workflow",
    "read_plan",
    "resume_run",
    "start_run",
]

_SOURCES = {
    "resilient_flows.workflow.plan": ("plan_workflow",),
    "resilient_flows.workflow.rundir": ("Plan", "read_plan"),
    "resilient_flows.workflow.runner": ("resume_run", "start_run"),
    "resilient_flows.workflow.schema": ("Workflow", "load_workflow"),
    "resilient_flows.workflow.status": ("MemberStatus", "member_statuses"),
}

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES)
