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
    "resilient_flows.workflow._plan": (
        "Plan",
        "plan_workflow",
    ),
    "resilient_flows.workflow._report": (
        "member_notes",
        "stage_rows",
        "stage_table",
        "status_table",
    ),
    "resilient_flows.workflow._recorded_plan": (
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

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.workflow._families import (
        GROUP_ABOVE as GROUP_ABOVE,
    )
    from resilient_flows.workflow._families import (
        describe_families as describe_families,
    )
    from resilient_flows.workflow._follow import (
        follow_run as follow_run,
    )
    from resilient_flows.workflow._leaseguard import (
        guard as guard,
    )
    from resilient_flows.workflow._liveness import (
        liveness as liveness,
    )
    from resilient_flows.workflow._mlcgen import (
        generate as generate,
    )
    from resilient_flows.workflow._monitoring import (
        visualize_note as visualize_note,
    )
    from resilient_flows.workflow._output_tails import OutputTails as OutputTails
    from resilient_flows.workflow._output_tails import failed_tails as failed_tails
    from resilient_flows.workflow._output_tails import logs_command as logs_command
    from resilient_flows.workflow._plan import (
        Plan as Plan,
    )
    from resilient_flows.workflow._plan import (
        plan_workflow as plan_workflow,
    )
    from resilient_flows.workflow._recorded_plan import (
        read_plan as read_plan,
    )
    from resilient_flows.workflow._recorded_plan import (
        run_members as run_members,
    )
    from resilient_flows.workflow._report import (
        member_notes as member_notes,
    )
    from resilient_flows.workflow._report import (
        stage_rows as stage_rows,
    )
    from resilient_flows.workflow._report import (
        stage_table as stage_table,
    )
    from resilient_flows.workflow._report import (
        status_table as status_table,
    )
    from resilient_flows.workflow._runner import (
        prepare_run as prepare_run,
    )
    from resilient_flows.workflow._runner import (
        resume_run as resume_run,
    )
    from resilient_flows.workflow._runner import (
        start_run as start_run,
    )
    from resilient_flows.workflow._status import (
        MemberStatus as MemberStatus,
    )
    from resilient_flows.workflow._status import (
        StatusTracker as StatusTracker,
    )
    from resilient_flows.workflow._status import (
        member_statuses as member_statuses,
    )
    from resilient_flows.workflow._status_json import (
        status_document as status_document,
    )
    from resilient_flows.workflow.schema import (
        Workflow as Workflow,
    )
    from resilient_flows.workflow.schema import (
        load_workflow as load_workflow,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
