"""Workflows: a YAML file describing an ensemble, validated, planned onto a site, run through Parsl.

``run`` creates a run directory and submits every member; ``resume`` continues one; ``status``
reads one. Everything is recorded in the run directory, so any of them can happen in a later
session, from another login node.
"""

from resilient_flows.workflow.rundir import Plan, read_plan
from resilient_flows.workflow.runner import plan_workflow, resume_run, start_run
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
