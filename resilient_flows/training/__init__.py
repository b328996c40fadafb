"""The training loop contract (:class:`TrainContext`), built-in workloads, and member runs.

Nothing here imports Parsl: ``apps`` wraps :func:`run_member`, :func:`run_stage` and
:func:`evaluate_members`.
"""

from resilient_flows.training.context import Preempted, TrainContext, state_digest
from resilient_flows.training.control import member_dir, request_preemption, request_retirement
from resilient_flows.training.distributed import (
    DistributedInfo,
    LaunchEnv,
    init_process_group,
    local_slice,
    read_launch_env,
    shutdown_process_group,
)
from resilient_flows.training.events import EventLog, read_events
from resilient_flows.training.run import evaluate_members, run_member
from resilient_flows.training.spec import CheckpointSpec, FaultSpec, MemberSpec, ParentSpec, StageSpec
from resilient_flows.training.stage import run_stage, stage_dir
from resilient_flows.training.workloads import BUILTIN_WORKLOADS, Workload, load_dataset, resolve_workload

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
    "StageSpec",
    "TrainContext",
    "Workload",
    "evaluate_members",
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
