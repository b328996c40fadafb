"""The training loop contract (:class:`TrainContext`), built-in workloads, and member runs; for
your own script, its run contract (:class:`RunContract`) and :func:`from_env`.

Nothing here imports Parsl: ``apps`` wraps :func:`run_member`, :func:`run_stage` and
:func:`evaluate_members`.

Names are imported on first use (PEP 562): importing one light submodule does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilient_flows.lazy import lazy_exports

if TYPE_CHECKING:
    from resilient_flows.errors import Preempted
    from resilient_flows.rundir.events import EventLog, read_events
    from resilient_flows.training.builtins import BUILTIN_WORKLOADS
    from resilient_flows.training.context import TrainContext
    from resilient_flows.training.contract import RunContract
    from resilient_flows.training.control import member_dir, request_preemption, request_retirement
    from resilient_flows.training.digest import state_digest
    from resilient_flows.training.distributed import (
        DistributedInfo,
        LaunchEnv,
        init_process_group,
        local_slice,
        read_launch_env,
        shutdown_process_group,
    )
    from resilient_flows.training.run import evaluate_members, run_member
    from resilient_flows.training.script import ScriptRun, from_env
    from resilient_flows.training.spec import CheckpointSpec, FaultSpec, MemberSpec, ParentSpec, StageSpec
    from resilient_flows.training.stage import run_stage, stage_dir
    from resilient_flows.training.workloads import Workload, load_dataset, resolve_workload

__all__ = [
    "BUILTIN_WORKLOADS",
    "CheckpointSpec",
    "DistributedInfo",
    "EventLog",
    "FaultSpec",
    "LaunchEnv",
    "MemberSpec",
    "ParentSpec",
    "Preempted",
    "RunContract",
    "ScriptRun",
    "StageSpec",
    "TrainContext",
    "Workload",
    "evaluate_members",
    "from_env",
    "init_process_group",
    "load_dataset",
    "local_slice",
    "member_dir",
    "read_events",
    "read_launch_env",
    "request_preemption",
    "request_retirement",
    "resolve_workload",
    "run_member",
    "run_stage",
    "shutdown_process_group",
    "stage_dir",
    "state_digest",
]


_SOURCES = {
    "resilient_flows.errors": ("Preempted",),
    "resilient_flows.training.context": ("TrainContext",),
    "resilient_flows.training.digest": ("state_digest",),
    "resilient_flows.training.contract": ("RunContract",),
    "resilient_flows.training.control": ("member_dir", "request_preemption", "request_retirement"),
    "resilient_flows.training.distributed": (
        "DistributedInfo",
        "LaunchEnv",
        "init_process_group",
        "local_slice",
        "read_launch_env",
        "shutdown_process_group",
    ),
    "resilient_flows.rundir.events": ("EventLog", "read_events"),
    "resilient_flows.training.run": ("evaluate_members", "run_member"),
    "resilient_flows.training.script": ("ScriptRun", "from_env"),
    "resilient_flows.training.spec": ("CheckpointSpec", "FaultSpec", "MemberSpec", "ParentSpec", "StageSpec"),
    "resilient_flows.training.stage": ("run_stage", "stage_dir"),
    "resilient_flows.training.builtins": ("BUILTIN_WORKLOADS",),
    "resilient_flows.training.workloads": ("Workload", "load_dataset", "resolve_workload"),
}

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES)
