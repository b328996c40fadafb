"""The run directory: the protocol between the runner, its members, the views and cloning.

Every name a run directory holds is spelled in :mod:`resilient_flows.rundir.layout` and nowhere
else; the rest of the code asks a :class:`RunLayout` or a :class:`TaskLayout` where things are.
"""

from resilient_flows.rundir.layout import RunLayout, TaskLayout, member_layout, run_layout, stage_layout

__all__ = ["RunLayout", "TaskLayout", "member_layout", "run_layout", "stage_layout"]
