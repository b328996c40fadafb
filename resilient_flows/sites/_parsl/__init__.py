"""Everything resilient-flows relies on inside Parsl, in one package: no other module touches a
private attribute or an internal behaviour of Parsl (a test scans for the names in
:data:`PARSL_INTERNALS`).

Parsl's public interface (``Config``, executors, providers, ``python_app``, a retry handler given
the task's record, a block error handler given the executor and its blocks' status) covers a
workflow that Parsl runs to its end. Surviving the faults it does not notice, or notices late,
takes more; each use below is needed for one such fault, and is made in one function.

Tested with Parsl :data:`TESTED_PARSL`; the dependency's range is :data:`PARSL_RANGE` (the same
in ``pyproject.toml``: a test compares them). Importing this package checks the installed Parsl
against it and raises :class:`~resilient_flows.errors.UnsupportedParslError` outside it, before
anything relies on an internal that may have changed: a Parsl release changes HTEX's internals
without notice, and an unknown one would fail later, deep in a run, or worse run differently.

The worker pool (:mod:`._pool`, warm workers: :mod:`resilient_flows.sites._warmpool`), inside
the pool's process:

- ``parsl.executors.high_throughput.process_worker_pool``: its module globals ``SpawnContext``,
  ``Manager``, ``worker`` and ``args``, and its ``__main__`` block, run unchanged with the first
  two replaced: workers forked from a preloaded fork server instead of spawned;
- ``Manager._stop_event`` (a ``threading.Event``) replaced by one whose timed wait also wakes
  when a worker exits, so that ``worker_watchdog`` reports a lost worker at once;
- ``Manager._tasks_in_progress`` and ``pending_result_queue``: a hung worker's task taken from
  the pool's books and reported as ``WorkerHung``, as the watchdog reports a dead worker's;
- ``DEFAULT_LAUNCH_CMD`` starting with ``process_worker_pool.py``: the warm launch command keeps
  its arguments. The pool process is named by that module on its command line, which an attempt
  reads from ``/proc`` to see its pool gone (:mod:`resilient_flows.training._pool`, on the
  worker's side, imports nothing of this package: a test keeps the two names the same).

The executor, interchange and providers (:mod:`._executor`), in the runner:

- ``HighThroughputExecutor.interchange_proc``: whether the interchange exited (the watchdog, a
  hold, an abandoned instance), its pid (the block ledger), killing it; Parsl never looks;
- ``command_client.run("MANAGERS")`` and ``["HOLD_MANAGER", id]`` with a timeout, and
  ``command_client.ok``: the managers' blocks and tasks (silent blocks, drained blocks) and
  holds that cannot hang the runner, as Parsl's own calls without a timeout would;
- ``_hold_block``: a block's managers held before it is cancelled (lost, drained);
- ``_status`` and ``_simulated_status`` set to ``SCALED_IN`` for a block the runner cancelled, as
  ``scale_in_facade`` does, so that the block error handler counts no failure;
- ``connected_managers`` and ``connected_blocks`` replaced by ``list`` on an executor whose
  interchange is lost, so that Parsl's shutdown does not wait for it, and the ``close`` of its
  ``outgoing_q`` and ``command_client`` by nothing: a retry's launch blocked sending to the lost
  interchange would abort the process when its socket is closed under it;
- ``blocks_to_job_id``, ``job_ids_to_block``, ``_status``, ``_simulated_status``,
  ``_block_id_counter`` and ``_get_launch_command``: a waiting standby block moved from a lost
  Parsl instance to the next (:mod:`resilient_flows.workflow._standby`);
- a provider's ``resources`` (job id -> record; a LocalProvider's ``remote_pid`` and
  ``script_path``): a provider cancels only the jobs recorded there, so jobs of earlier runners
  are recorded before they are cancelled, and a local block's processes are found by its pid.

The DataFlowKernel (:mod:`._dfk`), in the runner:

- ``task_record["exec_fu"]``, ``["executor"]`` and ``["try_time_launched"]``: a lost block's tasks
  failed at once with ``ManagerLost`` (:mod:`resilient_flows.workflow._failfast`), the executor
  future made to ignore the interchange's later report of the same loss;
- a retry launched with the record's ``kwargs`` and ``resource_specification``: the retry
  handler sets a backoff and a priority there;
- ``job_status_poller`` (its ``callback`` and ``make_callback``): one scaling pass made as the
  instance starts, so that its initial blocks are submitted at once, not a ``strategy_period``
  later;
- ``cleanup_called``: a second shutdown refused; the loggers Parsl attaches its log files to
  (``parsl``, ``concurrent.futures``), closed after a shutdown; its task failures logged on
  :data:`DFK_LOGGER`.
"""

from __future__ import annotations

from resilient_flows.sites._parsl._version import PARSL_RANGE, TESTED_PARSL, check_parsl

check_parsl()  # before anything below imports a part of Parsl that may have moved


from resilient_flows.sites._parsl._dfk import (  # noqa: E402
    DFK_LOGGER,
    CurrentTry,
    close_parsl_logs,
    current_try,
    fail_try,
    parsl_file_logs,
    quiet_when_full,
    retry_with_kwarg,
    retry_with_priority,
    shutdown_started,
    start_initial_blocks,
)
from resilient_flows.sites._parsl._executor import (  # noqa: E402
    ANSWER_S,
    HOLD_ANSWER_S,
    HOLD_LOOK_S,
    add_block,
    block_launch_command,
    disconnect,
    foreign_job,
    hold_block,
    hold_managers,
    interchange_answers,
    interchange_exit,
    interchange_launch_cmd,
    interchange_managers,
    interchange_pid,
    job_record,
    kill_interchange,
    local_job_pid,
    local_job_script,
    mark_scaled_in,
    record_pid,
    run_interchange,
    set_job_record,
    take_block,
    watch_interchange_starts,
)
from resilient_flows.sites._parsl._pool import (  # noqa: E402
    DEFAULT_PRELOAD,
    POOL_MODULE,
    POOL_PRELOAD,
    POOL_SCRIPT,
    STANDBY_FLAG,
    TRAINING_PRELOAD,
    WARM_MODULE,
    go_file,
    is_standby,
    is_warm,
    read_go,
    run_pool,
    set_preload,
    split_argv,
    tell_go,
    warm_launch_cmd,
)

#: The attribute names, record keys and module paths of Parsl's internals above: no module of
#: resilient-flows outside this package names one (``tests/test_parsl_adapter.py`` scans them).
PARSL_INTERNALS = frozenset(
    {
        "_block_id_counter",
        "_get_launch_command",
        "_hold_block",
        "_simulated_status",
        "_status",
        "_stop_event",
        "_tasks_in_progress",
        "cleanup_called",
        "command_client",
        "connected_blocks",
        "connected_managers",
        "outgoing_q",
        "zmq_context",
        "zmq_socket",
        "exec_fu",
        "interchange_proc",
        "job_status_poller",
        "job_ids_to_block",
        "remote_pid",
        "HOLD_MANAGER",
        "MANAGERS",
        DFK_LOGGER,
        POOL_MODULE,
        "parsl.executors.high_throughput.interchange",
        "parsl.executors.high_throughput.zmq_pipes",
    }
)

__all__ = [
    "ANSWER_S",
    "DEFAULT_PRELOAD",
    "DFK_LOGGER",
    "HOLD_ANSWER_S",
    "HOLD_LOOK_S",
    "PARSL_INTERNALS",
    "PARSL_RANGE",
    "POOL_MODULE",
    "POOL_PRELOAD",
    "POOL_SCRIPT",
    "STANDBY_FLAG",
    "TESTED_PARSL",
    "TRAINING_PRELOAD",
    "WARM_MODULE",
    "CurrentTry",
    "add_block",
    "block_launch_command",
    "check_parsl",
    "close_parsl_logs",
    "current_try",
    "disconnect",
    "fail_try",
    "foreign_job",
    "go_file",
    "hold_block",
    "hold_managers",
    "interchange_answers",
    "interchange_exit",
    "interchange_launch_cmd",
    "interchange_managers",
    "interchange_pid",
    "is_standby",
    "is_warm",
    "job_record",
    "kill_interchange",
    "local_job_pid",
    "local_job_script",
    "mark_scaled_in",
    "parsl_file_logs",
    "quiet_when_full",
    "read_go",
    "record_pid",
    "retry_with_kwarg",
    "retry_with_priority",
    "run_interchange",
    "run_pool",
    "set_job_record",
    "set_preload",
    "shutdown_started",
    "split_argv",
    "start_initial_blocks",
    "take_block",
    "tell_go",
    "warm_launch_cmd",
    "watch_interchange_starts",
]
