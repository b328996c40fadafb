"""Workflows: a YAML file describing an ensemble, validated, planned onto a site, run through Parsl.

``run`` creates a run directory and submits every member; ``resume`` continues one; ``status``
reads one. Everything is recorded in the run directory, so any of them can happen in a later
session, from another login node.

Names are imported on first use: ``validate`` and ``status`` need the schema, the plan and the
statuses, and must not pay for the runner's Parsl import.
"""

from __future__ import annotations

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.workflow._families": (
        "GROUP_ABOVE",
        "describe_families",
    ),
    "resilient_flows.workflow._follow": ("follow_run",),
    "resilient_flows.workflow._leaseguard": ("guard",),
    "resilient_flows.workflow._liveness": ("liveness",),
    "resilient_flows.workflow._mlcgen": ("generate",),
    "resilient_flows.workflow._monitoring": ("visualize_note",),
    "resilient_flows.workflow._output_tails": (
        "OutputTails",
        "failed_tails",
        "logs_command",
    ),
    "resilient_flows.workflow._plan": ("plan_workflow",),
    "resilient_flows.workflow._report": (
        "member_notes",
        "stage_rows",
        "stage_table",
        "status_table",
    ),
    "resilient_flows.workflow._rundir": (
        "Plan",
        "read_plan",
        "run_members",
    ),
    "resilient_flows.workflow._runner": (
        "prepare_run",
        "resume_run",
        "start_run",
    ),
    "resilient_flows.workflow.schema": (
        "Workflow",
        "load_workflow",
    ),
    "resilient_flows.workflow._status": (
        "MemberStatus",
        "StatusTracker",
        "member_statuses",
    ),
    "resilient_flows.workflow._status_json": ("status_document",),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
