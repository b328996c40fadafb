"""Parsl apps for training members, workflow stages and on-demand analytics, and a retry handler
that resumes.

A retried app runs :func:`~resilient_flows.training.run_member` (or ``run_stage``) again with the
same spec, which restores the latest committed checkpoint: every retry is a resume. What a retry costs is
decided by :class:`ResumingRetryHandler`: stopping on request is free, losing the process after
making progress (a walltime, a lost node, a killed worker) is free, a real error costs one.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from parsl import bash_app, python_app
from parsl.app.errors import BashExitFailure
from parsl.executors.high_throughput.errors import ManagerLost, WorkerLost

from resilient_flows.errors import Preempted, is_storage_full
from resilient_flows.training.command import CommandKilled
from resilient_flows.training.control import latest_committed_step, member_dir
from resilient_flows.training.events import EventLog
from resilient_flows.training.heartbeat import analytics_task, heartbeat_path, read_heartbeat
from resilient_flows.training.mpi_member import EXIT_PREEMPTED
from resilient_flows.training.spec import MemberSpec, StageSpec
from resilient_flows.training.stage import newest_iteration

__all__ = [
    "ResumingRetryHandler",
    "analytics_app",
    "command_app",
    "loop_app",
    "mlc_label_app",
    "mpi_train_app",
    "stage_app",
    "train_app",
]

logger = logging.getLogger(__name__)

#: Failures that lose a running attempt from outside: free when the member made progress.
_LOST = (WorkerLost, ManagerLost, CommandKilled)


@python_app
def train_app(spec: dict[str, Any], run_dir: str, inputs: Sequence[Any] = ()) -> dict[str, Any]:
    """Train one member (a :class:`MemberSpec` as a dict) in a worker; resumes from its checkpoint.

    ``inputs``: futures of the stages whose output it reads; Parsl starts it once they are done.
    """
    from resilient_flows.training.run import run_member

    return run_member(spec, run_dir)


@python_app
def command_app(spec: dict[str, Any], run_dir: str, inputs: Sequence[Any] = ()) -> dict[str, Any]:
    """Run a command member (a :class:`MemberSpec` with ``command``) in a worker: its own
    process group, its run contract in the environment, stop signals forwarded with a grace
    period (see :mod:`resilient_flows.training.command`). A retry runs the command again; a
    script that uses ``from_env()`` resumes from its checkpoint.
    """
    from resilient_flows.training.command import run_command

    return run_command(spec, run_dir)


@python_app
def stage_app(spec: dict[str, Any], run_dir: str, inputs: Sequence[Any] = ()) -> Any:
    """Run one workflow stage (a :class:`StageSpec` as a dict): a checkpointed array loop that
    resumes after its newest committed iteration. ``inputs``: futures of the stages it reads."""
    from resilient_flows.training.stage import run_stage

    return run_stage(spec, run_dir)


@python_app
def analytics_app(
    specs: list[dict[str, Any]],
    run_dir: str,
    request: str = "analytics",
    parsl_resource_specification: dict | None = None,
) -> dict[str, Any]:
    """Evaluate members' newest committed checkpoints while they keep training.

    On-demand requests pass ``parsl_resource_specification={"priority": 0}``: HTEX then runs them
    before every queued member.
    """
    from resilient_flows.training.run import evaluate_members

    return evaluate_members(specs, run_dir, request)


@bash_app
def mpi_train_app(
    spec: dict[str, Any],
    run_dir: str,
    ranks: int = 2,
    inputs: Sequence[Any] = (),
    parsl_resource_specification: dict | None = None,
) -> str:
    """Train one data-parallel member on ``ranks`` MPI ranks: one torch.distributed process group
    (formed over MPI, see :mod:`resilient_flows.training.distributed`) for its DDP or FSDP and its
    sharded checkpointer.

    Under Parsl's ``MPIExecutor`` the launch prefix comes from ``$PARSL_MPI_PREFIX`` (pass
    ``parsl_resource_specification={"num_ranks": ...}``); elsewhere ``mpiexec -n ranks``.
    """
    directory = member_dir(run_dir, spec["name"])
    directory.mkdir(parents=True, exist_ok=True)
    spec_path = directory / "spec.json"
    spec_path.write_text(json.dumps(spec))
    prefix = os.environ.get("PARSL_MPI_PREFIX") or f"mpiexec -n {int(ranks)}"
    module = [sys.executable, "-m", "resilient_flows.training.mpi_member", str(spec_path), str(run_dir)]
    return f"{prefix} {shlex.join(module)}"


class ResumingRetryHandler:
    """A ``parsl.Config(retry_handler=...)`` for member apps; pair it with ``retries=N``.

    - :class:`Preempted` (or the MPI variant's or a command's exit status 75): cost 0, the member
      stopped cleanly.
    - A lost worker or manager (SIGKILL, node failure, walltime), a command killed by a signal, or
      a full file system: cost 0 when the member made progress, else 1, so a task that dies
      before making progress cannot loop forever. Progress is a newer checkpoint than at its
      previous failure in the tiers the runner sees, or one the lost attempt committed in any
      tier (its heartbeat says so): a node-local checkpoint lost with its node was progress too.
    - Anything else: cost 1.

    Failures and retries go to the run's ``events.jsonl``.
    """

    def __init__(self, retries: int) -> None:
        self.retries = retries
        self._progress: dict[int, int] = {}

    def __call__(self, exception: Exception, task_record: dict[str, Any]) -> float:
        found = _resumable_task(task_record)
        if found is None:
            _forget_analytics_heartbeat(task_record)
            return 1.0
        name, run_dir, latest = found
        beat = heartbeat_path(run_dir, name)
        record = read_heartbeat(beat)
        beat.unlink(missing_ok=True)  # the attempt is over, however it ended
        if isinstance(exception, Preempted) or (
            isinstance(exception, BashExitFailure) and exception.exitcode == EXIT_PREEMPTED
        ):
            cost, why = 0.0, "preempted"
        elif isinstance(exception, _LOST) or is_storage_full(exception):
            before = self._progress.get(task_record["id"], -1)
            what = "lost" if isinstance(exception, _LOST) else "storage full"
            progressed = latest > before or (record is not None and record.get("committed") is not None)
            cost, why = (0.0, f"{what} after progress") if progressed else (1.0, f"{what} without progress")
        else:
            cost, why = 1.0, "error"
        self._progress[task_record["id"]] = latest
        events = EventLog(run_dir)
        events.emit(
            "failed",
            name,
            error=f"{type(exception).__name__}: {exception}",
            cause=why,
            cost=cost,
            checkpoint=None if latest < 0 else latest,
        )
        if task_record["fail_cost"] + cost <= self.retries:
            events.emit("retried", name, attempt=task_record["try_id"] + 2, from_step=None if latest < 0 else latest)
        return cost


def _forget_analytics_heartbeat(task_record: dict[str, Any]) -> None:
    """An analytics attempt that failed beats no more: the watchdog must not take it for a silent one."""
    args = task_record.get("args") or ()
    if task_record.get("func_name") == "analytics_app" and len(args) >= 3:
        heartbeat_path(str(args[1]), analytics_task(str(args[2]))).unlink(missing_ok=True)


def _resumable_task(task_record: dict[str, Any]) -> tuple[str, str, int] | None:
    """A member's or a stage's task: its name, run directory and newest committed step or iteration."""
    args = task_record.get("args") or ()
    if len(args) < 2:
        return None
    run_dir = str(args[1])
    if task_record.get("func_name") in ("train_app", "mpi_train_app", "command_app"):
        spec = MemberSpec.from_dict(args[0])
        return spec.name, run_dir, latest_committed_step(run_dir, spec)
    if task_record.get("func_name") == "stage_app":
        name = StageSpec.from_dict(args[0]).name
        return name, run_dir, newest_iteration(run_dir, name)
    return None


@python_app
def mlc_label_app(params: list[dict[str, Any]], trials: int, seed: int) -> list[dict[str, Any]]:
    """Label parameter sets with the simulator's optimum: one chunk of a recommender's training set."""
    from resilient_flows.mlc.dataset import label
    from resilient_flows.mlc.params import MLCParams

    return [label(MLCParams(**p), trials=trials, seed=seed) for p in params]


@python_app
def loop_app(function: str, directory: str, params: dict[str, Any] | None = None, every_n: int = 10) -> Any:
    """Run a checkpointed array loop as a workflow stage: ``function(ctx, **params)`` in a worker.

    ``function`` is ``"module:function"``, importable on the worker; it receives a
    :class:`~resilient_flows.resilience.Context` rooted at ``directory`` that checkpoints every
    ``every_n`` iterations, and runs its loop through ``ctx.checkpoint``. A retry of a lost worker
    calls it again with the same directory, so the loop resumes after its newest checkpoint.
    """
    from resilient_flows.resilience import Context, every
    from resilient_flows.training.workloads import import_function

    module, _, name = function.partition(":")
    if not module or not name:
        raise ValueError(f"function must be 'module:function', got {function!r}")
    loop = import_function(function, "loop function")
    with Context(directory, filter=every(every_n)) as ctx:
        return loop(ctx, **(params or {}))
