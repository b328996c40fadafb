"""resilient-flows: resilient machine-learning workflows on supercomputers, for Parsl.

Every public name is imported on first use (PEP 562), so that ``import resilient_flows`` costs
nothing: a compute node that only checkpoints does not import Parsl, and the command line's
``--help``, ``validate`` and ``status`` import neither Parsl nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilient_flows.lazy import lazy_exports

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
        "CheckpointConfig",
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
    "resilient_flows.cosched": (
        "Decision",
        "OnDemandRequest",
        "RunningJob",
        "decide",
        "read_swf",
        "simulate_trace",
    ),
    "resilient_flows.errors": (
        "CloneError",
        "InvalidJobError",
        "LaunchError",
        "ResilientFlowsError",
        "SiteConfigError",
        "WorkflowError",
        "WorkloadError",
    ),
    "resilient_flows.sites": (
        "CobaltProvider",
        "PatientBlockErrorHandler",
        "load_site",
        "site_facts",
    ),
    "resilient_flows.training": (
        "DistributedInfo",
        "MemberSpec",
        "Preempted",
        "ResumableLoader",
        "RunContract",
        "TrainContext",
        "from_env",
        "init_process_group",
        "run_member",
        "shutdown_process_group",
    ),
    "resilient_flows.workflow": (
        "Workflow",
        "load_workflow",
        "resume_run",
        "start_run",
    ),
    "resilient_flows.workflow.dashboard": (
        "RunModel",
        "serve_dashboard",
        "write_dashboard_report",
    ),
}

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.apps import (
        ResumingRetryHandler as ResumingRetryHandler,
    )
    from resilient_flows.apps import (
        analytics_app as analytics_app,
    )
    from resilient_flows.apps import (
        command_app as command_app,
    )
    from resilient_flows.apps import (
        mpi_resources as mpi_resources,
    )
    from resilient_flows.apps import (
        mpi_train_app as mpi_train_app,
    )
    from resilient_flows.apps import (
        train_app as train_app,
    )
    from resilient_flows.checkpoint import (
        CheckpointConfig as CheckpointConfig,
    )
    from resilient_flows.checkpoint import (
        Checkpointer as Checkpointer,
    )
    from resilient_flows.checkpoint import (
        CheckpointError as CheckpointError,
    )
    from resilient_flows.checkpoint import (
        CheckpointInfo as CheckpointInfo,
    )
    from resilient_flows.checkpoint import (
        CheckpointStats as CheckpointStats,
    )
    from resilient_flows.checkpoint import (
        CorruptCheckpointError as CorruptCheckpointError,
    )
    from resilient_flows.checkpoint import (
        Stateful as Stateful,
    )
    from resilient_flows.checkpoint import (
        StateMismatchError as StateMismatchError,
    )
    from resilient_flows.checkpoint import (
        TierSpec as TierSpec,
    )
    from resilient_flows.checkpoint import (
        TrainState as TrainState,
    )
    from resilient_flows.checkpoint import (
        read_checkpoint as read_checkpoint,
    )
    from resilient_flows.clone import (
        request_clone as request_clone,
    )
    from resilient_flows.cosched import (
        Decision as Decision,
    )
    from resilient_flows.cosched import (
        OnDemandRequest as OnDemandRequest,
    )
    from resilient_flows.cosched import (
        RunningJob as RunningJob,
    )
    from resilient_flows.cosched import (
        decide as decide,
    )
    from resilient_flows.cosched import (
        read_swf as read_swf,
    )
    from resilient_flows.cosched import (
        simulate_trace as simulate_trace,
    )
    from resilient_flows.errors import (
        CloneError as CloneError,
    )
    from resilient_flows.errors import (
        InvalidJobError as InvalidJobError,
    )
    from resilient_flows.errors import (
        LaunchError as LaunchError,
    )
    from resilient_flows.errors import (
        ResilientFlowsError as ResilientFlowsError,
    )
    from resilient_flows.errors import (
        SiteConfigError as SiteConfigError,
    )
    from resilient_flows.errors import (
        WorkflowError as WorkflowError,
    )
    from resilient_flows.errors import (
        WorkloadError as WorkloadError,
    )
    from resilient_flows.sites import (
        CobaltProvider as CobaltProvider,
    )
    from resilient_flows.sites import (
        PatientBlockErrorHandler as PatientBlockErrorHandler,
    )
    from resilient_flows.sites import (
        load_site as load_site,
    )
    from resilient_flows.sites import (
        site_facts as site_facts,
    )
    from resilient_flows.training import (
        DistributedInfo as DistributedInfo,
    )
    from resilient_flows.training import (
        MemberSpec as MemberSpec,
    )
    from resilient_flows.training import (
        Preempted as Preempted,
    )
    from resilient_flows.training import ResumableLoader as ResumableLoader
    from resilient_flows.training import (
        RunContract as RunContract,
    )
    from resilient_flows.training import (
        TrainContext as TrainContext,
    )
    from resilient_flows.training import (
        from_env as from_env,
    )
    from resilient_flows.training import (
        init_process_group as init_process_group,
    )
    from resilient_flows.training import (
        run_member as run_member,
    )
    from resilient_flows.training import (
        shutdown_process_group as shutdown_process_group,
    )
    from resilient_flows.workflow import (
        Workflow as Workflow,
    )
    from resilient_flows.workflow import (
        load_workflow as load_workflow,
    )
    from resilient_flows.workflow import (
        resume_run as resume_run,
    )
    from resilient_flows.workflow import (
        start_run as start_run,
    )
    from resilient_flows.workflow.dashboard import (
        RunModel as RunModel,
    )
    from resilient_flows.workflow.dashboard import (
        serve_dashboard as serve_dashboard,
    )
    from resilient_flows.workflow.dashboard import (
        write_dashboard_report as write_dashboard_report,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES, defined=("__version__",))
