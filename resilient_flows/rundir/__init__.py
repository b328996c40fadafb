"""The run directory: the protocol between the runner, its members, the views and cloning.

Every name a run directory holds is spelled in :mod:`resilient_flows.rundir._layout` and nowhere
else; the rest of the code asks a :class:`RunLayout` or a :class:`TaskLayout` where things are,
and reads and writes its files through them. The append-only logs and the plan have modules of their own:
:mod:`~resilient_flows.rundir._events` (the event log), :mod:`~resilient_flows.rundir._metrics`
(a member's metrics), :mod:`~resilient_flows.rundir._ledger` (the runners' blocks) and
:mod:`~resilient_flows.rundir._plan`. What readers find damaged they record in a
:class:`~resilient_flows.rundir._damage.DamageLog`, for the views to report.

Everything read from a run or checkpoint directory is read through one safe reader, exported
here: :func:`open_regular` (a regular file only: no symbolic link followed, never blocking on a
FIFO, never opening a device), :func:`read_capped` and :func:`read_json_capped` (size-capped),
:func:`parse_json` (nesting-capped) and :class:`CappedLines` (the append-only logs). It lives in
:mod:`resilient_flows.capped`, below this package, because ``checkpoint/`` reads its manifests and
heartbeats with it and must stay importable without the rest.

This package is below the runner, the members and the views: it imports none of them.
"""

from __future__ import annotations

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.capped": (
        "CappedLines",
        "open_regular",
        "parse_json",
        "read_capped",
        "read_json_capped",
    ),
    "resilient_flows.rundir._attemptlogs": (
        "TAIL_CAP",
        "attempt_logs",
        "copy_log",
        "failure_tail",
        "follow_log",
        "tail_lines",
    ),
    "resilient_flows.rundir._damage": (
        "Damage",
        "DamageLog",
    ),
    "resilient_flows.rundir._events": (
        "EventLog",
        "EventTail",
        "FULL_WAIT_S",
        "NO_CHECKPOINT",
        "read_events",
    ),
    "resilient_flows.rundir._files": ("read_json",),
    "resilient_flows.rundir._layout": (
        "RunLayout",
        "TaskLayout",
        "member_layout",
        "run_layout",
        "stage_layout",
    ),
    "resilient_flows.rundir._ledger": (
        "append_record",
        "read_records",
    ),
    "resilient_flows.rundir._metrics": (
        "MetricsLog",
        "MetricsReader",
    ),
    "resilient_flows.rundir._plan": (
        "encode_plan",
        "read_plan_document",
        "refuse_occupied",
        "write_plan",
    ),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
