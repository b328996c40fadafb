"""The run directory: the protocol between the runner, its members, the views and cloning.

Every name a run directory holds is spelled in :mod:`resilient_flows.rundir.layout` and nowhere
else; the rest of the code asks a :class:`RunLayout` or a :class:`TaskLayout` where things are,
and reads and writes its files through them. The append-only logs and the plan have modules of
their own: :mod:`~resilient_flows.rundir.events` (the event log), :mod:`~resilient_flows.rundir.metrics`
(a member's metrics), :mod:`~resilient_flows.rundir.ledger` (the runners' blocks) and
:mod:`~resilient_flows.rundir.plan`.

This package is below the runner, the members and the views: it imports none of them.
"""

from resilient_flows.rundir.layout import RunLayout, TaskLayout, member_layout, run_layout, stage_layout

__all__ = ["RunLayout", "TaskLayout", "member_layout", "run_layout", "stage_layout"]
