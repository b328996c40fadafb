"""The training loop contract (:class:`TrainContext`), built-in workloads, and member runs; for
your own script, its run contract (:class:`RunContract`) and :func:`from_env`.

Nothing here imports Parsl: ``apps`` wraps :func:`run_member`, :func:`run_stage` and
:func:`evaluate_members`.

Names are imported on first use (PEP 562): importing one light submodule does not import torch.
"""

from __future__ import annotations

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.errors": ("Preempted",),
    "resilient_flows.rundir": (
        "EventLog",
        "read_events",
    ),
    "resilient_flows.training._builtins": (
        "BUILTIN_PARAMS",
        "BUILTIN_WORKLOADS",
        "CNNParams",
        "MLPParams",
        "STRUCTURAL",
    ),
    "resilient_flows.training._command": (
        "CommandKilled",
        "DEFAULT_GRACE_S",
        "run_command",
    ),
    "resilient_flows.training._command_line": (
        "check_command",
        "fill_command",
    ),
    "resilient_flows.training._context": ("TrainContext",),
    "resilient_flows.training._loader": ("DataPositions", "ResumableLoader"),
    "resilient_flows.training._stream": ("StreamLoader",),
    "resilient_flows.training._contract": (
        "ENV_NAMES",
        "EXIT_CANNOT_RUN",
        "EXIT_PEER_LOST",
        "EXIT_PREEMPTED",
        "RunContract",
    ),
    "resilient_flows.training._control": (
        "CloneOrder",
        "clone_order_path",
        "has_result",
        "latest_committed_step",
        "member_dir",
        "read_spec",
        "register_member",
        "registered_members",
        "request_preemption",
        "request_retirement",
        "write_clone_order",
    ),
    "resilient_flows.training._digest": ("state_digest",),
    "resilient_flows.training._distributed": (
        "DistributedInfo",
        "LaunchEnv",
        "init_process_group",
        "local_slice",
        "read_launch_env",
        "shutdown_process_group",
    ),
    "resilient_flows.training._faults": ("PEER_LOST", "POOL_LOST", "attempt_fault", "record_fault", "record_pool_lost"),
    "resilient_flows.training._functions": ("import_function",),
    "resilient_flows.training._heartbeat": (
        "BEAT_S",
        "Heartbeat",
        "analytics_task",
        "heartbeat_path",
        "read_heartbeat",
    ),
    "resilient_flows.training._lease": (
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
    "resilient_flows.training._nodefile": ("pbs_hosts",),
    "resilient_flows.training._params": (
        "check_params",
        "declared_names",
        "declared_params",
        "params_problem",
        "signature_params",
        "with_defaults",
    ),
    "resilient_flows.training._probe": (
        "LOOP",
        "FunctionCheck",
        "PROBE_TIMEOUT_S",
        "Problem",
        "probe_functions",
    ),
    "resilient_flows.training._run": (
        "evaluate_members",
        "run_member",
    ),
    "resilient_flows.training._script": (
        "ScriptRun",
        "from_env",
    ),
    "resilient_flows.training._spec": (
        "CheckpointSpec",
        "FaultSpec",
        "MemberSpec",
        "OPTIMIZER_KEYS",
        "PARALLEL_MODES",
        "ParentSpec",
        "StageSpec",
    ),
    "resilient_flows.training._stage": (
        "STAGE_ARGUMENTS",
        "newest_iteration",
        "run_stage",
        "stage_dir",
        "stage_finished",
        "stage_output",
    ),
    "resilient_flows.training._walltime": (
        "BlockTimes",
        "Pace",
        "declined_attempt",
        "drain_margin_s",
    ),
    "resilient_flows.training._workloads": (
        "Workload",
        "batch_indices",
        "check_call",
        "load_dataset",
        "resolve_workload",
    ),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
