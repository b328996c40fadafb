"""Parsl apps for training members, workflow stages and on-demand analytics, and a retry handler
that resumes.

A retried app runs :func:`~resilient_flows.training.run_member` (or ``run_stage``) again with the
same spec, which restores the latest committed checkpoint: every retry is a resume. What a retry costs is
decided by :class:`ResumingRetryHandler`: stopping on request is free, the machine's faults (a lost
node, worker pool or peer rank) are free, losing the process after making progress (a killed
worker) is free, a real error costs one, and an
error that no retry can fix (a workload that cannot be imported, a parameter its function does not
take, a program that is not there) fails the member at once.

The workers import what a spec names (a workload's or a loop's ``module:function``) themselves,
from their own ``sys.path``, not the submitting script's: a module beside the script or in its
working directory is found by the script and not by the workers. Install it where the workers run,
or put its directory on ``PYTHONPATH`` before Parsl starts them (for the local site, before
``parsl.load``: its workers inherit the environment). A worker that cannot import it fails the
member with that error, spending no retry. The run directory (absolute: the workers may start
elsewhere) need not exist: the member makes it, or the retry handler does when the member failed
before it could.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from parsl import bash_app, python_app
from parsl.app.errors import BashExitFailure
from parsl.executors.high_throughput.errors import ManagerLost, WorkerLost

from resilient_flows.errors import (
    INFRASTRUCTURE,
    PERMANENT,
    STORAGE_FULL,
    Failure,
    LaunchError,
    ParamsError,
    Preempted,
    Superseded,
    is_permanent,
)
from resilient_flows.rundir import (
    EventLog,
    Heartbeat,
    TaskLayout,
    analytics_task,
    attempt_heartbeat_path,
    has_result,
    member_dir,
    read_attempt_heartbeat,
    stage_layout,
    superseded,
)
from resilient_flows.sites._hung import WorkerHung
from resilient_flows.sites._parsl import retry_with_kwarg, retry_with_priority
from resilient_flows.training import (
    EXIT_CANNOT_RUN,
    EXIT_PEER_LOST,
    EXIT_PREEMPTED,
    PEER_LOST,
    POOL_LOST,
    CommandKilled,
    MemberSpec,
    StageSpec,
    attempt_fault,
    declined_attempt,
    latest_committed_step,
    newest_iteration,
    pbs_hosts,
)
from resilient_flows.training._lostnodes import current_job, read_lost
from resilient_flows.training._output import attempt_output, next_attempt, open_attempt_log
from resilient_flows.training._pool import PoolWatch
from resilient_flows.training._shrink import fewest_nodes, on_nodes_left

__all__ = [
    "ResumingRetryHandler",
    "analytics_app",
    "command_app",
    "launch_prefix",
    "loop_app",
    "mlc_label_app",
    "mpi_resources",
    "mpi_train_app",
    "stage_app",
    "train_app",
]

logger = logging.getLogger(__name__)

#: Failures that lose a running attempt from outside: free when the member made progress. (A lost
#: manager is the machine's fault: see :func:`_machine_fault`.)
_LOST = (WorkerLost, CommandKilled)

#: An attempt shorter than this (seconds from launch to its end) makes the retry wait.
QUICK_ATTEMPT_S = 10.0
#: The first backoff, in seconds; doubled after each quick attempt in a row, up to MAX_BACKOFF_S.
BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
#: Seconds the ranks of a multi-node member's srun step may outlive the first rank to exit.
STRAGGLER_S = 60


@python_app
def train_app(
    spec: dict[str, Any],
    run_dir: str,
    inputs: Sequence[Any] = (),
    backoff_s: float = 0.0,
    parsl_resource_specification: dict | None = None,
) -> dict[str, Any]:
    """Train one member (a :class:`MemberSpec` as a dict) in a worker; resumes from its checkpoint.

    ``inputs``: futures of the stages whose output it reads; Parsl starts it once they are done.
    ``backoff_s``: the retry's backoff (see :class:`ResumingRetryHandler`). Every app here takes
    ``parsl_resource_specification``, which an executor in MPI mode requires of every task (see
    :func:`mpi_resources`).
    """
    from resilient_flows.training import run_member

    _wait(backoff_s, run_dir, spec["name"])
    layout = TaskLayout(member_dir(run_dir, spec["name"]))
    with attempt_output(layout, next_attempt(layout)):  # its own file, not the worker's shared output
        return run_member(spec, run_dir)


@python_app
def command_app(
    spec: dict[str, Any],
    run_dir: str,
    inputs: Sequence[Any] = (),
    backoff_s: float = 0.0,
    parsl_resource_specification: dict | None = None,
) -> dict[str, Any]:
    """Run a command member (a :class:`MemberSpec` with ``command``) in a worker: its own
    process group, its run contract in the environment, stop signals forwarded with a grace
    period (see :mod:`resilient_flows.training._command`). A retry runs the command again; a
    script that uses ``from_env()`` resumes from its checkpoint. ``backoff_s``: the retry's backoff.
    """
    from resilient_flows.training import run_command

    _wait(backoff_s, run_dir, spec["name"])

    return run_command(spec, run_dir)


@python_app
def stage_app(
    spec: dict[str, Any],
    run_dir: str,
    inputs: Sequence[Any] = (),
    backoff_s: float = 0.0,
    parsl_resource_specification: dict | None = None,
) -> Any:
    """Run one workflow stage (a :class:`StageSpec` as a dict): a checkpointed array loop that
    resumes after its newest committed iteration. ``inputs``: futures of the stages it reads;
    ``backoff_s``: the retry's backoff."""
    from resilient_flows.training import run_stage

    _wait(backoff_s, run_dir, spec["name"])
    layout = stage_layout(run_dir, spec["name"])
    with attempt_output(layout, next_attempt(layout)):
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
    from resilient_flows.training import evaluate_members

    return evaluate_members(specs, run_dir, request)


@bash_app
def mpi_train_app(
    spec: dict[str, Any],
    run_dir: str,
    ranks: int = 2,
    inputs: Sequence[Any] = (),
    parsl_resource_specification: dict | None = None,
    backoff_s: float = 0.0,
) -> str:
    """Train one data-parallel member on ``ranks`` MPI ranks: one torch.distributed process group
    (formed over MPI, see :mod:`resilient_flows.training._distributed`) for its DDP or FSDP and its
    sharded checkpointer.

    Under Parsl's ``MPIExecutor`` the launch prefix comes from ``$PARSL_MPI_PREFIX`` (pass
    ``parsl_resource_specification={"num_ranks": ...}``); a member spanning ``nodes`` (from the
    spec) runs on that many nodes of its block, as an ``srun`` step under Slurm and through PALS's
    ``mpiexec`` under PBS Pro (see :func:`launch_prefix`); elsewhere ``mpiexec -n ranks``. A member
    that may shrink (``min_nodes``) runs on the nodes its block has left, when fewer than it spans
    (see :mod:`resilient_flows.training._shrink`); the spec it writes for its ranks says so.
    ``backoff_s``: the retry's backoff, slept before the launch.

    Each rank writes its output to the attempt's log of its rank
    (:meth:`~resilient_flows.rundir.TaskLayout.attempt_log`); the launcher's own messages go to
    rank 0's.
    """

    _wait(backoff_s, run_dir, spec["name"])
    lost = read_lost(run_dir, os.environ)
    fewest = fewest_nodes(spec)  # what the watcher keeps the block for: the nodes it spans, or min_nodes
    attempt = on_nodes_left(spec, lost, os.environ)
    if attempt is not spec:  # it may shrink, and its block has fewer nodes left than it spans
        spec, ranks = attempt, int(attempt["ranks"])
    nodes = int(spec.get("nodes", 1))
    prefix = launch_prefix(int(ranks), nodes, os.environ, lost)
    layout = TaskLayout(member_dir(run_dir, spec["name"]))
    layout.write_spec(spec)
    attempt = next_attempt(layout)  # what rank 0 will count: each rank writes its output under it
    module = [sys.executable, "-m", "resilient_flows.training.mpi_member", str(layout.spec), str(run_dir), str(attempt)]
    launch = f"{prefix} {shlex.join(module)}"
    if nodes > 1 and not os.environ.get("PARSL_MPI_PREFIX") and current_job(os.environ) is not None:
        # Across the block's nodes: watched, so that a node's death is recorded and the step ended at once.
        watch = [sys.executable, "-m", "resilient_flows.training._nodewatch", str(fewest), str(layout.root)]
        watch.append(str(run_dir))
        launch = f"{shlex.join(watch)} -- {launch}"
    # The launcher's own messages go beside rank 0's output; the file is made here, never through a link.
    os.close(open_attempt_log(layout, attempt, header=launch))
    return f"{launch} >> {shlex.quote(str(layout.attempt_log(attempt)))} 2>&1"


def mpi_resources(ranks: int = 1, nodes: int = 1) -> dict[str, int]:
    """The ``parsl_resource_specification`` of a task on ``ranks`` ranks over ``nodes`` nodes, as an
    executor in MPI mode (Parsl's ``MPIExecutor``) requires of every task: from it Parsl picks the
    nodes of the block and composes ``$PARSL_MPI_PREFIX``."""
    return {"num_nodes": nodes, "num_ranks": ranks, "ranks_per_node": ranks // nodes}


def launch_prefix(ranks: int, nodes: int, env: Mapping[str, str], lost: Sequence[str] = ()) -> str:
    """The command line that starts a member's ``ranks`` processes on ``nodes`` nodes, from the
    worker's environment ``env``, on none of the block's ``lost`` nodes (see
    :mod:`resilient_flows.training._lostnodes`).

    One node: ``mpiexec`` on the worker's own node, as always; but in a block that lost nodes (a
    member shrunk onto one: see :mod:`resilient_flows.training._shrink`) as on several, since
    MPICH's ``mpiexec`` would start its ranks through an ``srun`` step that Slurm holds back until
    it declares the lost node down. Several, inside the block the
    worker runs in (a site whose blocks hold several nodes and whose worker pool runs on the
    first, as ``local-slurm-nodes``), ranks spread evenly:

    - Slurm: an ``srun`` step. Ranks that outlive the first to exit by :data:`STRAGGLER_S` are
      killed (a survivor of a crashed peer could wait in a collective for torch's 30-minute
      timeout), but a rank's exit status does not end the step at once: ``--kill-on-bad-exit``
      would turn a clean stop (every rank exits 75 within a moment of the others) into a killed
      step. After a node loss, ``--exclude`` leaves the lost nodes out and ``--overlap`` lets the
      step start beside the failed one, which Slurm holds until it declares the node down.
    - PBS Pro: Cray PALS's ``mpiexec --ppn`` onto the first ``nodes`` hosts of ``$PBS_NODEFILE``
      that were not lost (Polaris, Aurora).

    Parsl's ``$PARSL_MPI_PREFIX`` wins: ``MPIExecutor`` composed it for this very task.
    """
    given = env.get("PARSL_MPI_PREFIX")
    if given:
        return given
    if nodes <= 1 and not lost:
        return f"mpiexec -n {ranks}"
    per_node = ranks // nodes
    if env.get("SLURM_JOB_ID"):
        srun = ["srun", f"--nodes={nodes}", f"--ntasks={ranks}", f"--ntasks-per-node={per_node}"]
        if lost:
            srun += [f"--exclude={','.join(lost)}", "--overlap"]
        return shlex.join([*srun, "--kill-on-bad-exit=0", f"--wait={STRAGGLER_S}"])
    if env.get("PBS_JOBID") and env.get("PBS_NODEFILE"):
        listed = pbs_hosts(env["PBS_NODEFILE"])
        hosts = [h for h in listed if h not in lost]
        if len(hosts) < nodes:
            gone = f", {len(listed) - len(hosts)} of them lost" if lost else ""
            raise LaunchError(
                f"a member on {nodes} nodes, but PBS_NODEFILE={env['PBS_NODEFILE']} lists {len(listed)} "
                f"({', '.join(listed) or 'none'}{gone}): the block must hold as many nodes as the member spans"
            )
        return shlex.join(["mpiexec", "-n", str(ranks), "--ppn", str(per_node), "--hosts", ",".join(hosts[:nodes])])
    raise LaunchError(
        f"a member on {nodes} nodes starts its ranks inside a Slurm or PBS Pro block, but this worker runs "
        "in neither (SLURM_JOB_ID and PBS_NODEFILE are unset): use a site whose blocks hold several nodes, "
        "such as local-slurm-nodes"
    )


class ResumingRetryHandler:
    """A ``parsl.Config(retry_handler=...)`` for member apps; pair it with ``retries=N``.

    - :class:`Preempted` (or the MPI variant's or a command's exit status 75): cost 0, the member
      stopped cleanly, while it makes progress: once ``free_without_progress`` attempts in a row
      ended without a newer checkpoint, each further stop costs 1, so that a script that exits 75
      at once cannot loop forever.
    - The machine's fault (``failure_kind: "infrastructure"``): its worker pool lost (a lost
      node, a block Slurm ended for a node failure or the watchdog cancelled), its worker hung
      (stopped) and killed by its pool, which replaced it (the block is kept), or a peer rank
      gone while no rank failed on its own (a rank records it, see
      :mod:`resilient_flows.training._faults`: ``srun`` only reports an exit status). Cost 0,
      however it was seen first, while the member makes progress, as for stops; and the block the
      attempt ran in is handed to ``on_block_lost(executor, block, why)`` before the retry is
      sent, so that the runner holds and retires it: no retry lands in a block that lost a node.
      Unless the block keeps enough live nodes for the member (its spare nodes,
      ``facts.spare_nodes``; the launch watcher of :mod:`resilient_flows.training._nodewatch` says
      so in the fault record): then the retry restarts in it, on none of its lost nodes.
    - A lost worker (a worker process killed: the member's own crash as often as the machine's),
      a command killed by a signal, or a full file system: cost 0 when the member made progress,
      else 1, so a task that dies before making progress cannot loop forever. Progress is a newer
      checkpoint than at its previous failure in the tiers the runner sees, or one the lost attempt
      committed in any tier (its heartbeat says so): a node-local checkpoint lost with its node
      was progress too.
    - A member whose result is already written (its result file) finished; its process dying
      afterwards (an abort at interpreter exit) is a ``warning`` event, not a failure: no retry.
    - An error that no retry can fix (:func:`~resilient_flows.errors.is_permanent`: a workload
      that cannot be imported, parameters its function does not take, a program that cannot be
      started, which a command member or the MPI launch reports by exit status 126 or 127): the
      task fails at once, whatever retries are left. Its ``failed`` event says
      ``failure_kind: "permanent"``, with ``cost: null``, and no ``retried`` event follows.
    - Anything else: cost 1.

    Once :meth:`stop_requeueing` was called (the runner stops: Ctrl-C, SIGTERM), nothing is retried:
    a preempted attempt ends there, its own ``preempted`` event the member's last, and any other
    failure is recorded without a ``retried`` event. ``resume`` continues them all.

    An attempt that ended within :data:`QUICK_ATTEMPT_S` of its launch without progress makes the next one wait,
    twice as long after each such attempt in a row (from :data:`BACKOFF_S` up to
    :data:`MAX_BACKOFF_S`): the retry's app is given ``backoff_s``, which it sleeps, beating, before
    it starts.

    A retry after the machine's fault keeps the member's place: with ``lost_priority`` set (an
    executor that orders its queue by Parsl's ``priority``: HTEX outside MPI mode), the retry is
    sent at that priority, ahead of the members still queued that never started, so that a lost
    pool's members train again on the first free workers instead of after the whole queue.

    Failures and retries go to the run's event log. Recording them never hides the task's own
    error: should the record fail (an unwritable run directory, a spec that does not parse), the
    handler logs why and judges the error all the same, so that the error Parsl hands the caller is
    the task's, not the handler's.
    """

    def __init__(
        self,
        retries: int,
        free_without_progress: int = 3,
        on_block_lost: Callable[[str, str, str], None] | None = None,
        lost_priority: int | None = None,
    ) -> None:
        if free_without_progress < 0:
            raise ValueError(f"free_without_progress must be >= 0, got {free_without_progress}")
        self.retries = retries
        self.free_without_progress = free_without_progress
        self.on_block_lost = on_block_lost
        self.lost_priority = lost_priority
        self._progress: dict[int, int] = {}
        self._stalled: dict[int, int] = {}  # task -> attempts in a row that ended without progress
        self._quick: dict[int, int] = {}  # task -> attempts in a row that ended quickly
        self._waited: dict[int, float] = {}  # task -> the backoff its latest attempt slept
        self.stopping = False
        self.abandoned = False
        self.given_up: set[str] = set()  # members whose task ended in an abandoned Parsl instance

    def stop_requeueing(self) -> None:
        """From now on, retry nothing: the runner stops, and Parsl with it."""
        self.stopping = True

    def abandon(self) -> None:
        """The runner gives this Parsl instance up (its interchange was lost) and runs what is
        unfinished in a new one. A task that ends here from now on (a retry whose submission found
        the instance's connections closed: ``ContextTerminated``, ``ZMQError``) is no attempt of its
        member's: it is neither recorded nor retried here, and :attr:`given_up` names its member,
        for the runner to submit again with the members the lost instance left unfinished."""
        self.abandoned = True

    def __call__(self, exception: Exception, task_record: dict[str, Any]) -> float:
        if self.abandoned:
            found = _resumable_task(task_record)
            if found is not None:
                self.given_up.add(found[0])
            return math.inf
        permanent = _permanent(exception)
        try:
            return self._judge(exception, task_record, permanent)
        except Exception as exc:  # Parsl would hand the caller this error in place of the task's
            what = f"{task_record.get('func_name')} task {task_record.get('id')}"
            logger.warning(
                "could not record the failure of %s (%s: %s): %s", what, type(exception).__name__, exception, exc
            )
            return math.inf if permanent else 1.0

    def _judge(self, exception: Exception, task_record: dict[str, Any], permanent: bool) -> float:
        """The retry's cost, with the failure and the retry recorded in the run's event log."""
        found = _resumable_task(task_record)
        if found is None:
            _forget_analytics_heartbeat(task_record)
            return math.inf if permanent else 1.0
        name, run_dir, latest = found
        task = task_record["id"]
        beat = attempt_heartbeat_path(run_dir, name)
        record = read_attempt_heartbeat(beat)
        beat.unlink(missing_ok=True)  # the attempt is over, however it ended
        events = EventLog(run_dir)
        attempt = task_record["try_id"] + 1
        if has_result(run_dir, name):
            events.emit(
                "warning",
                name,
                attempt=attempt,
                reason=f"its process ended abnormally after writing its result: {type(exception).__name__}: "
                f"{exception}",
            )
            return math.inf  # finished: the runner takes the result, Parsl retries nothing
        failure = Failure.of(exception, type(exception).__name__)  # judged by its kind, reported whole
        if permanent:
            events.emit(
                "failed",
                name,
                attempt=attempt,
                error=str(failure),
                failure_kind=PERMANENT,
                errno=failure.errno,
                cause="permanent: no retry can fix it",
                cost=None,
                checkpoint=None if latest < 0 else latest,
            )
            return math.inf
        before = self._progress.get(task, -1)
        progressed = latest > before or (record is not None and record.get("committed") is not None)
        self._progress[task] = latest
        preempted = isinstance(exception, Preempted) or (
            isinstance(exception, BashExitFailure) and exception.exitcode == EXIT_PREEMPTED
        )
        if preempted and self.stopping:
            return math.inf  # it stopped where its `preempted` event says; a resume requeues it
        machine = _machine_fault(exception, member_dir(run_dir, name), record)
        if machine is not None:  # classified here, once: the block that lost it gets no retry
            self._retire(task_record, machine[1], machine[0])
        cost, why = self._cost(exception, failure, task, progressed, attempt, run_dir, name, machine)
        events.emit(
            "failed",
            name,
            attempt=attempt,
            error=str(failure),
            failure_kind=INFRASTRUCTURE if machine is not None else failure.kind,
            errno=failure.errno,
            cause=why,
            cost=cost,
            checkpoint=None if latest < 0 else latest,
        )
        if self.stopping:
            return math.inf
        if task_record["fail_cost"] + cost <= self.retries:
            if machine is not None and self.lost_priority is not None:
                retry_with_priority(task_record, self.lost_priority)
            wait = self._backoff(task, task_record, progressed)
            events.emit(
                "retried",
                name,
                attempt=attempt + 1,
                from_step=None if latest < 0 else latest,
                **({"wait_s": round(wait, 3)} if wait else {}),
            )
        return cost

    def _cost(
        self,
        exception: Exception,
        failure: Failure,
        task: int,
        progressed: bool,
        attempt: int,
        run_dir: str,
        name: str,
        machine: tuple[str, str | None] | None,
    ) -> tuple[float, str]:
        """What the attempt's end costs, and why."""
        preempted = isinstance(exception, Preempted) or (
            isinstance(exception, BashExitFailure) and exception.exitcode == EXIT_PREEMPTED
        )
        declined = preempted and declined_attempt(member_dir(run_dir, name)) == attempt
        if not declined:  # a start declined near a drain trained nothing by design: no stall either
            self._stalled[task] = 0 if progressed else self._stalled.get(task, 0) + 1
        stalls = self._stalled.get(task, 0)
        if declined:
            return 0.0, "declined to start: its block is drained before a checkpoint"
        if preempted or machine is not None:
            what = "preempted" if machine is None else f"infrastructure: {machine[0]}"
            if progressed or stalls <= self.free_without_progress:
                return 0.0, what
            return 1.0, f"{what} without progress ({stalls} attempts in a row without a newer checkpoint)"
        if isinstance(exception, _LOST) or failure.kind == STORAGE_FULL:
            what = "lost" if isinstance(exception, _LOST) else "storage full"
            return (0.0, f"{what} after progress") if progressed else (1.0, f"{what} without progress")
        return 1.0, "error"

    def _retire(self, task_record: dict[str, Any], block: str | None, why: str) -> None:
        """Hand the block the attempt ran in to :attr:`on_block_lost` (which holds and retires it),
        before Parsl sends the retry anywhere: never into a block known to have lost a node."""
        label = task_record.get("executor")
        if block is None or self.on_block_lost is None or not isinstance(label, str):
            return
        try:
            self.on_block_lost(label, str(block), why)
        except Exception as exc:  # the retry goes on; at worst into the dying block, which the watchdog ends
            logger.warning("could not retire block %s of %s: %s", block, label, exc)

    def _backoff(self, task: int, task_record: dict[str, Any], progressed: bool) -> float:
        """Seconds the next attempt waits, handed to it as ``backoff_s``: 0 after a long attempt,
        or one that committed a checkpoint (a short attempt that made progress is no crash loop:
        a node lost a few seconds into an attempt restarts on a spare at once).

        An attempt's length is counted from its launch less the backoff it slept first, so that the
        waits keep doubling while the attempts themselves stay short.
        """
        launched, returned = task_record.get("try_time_launched"), task_record.get("try_time_returned")
        ran = None if launched is None or returned is None else (returned - launched).total_seconds()
        quick = not progressed and ran is not None and ran - self._waited.get(task, 0.0) < QUICK_ATTEMPT_S
        self._quick[task] = self._quick.get(task, 0) + 1 if quick else 0
        wait = min(BACKOFF_S * 2 ** (self._quick[task] - 1), MAX_BACKOFF_S) if self._quick[task] else 0.0
        self._waited[task] = wait
        if wait:
            retry_with_kwarg(task_record, "backoff_s", wait)
        return wait


def _machine_fault(
    exception: Exception, directory: Path, record: dict[str, Any] | None
) -> tuple[str, str | None] | None:
    """Why the attempt's end was the machine's fault, not the member's, and the block it ran in
    (None: unknown); None when it was not (or cannot be told so).

    Its worker pool lost (``ManagerLost``: its node died, Slurm ended the block for a node
    failure, the runner found the block lost; or the attempt saw its pool gone and stopped:
    :mod:`resilient_flows.training._pool`), its worker hung and replaced by its pool
    (``WorkerHung``, :mod:`resilient_flows.sites._hung`: the block is sound), or a rank that
    saw a peer rank's connection close or reset while no rank failed on its own
    (:mod:`resilient_flows.training._faults`; the launcher's exit status :data:`EXIT_PEER_LOST`
    where no rank recorded anything: a rank's own error, recorded, wins over a peer's status).
    The ranks' record is consumed: it is about this attempt only.
    """
    fault = attempt_fault(directory)
    TaskLayout(directory).fault.unlink(missing_ok=True)
    found = fault.get("block") if fault is not None else None
    found = found if found is not None else None if record is None else record.get("block")
    block = None if found is None else str(found)
    if fault is not None and fault["kind"] == POOL_LOST:
        return f"its worker pool was lost ({fault.get('reason')})", block
    if isinstance(exception, ManagerLost):
        return "its worker pool was lost", block
    if isinstance(exception, WorkerHung):  # the pool replaced it: its block stays
        return f"its worker hung ({exception})", None
    if fault is not None and fault["kind"] == PEER_LOST:
        where = f"rank {fault.get('rank')} on {fault.get('host')}"
        why = f"a peer rank is gone ({where}: {fault.get('reason')})"
        if _spare_left(fault):  # the block goes on without the lost node: it is not retired
            lost = ", ".join(map(str, fault["lost_nodes"]))
            return f"{why}; node(s) {lost} lost, {fault['nodes_left']} left in its block", None
        return why, block
    if fault is None and isinstance(exception, BashExitFailure) and exception.exitcode == EXIT_PEER_LOST:
        return f"a peer rank is gone (a rank exited with status {EXIT_PEER_LOST})", block
    return None


def _spare_left(fault: dict[str, Any]) -> bool:
    """Whether the launch watcher found the nodes that died and the block has enough left for the
    member (see :mod:`resilient_flows.training._nodewatch`): its retry restarts on a spare there."""
    left, needed, lost = fault.get("nodes_left"), fault.get("nodes_needed"), fault.get("lost_nodes")
    if not (isinstance(left, int) and isinstance(needed, int) and isinstance(lost, list) and lost):
        return False
    return left >= needed


def _permanent(exception: BaseException) -> bool:
    """Whether no retry can fix ``exception``; a bash app's launch (the MPI member) reports it by
    the exit status of a program that could not be started."""
    if isinstance(exception, BashExitFailure):
        return exception.exitcode in EXIT_CANNOT_RUN
    return is_permanent(exception)


def _wait(backoff_s: float, run_dir: str, task: str) -> None:
    """The retry's backoff, slept by the attempt before it starts (a duration: the runner's and the
    worker's clocks need not agree). It beats meanwhile: a worker that holds a task must never look
    silent to the watchdog, which would declare its block lost.

    First of all, a task that an earlier runner's interchange handed out after a ``resume`` took
    the run over refuses to start (:func:`~resilient_flows.rundir.superseded`)."""
    refused = superseded(run_dir)
    if refused is not None:
        raise Superseded(f"task {task}: {refused}")
    if backoff_s > 0:
        with Heartbeat(run_dir, task, None, waiting_s=backoff_s, pool=PoolWatch.find()):
            time.sleep(backoff_s)


def _forget_analytics_heartbeat(task_record: dict[str, Any]) -> None:
    """An analytics attempt that failed beats no more: the watchdog must not take it for a silent one."""
    args = task_record.get("args") or ()
    if task_record.get("func_name") == "analytics_app" and len(args) >= 3:
        attempt_heartbeat_path(str(args[1]), analytics_task(str(args[2]))).unlink(missing_ok=True)


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
    from resilient_flows.mlc import MLCParams, label

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
    from resilient_flows.training import check_call, import_function

    module, _, name = function.partition(":")
    if not module or not name:
        raise ParamsError(f"function must be 'module:function', got {function!r}")
    loop = import_function(function, "loop function")
    check_call(loop, f"loop function {function}", "ctx", **(params or {}))
    with Context(directory, filter=every(every_n)) as ctx:
        return loop(ctx, **(params or {}))
