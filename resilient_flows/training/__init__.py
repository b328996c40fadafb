"""The training loop contract (:class:`TrainContext`), built-in workloads, and member runs; for
your own script, its run contract (:class:`RunContract`) and :func:`from_env`.

Nothing here imports Parsl: ``apps`` wraps :func:`run_member`, :func:`run_stage` and
:func:`evaluate_members`.

Names are imported on first use (PEP 562): importing one light submodule does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
        "preloaded_modules",
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
    "resilient_flows.training._members": (
        "latest_committed_step",
        "read_spec",
        "register_member",
        "registered_members",
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
    "resilient_flows.training._faults": (
        "PEER_LOST",
        "POOL_LOST",
        "attempt_fault",
        "record_fault",
        "record_pool_lost",
        "record_pool_seen_lost",
    ),
    "resilient_flows.training._functions": ("import_function",),
    "resilient_flows.training._nodefile": ("pbs_hosts",),
    "resilient_flows.training._pool": ("pool_exited", "pool_process_gone"),
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

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.errors import (
        Preempted as Preempted,
    )
    from resilient_flows.rundir import (
        EventLog as EventLog,
    )
    from resilient_flows.rundir import (
        read_events as read_events,
    )
    from resilient_flows.training._builtins import (
        BUILTIN_PARAMS as BUILTIN_PARAMS,
    )
    from resilient_flows.training._builtins import (
        BUILTIN_WORKLOADS as BUILTIN_WORKLOADS,
    )
    from resilient_flows.training._builtins import (
        STRUCTURAL as STRUCTURAL,
    )
    from resilient_flows.training._builtins import (
        CNNParams as CNNParams,
    )
    from resilient_flows.training._builtins import (
        MLPParams as MLPParams,
    )
    from resilient_flows.training._builtins import (
        preloaded_modules as preloaded_modules,
    )
    from resilient_flows.training._command import (
        DEFAULT_GRACE_S as DEFAULT_GRACE_S,
    )
    from resilient_flows.training._command import (
        CommandKilled as CommandKilled,
    )
    from resilient_flows.training._command import (
        run_command as run_command,
    )
    from resilient_flows.training._command_line import (
        check_command as check_command,
    )
    from resilient_flows.training._command_line import (
        fill_command as fill_command,
    )
    from resilient_flows.training._context import (
        TrainContext as TrainContext,
    )
    from resilient_flows.training._contract import (
        ENV_NAMES as ENV_NAMES,
    )
    from resilient_flows.training._contract import (
        EXIT_CANNOT_RUN as EXIT_CANNOT_RUN,
    )
    from resilient_flows.training._contract import (
        EXIT_PEER_LOST as EXIT_PEER_LOST,
    )
    from resilient_flows.training._contract import (
        EXIT_PREEMPTED as EXIT_PREEMPTED,
    )
    from resilient_flows.training._contract import (
        RunContract as RunContract,
    )
    from resilient_flows.training._digest import (
        state_digest as state_digest,
    )
    from resilient_flows.training._distributed import (
        DistributedInfo as DistributedInfo,
    )
    from resilient_flows.training._distributed import (
        LaunchEnv as LaunchEnv,
    )
    from resilient_flows.training._distributed import (
        init_process_group as init_process_group,
    )
    from resilient_flows.training._distributed import (
        local_slice as local_slice,
    )
    from resilient_flows.training._distributed import (
        read_launch_env as read_launch_env,
    )
    from resilient_flows.training._distributed import (
        shutdown_process_group as shutdown_process_group,
    )
    from resilient_flows.training._faults import (
        PEER_LOST as PEER_LOST,
    )
    from resilient_flows.training._faults import (
        POOL_LOST as POOL_LOST,
    )
    from resilient_flows.training._faults import (
        attempt_fault as attempt_fault,
    )
    from resilient_flows.training._faults import (
        record_fault as record_fault,
    )
    from resilient_flows.training._faults import (
        record_pool_lost as record_pool_lost,
    )
    from resilient_flows.training._faults import (
        record_pool_seen_lost as record_pool_seen_lost,
    )
    from resilient_flows.training._functions import (
        import_function as import_function,
    )
    from resilient_flows.training._loader import DataPositions as DataPositions
    from resilient_flows.training._loader import ResumableLoader as ResumableLoader
    from resilient_flows.training._members import (
        latest_committed_step as latest_committed_step,
    )
    from resilient_flows.training._members import (
        read_spec as read_spec,
    )
    from resilient_flows.training._members import (
        register_member as register_member,
    )
    from resilient_flows.training._members import (
        registered_members as registered_members,
    )
    from resilient_flows.training._nodefile import (
        pbs_hosts as pbs_hosts,
    )
    from resilient_flows.training._params import (
        check_params as check_params,
    )
    from resilient_flows.training._params import (
        declared_names as declared_names,
    )
    from resilient_flows.training._params import (
        declared_params as declared_params,
    )
    from resilient_flows.training._params import (
        params_problem as params_problem,
    )
    from resilient_flows.training._params import (
        signature_params as signature_params,
    )
    from resilient_flows.training._params import (
        with_defaults as with_defaults,
    )
    from resilient_flows.training._pool import pool_exited as pool_exited
    from resilient_flows.training._pool import pool_process_gone as pool_process_gone
    from resilient_flows.training._probe import (
        LOOP as LOOP,
    )
    from resilient_flows.training._probe import (
        PROBE_TIMEOUT_S as PROBE_TIMEOUT_S,
    )
    from resilient_flows.training._probe import (
        FunctionCheck as FunctionCheck,
    )
    from resilient_flows.training._probe import (
        Problem as Problem,
    )
    from resilient_flows.training._probe import (
        probe_functions as probe_functions,
    )
    from resilient_flows.training._run import (
        evaluate_members as evaluate_members,
    )
    from resilient_flows.training._run import (
        run_member as run_member,
    )
    from resilient_flows.training._script import (
        ScriptRun as ScriptRun,
    )
    from resilient_flows.training._script import (
        from_env as from_env,
    )
    from resilient_flows.training._spec import (
        OPTIMIZER_KEYS as OPTIMIZER_KEYS,
    )
    from resilient_flows.training._spec import (
        PARALLEL_MODES as PARALLEL_MODES,
    )
    from resilient_flows.training._spec import (
        FaultSpec as FaultSpec,
    )
    from resilient_flows.training._spec import (
        MemberSpec as MemberSpec,
    )
    from resilient_flows.training._spec import (
        ParentSpec as ParentSpec,
    )
    from resilient_flows.training._spec import (
        StageSpec as StageSpec,
    )
    from resilient_flows.training._stage import (
        STAGE_ARGUMENTS as STAGE_ARGUMENTS,
    )
    from resilient_flows.training._stage import (
        newest_iteration as newest_iteration,
    )
    from resilient_flows.training._stage import (
        run_stage as run_stage,
    )
    from resilient_flows.training._stage import (
        stage_dir as stage_dir,
    )
    from resilient_flows.training._stage import (
        stage_finished as stage_finished,
    )
    from resilient_flows.training._stage import (
        stage_output as stage_output,
    )
    from resilient_flows.training._stream import StreamLoader as StreamLoader
    from resilient_flows.training._walltime import (
        BlockTimes as BlockTimes,
    )
    from resilient_flows.training._walltime import (
        Pace as Pace,
    )
    from resilient_flows.training._walltime import (
        declined_attempt as declined_attempt,
    )
    from resilient_flows.training._walltime import (
        drain_margin_s as drain_margin_s,
    )
    from resilient_flows.training._workloads import (
        Workload as Workload,
    )
    from resilient_flows.training._workloads import (
        batch_indices as batch_indices,
    )
    from resilient_flows.training._workloads import (
        check_call as check_call,
    )
    from resilient_flows.training._workloads import (
        load_dataset as load_dataset,
    )
    from resilient_flows.training._workloads import (
        resolve_workload as resolve_workload,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
