"""resilient-flows: resilient machine-learning workflows on supercomputers, for Parsl.

The checkpoint engine and the training contract import without Parsl; the Parsl-facing names
(apps, sites, workflows) are imported on first use, so that ``import resilient_flows`` stays light
on a compute node that only checkpoints.
"""

from __future__ import annotations

import importlib
from typing import Any

from resilient_flows.checkpoint import (
    Checkpointer,
    CheckpointError,
    CheckpointInfo,
    CheckpointStats,
    CorruptCheckpointError,
    Stateful,
    StateMismatchError,
    TrainState,
    read_checkpoint,
)
from resilient_flows.errors import (
    CloneError,
    InvalidJobError,
    LaunchError,
    ResilientFlowsError,
    SiteConfigError,
    WorkflowError,
)
from resilient_flows.training import (
    DistributedInfo,
    MemberSpec,
    Preempted,
    TrainContext,
    init_process_group,
    run_member,
    shutdown_process_group,
)

__version__ = "0.1.0"

_LAZY = {
    "ResumingRetryHandler": "resilient_flows.apps",
    "analytics_app": "resilient_flows.apps",
    "mpi_train_app": "resilient_flows.apps",
    "train_app": "resilient_flows.apps",
    "CobaltProvider": "resilient_flows.sites",
    "load_site": "resilient_flows.sites",
    "site_facts": "resilient_flows.sites",
    "Workflow": "resilient_flows.workflow",
    "load_workflow": "resilient_flows.workflow",
    "resume_run": "resilient_flows.workflow",
    "start_run": "resilient_flows.workflow",
    "request_clone": "resilient_flows.clone",
    "Decision": "resilient_flows.cosched",
    "OnDemandRequest": "resilient_flows.cosched",
    "RunningJob": "resilient_flows.cosched",
    "decide": "resilient_flows.cosched",
    "read_swf": "resilient_flows.cosched",
    "simulate": "resilient_flows.cosched",
}

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointStats",
    "Checkpointer",
    "CloneError",
    "CobaltProvider",
    "CorruptCheckpointError",
    "Decision",
    "DistributedInfo",
    "InvalidJobError",
    "LaunchError",
    "MemberSpec",
    "OnDemandRequest",
    "Preempted",
    "ResilientFlowsError",
    "ResumingRetryHandler",
    "RunningJob",
    "SiteConfigError",
    "StateMismatchError",
    "Stateful",
    "TrainContext",
    "TrainState",
    "Workflow",
    "WorkflowError",
    "__version__",
    "analytics_app",
    "decide",
    "init_process_group",
    "load_site",
    "load_workflow",
    "mpi_train_app",
    "read_checkpoint",
    "read_swf",
    "request_clone",
    "resume_run",
    "run_member",
    "shutdown_process_group",
    "simulate",
    "site_facts",
    "start_run",
    "train_app",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'resilient_flows' has no attribute {name!r}")
