"""resilient-flows: resilient machine-learning workflows on supercomputers, for Parsl.

Every public name is imported on first use (PEP 562), so that ``import resilient_flows`` costs
nothing: a compute node that only checkpoints does not import Parsl, and the command line's
``--help``, ``validate`` and ``status`` import neither Parsl nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilient_flows.lazy import lazy_exports

if TYPE_CHECKING:
    from resilient_flows.apps import (
        ResumingRetryHandler,
        analytics_app,
        command_app,
        mpi_resources,
        mpi_train_app,
        train_app,
    )
    from resilient_flows.checkpoint import (
        Checkpointer,
        CheckpointError,
        CheckpointInfo,
        CheckpointStats,
        CorruptCheckpointError,
        Stateful,
        StateMismatchError,
        TierSpec,
        TrainState,
        read_checkpoint,
    )
    from resilient_flows.clone import request_clone
    from resilient_flows.cosched import Decision, OnDemandRequest, RunningJob, decide, read_swf, simulate
    from resilient_flows.errors import (
        CloneError,
        InvalidJobError,
        LaunchError,
        ResilientFlowsError,
        SiteConfigError,
        WorkflowError,
    )
    from resilient_flows.sites import CobaltProvider, PatientBlockErrorHandler, load_site, site_facts
    from resilient_flows.training import (
        DistributedInfo,
        MemberSpec,
        Preempted,
        RunContract,
        TrainContext,
        from_env,
        init_process_group,
        run_member,
        shutdown_process_group,
    )
    from resilient_flows.workflow import Workflow, load_workflow, resume_run, start_run

__version__ = "0.1.0"

_SOURCES = {
    "resilient_flows.apps": (
        "ResumingRetryHandler",
        "analytics_app",
        "command_app",
        "mpi_resources",
        "mpi_train_app",
        "train_app",
    ),
    "resilient_flows.checkpoint": (
        "CheckpointError",
        "CheckpointInfo",
        "CheckpointStats",
        "Checkpointer",
        "CorruptCheckpointError",
        "StateMismatchError",
        "Stateful",
        "TierSpec",
        "TrainState",
        "read_checkpoint",
    ),
    "resilient_flows.clone": ("request_clone",),
    "resilient_flows.cosched": ("Decision", "OnDemandRequest", "RunningJob", "decide", "read_swf", "simulate"),
    "resilient_flows.errors": (
        "CloneError",
        "InvalidJobError",
        "LaunchError",
        "ResilientFlowsError",
        "SiteConfigError",
        "WorkflowError",
    ),
    "resilient_flows.sites": ("CobaltProvider", "PatientBlockErrorHandler", "load_site", "site_facts"),
    "resilient_flows.training": (
        "DistributedInfo",
        "MemberSpec",
        "Preempted",
        "RunContract",
        "TrainContext",
        "from_env",
        "init_process_group",
        "run_member",
        "shutdown_process_group",
    ),
    "resilient_flows.workflow": ("Workflow", "load_workflow", "resume_run", "start_run"),
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
    "PatientBlockErrorHandler",
    "Preempted",
    "ResilientFlowsError",
    "ResumingRetryHandler",
    "RunContract",
    "RunningJob",
    "SiteConfigError",
    "StateMismatchError",
    "Stateful",
    "TierSpec",
    "TrainContext",
    "TrainState",
    "Workflow",
    "WorkflowError",
    "__version__",
    "analytics_app",
    "command_app",
    "decide",
    "from_env",
    "init_process_group",
    "load_site",
    "load_workflow",
    "mpi_resources",
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

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES)
