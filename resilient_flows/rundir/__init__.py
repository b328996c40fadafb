"""The run directory: the protocol between the runner, its members, the views and cloning.

Every name a run directory holds is spelled in :mod:`resilient_flows.rundir._layout` and nowhere
else; the rest of the code asks a :class:`RunLayout` or a :class:`TaskLayout` where things are,
and reads and writes its files through them. The append-only logs and the plan file have modules of their own:
:mod:`~resilient_flows.rundir._events` (the event log), :mod:`~resilient_flows.rundir._metrics`
(a member's metrics), :mod:`~resilient_flows.rundir._ledger` (the runners' blocks) and
:mod:`~resilient_flows.rundir._planfile`. What readers find damaged they record in a
:class:`~resilient_flows.rundir._damage.DamageLog`, for the views to report.

The runner-member protocol lives here too, writers and readers together:
:mod:`~resilient_flows.rundir._lease` (the runner's lease, by which members and the runner's guard
tell that the runner is gone), :mod:`~resilient_flows.rundir._control` (requests to a running
member: stop, retire, clone) and :mod:`~resilient_flows.rundir._heartbeat` (each running attempt's
heartbeat, by which the runner tells a live attempt from a dead or silent one), with the Parsl
block they name (:mod:`~resilient_flows.rundir._block`).

Everything read from a run or checkpoint directory is read through one safe reader, exported
here: :func:`open_regular` (a regular file only: no symbolic link followed, never blocking on a
FIFO, never opening a device), :func:`read_capped` and :func:`read_json_capped` (size-capped),
:func:`parse_json` (nesting-capped) and :class:`CappedLines` (the append-only logs). It lives in
:mod:`resilient_flows.capped`, below this package, because ``checkpoint/`` reads its manifests and
heartbeats with it and must stay importable without the rest.

This package is below the runner, the members and the views: it imports none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    "resilient_flows.rundir._block": (
        "BLOCK_ENV",
        "current_block",
    ),
    "resilient_flows.rundir._control": (
        "CloneOrder",
        "clone_order_path",
        "request_preemption",
        "request_retirement",
        "write_clone_order",
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
        "ROOM_LOOK_S",
        "read_events",
        "wait_for_room",
    ),
    "resilient_flows.rundir._files": ("read_json",),
    "resilient_flows.rundir._heartbeat": (
        "BEAT_S",
        "Heartbeat",
        "PoolLook",
        "analytics_task",
        "attempt_heartbeat_path",
        "read_attempt_heartbeat",
    ),
    "resilient_flows.rundir._layout": (
        "RunLayout",
        "TaskLayout",
        "count_attempt",
        "has_result",
        "member_dir",
        "member_layout",
        "run_layout",
        "stage_layout",
    ),
    "resilient_flows.rundir._lease": (
        "DEFAULT_ORPHAN_TIMEOUT_S",
        "LeaseRenewer",
        "MIN_ORPHAN_TIMEOUT_S",
        "RENEW_S",
        "RunnerLease",
        "TOKEN_ENV",
        "end_lease",
        "holding_runner",
        "process_start_time",
        "read_lease",
        "stat_fields",
        "superseded",
    ),
    "resilient_flows.rundir._ledger": (
        "append_record",
        "read_records",
    ),
    "resilient_flows.rundir._metrics": (
        "MetricsLog",
        "MetricsReader",
    ),
    "resilient_flows.rundir._planfile": (
        "encode_plan",
        "read_plan_document",
        "refuse_occupied",
        "write_plan",
    ),
}

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.capped import (
        CappedLines as CappedLines,
    )
    from resilient_flows.capped import (
        open_regular as open_regular,
    )
    from resilient_flows.capped import (
        parse_json as parse_json,
    )
    from resilient_flows.capped import (
        read_capped as read_capped,
    )
    from resilient_flows.capped import (
        read_json_capped as read_json_capped,
    )
    from resilient_flows.rundir._attemptlogs import TAIL_CAP as TAIL_CAP
    from resilient_flows.rundir._attemptlogs import attempt_logs as attempt_logs
    from resilient_flows.rundir._attemptlogs import copy_log as copy_log
    from resilient_flows.rundir._attemptlogs import failure_tail as failure_tail
    from resilient_flows.rundir._attemptlogs import follow_log as follow_log
    from resilient_flows.rundir._attemptlogs import tail_lines as tail_lines
    from resilient_flows.rundir._block import BLOCK_ENV as BLOCK_ENV
    from resilient_flows.rundir._block import current_block as current_block
    from resilient_flows.rundir._control import CloneOrder as CloneOrder
    from resilient_flows.rundir._control import clone_order_path as clone_order_path
    from resilient_flows.rundir._control import request_preemption as request_preemption
    from resilient_flows.rundir._control import request_retirement as request_retirement
    from resilient_flows.rundir._control import write_clone_order as write_clone_order
    from resilient_flows.rundir._damage import (
        Damage as Damage,
    )
    from resilient_flows.rundir._damage import (
        DamageLog as DamageLog,
    )
    from resilient_flows.rundir._events import (
        FULL_WAIT_S as FULL_WAIT_S,
    )
    from resilient_flows.rundir._events import (
        NO_CHECKPOINT as NO_CHECKPOINT,
    )
    from resilient_flows.rundir._events import (
        ROOM_LOOK_S as ROOM_LOOK_S,
    )
    from resilient_flows.rundir._events import (
        EventLog as EventLog,
    )
    from resilient_flows.rundir._events import (
        EventTail as EventTail,
    )
    from resilient_flows.rundir._events import (
        read_events as read_events,
    )
    from resilient_flows.rundir._events import (
        wait_for_room as wait_for_room,
    )
    from resilient_flows.rundir._files import (
        read_json as read_json,
    )
    from resilient_flows.rundir._heartbeat import BEAT_S as BEAT_S
    from resilient_flows.rundir._heartbeat import Heartbeat as Heartbeat
    from resilient_flows.rundir._heartbeat import PoolLook as PoolLook
    from resilient_flows.rundir._heartbeat import analytics_task as analytics_task
    from resilient_flows.rundir._heartbeat import attempt_heartbeat_path as attempt_heartbeat_path
    from resilient_flows.rundir._heartbeat import read_attempt_heartbeat as read_attempt_heartbeat
    from resilient_flows.rundir._layout import (
        RunLayout as RunLayout,
    )
    from resilient_flows.rundir._layout import (
        TaskLayout as TaskLayout,
    )
    from resilient_flows.rundir._layout import count_attempt as count_attempt
    from resilient_flows.rundir._layout import has_result as has_result
    from resilient_flows.rundir._layout import member_dir as member_dir
    from resilient_flows.rundir._layout import (
        member_layout as member_layout,
    )
    from resilient_flows.rundir._layout import (
        run_layout as run_layout,
    )
    from resilient_flows.rundir._layout import (
        stage_layout as stage_layout,
    )
    from resilient_flows.rundir._lease import DEFAULT_ORPHAN_TIMEOUT_S as DEFAULT_ORPHAN_TIMEOUT_S
    from resilient_flows.rundir._lease import MIN_ORPHAN_TIMEOUT_S as MIN_ORPHAN_TIMEOUT_S
    from resilient_flows.rundir._lease import RENEW_S as RENEW_S
    from resilient_flows.rundir._lease import TOKEN_ENV as TOKEN_ENV
    from resilient_flows.rundir._lease import LeaseRenewer as LeaseRenewer
    from resilient_flows.rundir._lease import RunnerLease as RunnerLease
    from resilient_flows.rundir._lease import end_lease as end_lease
    from resilient_flows.rundir._lease import holding_runner as holding_runner
    from resilient_flows.rundir._lease import process_start_time as process_start_time
    from resilient_flows.rundir._lease import read_lease as read_lease
    from resilient_flows.rundir._lease import stat_fields as stat_fields
    from resilient_flows.rundir._lease import superseded as superseded
    from resilient_flows.rundir._ledger import (
        append_record as append_record,
    )
    from resilient_flows.rundir._ledger import (
        read_records as read_records,
    )
    from resilient_flows.rundir._metrics import (
        MetricsLog as MetricsLog,
    )
    from resilient_flows.rundir._metrics import (
        MetricsReader as MetricsReader,
    )
    from resilient_flows.rundir._planfile import (
        encode_plan as encode_plan,
    )
    from resilient_flows.rundir._planfile import (
        read_plan_document as read_plan_document,
    )
    from resilient_flows.rundir._planfile import (
        refuse_occupied as refuse_occupied,
    )
    from resilient_flows.rundir._planfile import (
        write_plan as write_plan,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
