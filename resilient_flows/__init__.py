"""resilient-flows: resilient machine-learning workflows on supercomputers, for Parsl.

Every public name is imported on first use (PEP 562), so that ``import resilient_flows`` costs
nothing: a compute node that only checkpoints does not import Parsl, and the command line's
``--help``, ``validate`` and ``status`` import neither Parsl nor torch.
"""

from __future__ import annotations

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
        "simulate",
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

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES, defined=("__version__",))
