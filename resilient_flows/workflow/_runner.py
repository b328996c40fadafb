"""Run a workflow's members as Parsl apps, show their progress, and report.

Parsl does the scheduling, the retries and the order (members start after the stages they read);
a retry is a resume because the member or stage restores its latest checkpoint (see
:mod:`resilient_flows.apps`). The runner submits, watches the run
directory, fires analytics requests (making room for on-demand ones, see
:mod:`resilient_flows.workflow._ondemand`), and writes the report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import queue
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import parsl
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.executors.status_handling import BlockProviderExecutor
from parsl.providers import LocalProvider
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape

from resilient_flows.apps import (
    ResumingRetryHandler,
    analytics_app,
    command_app,
    mpi_resources,
    mpi_train_app,
    stage_app,
    train_app,
)
from resilient_flows.clone import request_clone
from resilient_flows.errors import ResilientFlowsError, WorkflowError
from resilient_flows.rundir import (
    TOKEN_ENV,
    EventLog,
    LeaseRenewer,
    clone_order_path,
    end_lease,
    has_result,
    member_dir,
    run_layout,
)
from resilient_flows.sites import SiteFacts, SiteFile, SiteOptions
from resilient_flows.sites._parsl import (
    TRAINING_PRELOAD,
    close_parsl_logs,
    interchange_managers,
    parsl_file_logs,
    record_pid,
    set_preload,
)
from resilient_flows.training import (
    MemberSpec,
    StageSpec,
    latest_committed_step,
    preloaded_modules,
    record_pool_seen_lost,
    stage_finished,
)
from resilient_flows.workflow._adopt import Adoption, adoptable
from resilient_flows.workflow._blocks import (
    BlockLedger,
    RunnerLock,
    process_start_time,
    retire_block,
)
from resilient_flows.workflow._explore import PBTController
from resilient_flows.workflow._failfast import fail_lost_tasks
from resilient_flows.workflow._interrupt import Drain, Interrupts, StopNow, quiet_stops, resume_line
from resilient_flows.workflow._leaseguard import stop_wait_s
from resilient_flows.workflow._monitoring import monitoring_hub, visualize_note
from resilient_flows.workflow._ondemand import LOST_PRIORITY, OnDemandAnalytics, worker_slots
from resilient_flows.workflow._output_tails import OutputTails, failed_tails, logs_command
from resilient_flows.workflow._parsl_instance import abandon_parsl, kill_parsl, load_parsl
from resilient_flows.workflow._plan import Plan, plan_workflow
from resilient_flows.workflow._recorded_plan import (
    MemberIndex,
    create_run_dir,
    default_run_dir,
    read_plan,
    require_writable,
    run_members,
)
from resilient_flows.workflow._report import campaign_table, ondemand_table, stage_table, status_table, write_report
from resilient_flows.workflow._runlog import library_output_to_log
from resilient_flows.workflow._standby import Kept, Standby, cancel_kept, left_waiting, lower_init_blocks
from resilient_flows.workflow._status import StatusTracker
from resilient_flows.workflow._stragglers import carry_token, kill_commands, new_token
from resilient_flows.workflow._walltime import BlockClock
from resilient_flows.workflow._watchdog import Lost, Watchdog, clear_heartbeats, stall_timeout
from resilient_flows.workflow.dashboard import write_dashboard_report
from resilient_flows.workflow.schema import load_workflow, run_path

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.5

#: Seconds the guard has to exit when the runner ends.
GUARD_EXIT_S = 5.0


def start_run(
    path: str | Path,
    site: str | None = None,
    run_dir: str | Path | None = None,
    console: Console | None = None,
    options: SiteOptions | None = None,
) -> int:
    """Run a workflow file from the start; 0 when every member finished. ``site`` replaces the
    workflow's site, ``options`` change its blocks (see :func:`plan_workflow`)."""
    directory, plan = prepare_run(path, site, run_dir, options)
    return _execute(directory, plan, list(plan.members), console or Console())


def prepare_run(
    path: str | Path, site: str | None = None, run_dir: str | Path | None = None, options: SiteOptions | None = None
) -> tuple[Path, Plan]:
    """Validate and plan a workflow file and create its run directory: all of ``run`` before its
    runner takes the run, which it then does as a ``resume`` would. ``run --detach`` does this in
    the foreground, so that a mistake in the workflow or its site is reported at once. The run
    directory (absolute) and its plan."""
    workflow = load_workflow(path)
    target = Path(run_dir) if run_dir is not None else default_run_dir(workflow)
    plan = plan_workflow(workflow, site, run_name=_run_key(target), options=options)
    directory = create_run_dir(target, plan, Path(path).read_text())
    for clone in workflow.clones:  # registered now: the sources fork when they reach the step
        request_clone(directory, clone.member, clone.n, clone.overrides, at_step=clone.at_step, ranks=clone.ranks)
    return directory, plan


def _run_key(run_dir: Path) -> str:
    """The run's name on node-local scratch: its directory's name, made unique by its absolute path,
    so that two runs in directories of the same name never share (and restore) node-local checkpoints."""
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:8]
    return f"{run_dir.name}-{digest}"


def resume_run(
    run_dir: str | Path,
    console: Console | None = None,
    ranks: int | Mapping[str, int] | None = None,
    options: SiteOptions | None = None,
) -> int:
    """Continue a run: finished members are skipped, the others resume from their checkpoints.

    ``ranks`` runs resumed members on another number of ranks (one count for all of them, or
    counts by member name), for this resume only; their checkpoints are resharded on restore.
    ``options`` change the site's blocks (``nodes``, ``walltime``, ``queue``, ``account``) from
    those the run started with, for this resume only.
    """
    directory = Path(run_dir).resolve()
    plan = read_plan(directory)
    require_writable(directory)
    if options is not None:
        site = plan.workflow.site.merged(options)
        plan = dataclasses.replace(plan, workflow=plan.workflow.model_copy(update={"site": site}))
    console = console or Console()
    members = run_members(directory, plan)
    pending = [m for m in members if not has_result(directory, m.name)]
    if len(pending) < len(members):
        console.print(f"{len(members) - len(pending)} member(s) already finished; resuming {len(pending)}")
    resized = resize_members(pending, ranks, [m.name for m in members])
    for old, new in zip(pending, resized, strict=True):
        if new.ranks != old.ranks:
            console.print(f"{new.name}: {new.ranks} rank(s) instead of {old.ranks}; its checkpoint is resharded")
    return _execute(directory, plan, resized, console)


def resize_members(
    pending: list[MemberSpec], ranks: int | Mapping[str, int] | None, known: list[str] | None = None
) -> list[MemberSpec]:
    """``pending`` with their rank counts replaced: ``ranks`` for all, or by name.

    A member spanning nodes keeps as many of them as share the new count evenly
    (:meth:`MemberSpec.with_ranks`). A name that is not pending is an error: unknown (``known``
    lists the run's members), or a member that already finished.
    """
    if ranks is None:
        return list(pending)
    if isinstance(ranks, int):
        return [m.with_ranks(ranks) for m in pending]
    names = {m.name for m in pending}
    for name in ranks:
        if name not in names:
            state = "already finished" if known is not None and name in known else "is not a member of this run"
            raise WorkflowError(f"--ranks {name}={ranks[name]}: {name!r} {state}; pending: {', '.join(sorted(names))}")
    return [m.with_ranks(ranks[m.name]) if m.name in ranks else m for m in pending]


def _put_interpreter_on_path() -> None:
    """Parsl starts its interchange and workers by command name; find them beside this Python even
    when its environment was not activated (``.venv/bin/resilient-flows run ...``)."""
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])


class _Submitter:
    """Submits stages and members as Parsl apps, once each: the unfinished stages, the planned
    members, then clones as they are requested. Parsl starts each after the stages it reads.

    Futures leave the pending set by callback, so that asking whether all are done costs the same
    at 10 members and at 10,000.
    """

    def __init__(self, run_dir: Path, mpi_mode: bool = False) -> None:
        self.run_dir = run_dir
        self.mpi_mode = mpi_mode  # an executor in MPI mode: every task says its nodes and ranks
        self.events = EventLog(run_dir)
        self.futures: dict[str, Future] = {}
        self.stages: dict[str, Future] = {}
        self.specs: dict[str, MemberSpec] = {}
        self._pending: set[Future] = set()

    def submit_stages(self, stages: list[StageSpec]) -> None:
        for stage in stages:
            if stage.name in self.stages or stage_finished(self.run_dir, stage.name):
                continue
            after = self._after(stage.inputs)
            future = stage_app(stage.to_dict(), str(self.run_dir), inputs=after, **self._resources())
            self.stages[stage.name] = self._watch(future)
            self.events.emit("submitted", stage.name, stage=True, task=future.tid)

    def submit(self, member: MemberSpec) -> None:
        after = self._after(member.inputs)
        if member.trains_in_worker:
            future = train_app(member.to_dict(), str(self.run_dir), inputs=after, **self._resources())
        elif member.command:
            future = command_app(member.to_dict(), str(self.run_dir), inputs=after, **self._resources())
        else:
            resources = self._resources(member.ranks, member.nodes)
            future = mpi_train_app(member.to_dict(), str(self.run_dir), ranks=member.ranks, inputs=after, **resources)
        self.futures[member.name] = self._watch(future)
        self.specs[member.name] = member
        parent = member.parent and member.parent.member
        self.events.emit("submitted", member.name, ranks=member.ranks, parent=parent, task=future.tid)

    def adopt(self, member: MemberSpec, future: Future) -> None:
        """Take ``member`` for submitted: an earlier runner's attempt of it trains on, adopted
        (see :mod:`resilient_flows.workflow._adopt`); ``future`` resolves once that attempt ended."""
        self.futures[member.name] = self._watch(future)
        self.specs[member.name] = member

    def _resources(self, ranks: int = 1, nodes: int = 1) -> dict[str, Any]:
        """The task's nodes and ranks, for an executor in MPI mode; nothing for any other."""
        return {"parsl_resource_specification": mpi_resources(ranks, nodes)} if self.mpi_mode else {}

    def submit_new_clones(self, clones: list[MemberSpec]) -> None:
        """Submit each clone once its source serves the order (or can no longer): a clone submitted
        earlier would hold a worker while it waits, possibly the one its source needs to start."""
        for member in clones:
            parent = member.parent
            if parent is None or member.name in self.futures or has_result(self.run_dir, member.name):
                continue
            source = member_dir(self.run_dir, parent.member)
            source_done = has_result(self.run_dir, parent.member) or self._failed(parent.member)
            if source_done or not clone_order_path(source, parent.request).exists():
                self.submit(member)

    def all_done(self) -> bool:
        return not self._pending

    def restart(
        self, adopted: set[str] | frozenset[str] = frozenset(), given_up: set[str] | frozenset[str] = frozenset()
    ) -> list[MemberSpec]:
        """Forget the futures of a Parsl instance that was given up; the members to submit again
        (stages are submitted again by :meth:`submit_stages`). The ``adopted`` members' attempts
        run outside any Parsl instance of this runner: they are kept. The ``given_up`` members'
        tasks ended as the instance was given up (see :meth:`ResumingRetryHandler.abandon`): they
        are unfinished too."""
        self.stages = {name: f for name, f in self.stages.items() if f.done()}
        unfinished = [
            name for name, f in self.futures.items() if (not f.done() or name in given_up) and name not in adopted
        ]
        for name in unfinished:
            del self.futures[name]
        # in place: each future's callback discards it from this very set, however late it ends
        self._pending.intersection_update(f for name, f in self.futures.items() if name in adopted)
        return [self.specs[name] for name in unfinished]

    def _watch(self, future: Future) -> Future:
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return future

    def _after(self, inputs: dict[str, str]) -> list[Future]:
        """The futures of the unfinished stages among ``inputs``."""
        return [self.stages[name] for name in inputs if name in self.stages]

    def _failed(self, name: str) -> bool:
        future = self.futures.get(name)
        return future is not None and future.done() and future.exception() is not None


#: What a poll of the run returns once every task is done (else: None, or why Parsl was lost).
_DONE = "done"


def resumed_first(run_dir: Path, members: list[MemberSpec]) -> list[MemberSpec]:
    """``members`` to submit to a new Parsl instance, those that committed a checkpoint first (in
    their order, then the others in theirs): the new interchange runs tasks in the order they came,
    and the members a lost interchange stopped keep their place ahead of those never started."""
    started = [m for m in members if latest_committed_step(run_dir, m) >= 0]
    return started + [m for m in members if m not in started]


def worker_preload(members: Sequence[MemberSpec], stages: bool, analytics: bool) -> tuple[str, ...]:
    """What a run's warm pools import ahead besides their own module and the member runtime:
    torch and the workloads' modules where an attempt trains or evaluates in its worker (a
    one-rank workload member, a stage, analytics); nothing where every member is a command or
    spans ranks, whose workers only start the processes that import them. A member cloned later
    onto one rank imports them in its worker."""
    trained = sorted({m.workload for m in members if m.trains_in_worker})
    if not (trained or stages or analytics):
        return ()
    return (*TRAINING_PRELOAD, *(module for workload in trained for module in preloaded_modules(workload)))


def _site_config(
    site: SiteFile,
    run_dir: Path,
    retries: int,
    free_stops: int,
    monitor_as: str | None = None,
    token: str | None = None,
    preload: tuple[str, ...] = (),
    shrinkable: bool = False,
    retired: queue.SimpleQueue | None = None,
) -> Config:
    """The site's Parsl configuration for this run, with our retry handler (its blocks' error
    handler tolerates lost blocks: see :func:`~resilient_flows.sites._build.build_config`), blocks
    that carry the runner's ``token``, where given (what is left of them is found by it: see
    :mod:`resilient_flows.workflow._stragglers`) and, where ``monitor_as`` names the workflow,
    Parsl's monitoring into the run's database (see :mod:`resilient_flows.workflow._monitoring`).
    Warm worker pools preload ``preload`` (see :func:`worker_preload`). Where a member is
    ``shrinkable`` (``min_nodes`` below its ``nodes``), blocks outlive a lost node, spares or not.
    The blocks the retry handler retires are put in ``retired``, where given, for the runner to fail
    their other tasks."""
    on_lost = functools.partial(_retire_lost_block, retired)
    handler = ResumingRetryHandler(retries, free_without_progress=free_stops, on_block_lost=on_lost)
    layout = run_layout(run_dir)
    extra = {} if monitor_as is None else {"monitoring": monitoring_hub(layout.monitoring_db, monitor_as)}
    config = site.config(
        survive_node_loss=shrinkable,
        standby_blocks=True,
        run_dir=str(layout.parsl),
        retries=retries,
        retry_handler=handler,
        **extra,
    )
    if token is not None:
        carry_token(config, token)
    for executor in config.executors:
        set_preload(executor, preload)
    if _prioritized(config):
        handler.lost_priority = LOST_PRIORITY
    return config


def _no_initial_blocks(config: Config) -> None:
    """Start no block before a task needs one: every member left to run is adopted, and trains on
    in an earlier runner's blocks (a new pilot job would hold its nodes idle meanwhile). Parsl's
    strategy starts one once an adopted member is submitted again; where it would not (no
    strategy, or ``init_only``: initial blocks only), blocks start as configured."""
    if config.strategy not in ("simple", "htex_auto_scale"):
        return
    for executor in config.executors:
        provider = getattr(executor, "provider", None)
        if provider is not None and hasattr(provider, "init_blocks"):
            provider.init_blocks = 0


def _prioritized(config: Config) -> bool:
    """Whether every executor orders its queue by Parsl's ``priority`` (HTEX outside MPI mode)."""
    executors = config.executors
    return all(isinstance(e, HighThroughputExecutor) and not getattr(e, "enable_mpi_mode", False) for e in executors)


def _retire_lost_block(retired: queue.SimpleQueue | None, label: str, block: str, why: str) -> None:
    """The retry handler found that a task's block lost a node (or its pool): hold the block, so
    that the interchange sends it no retry, and cancel it, so that Parsl starts a healthy one.
    Called from Parsl's thread that judges the failure, before the retry is submitted. The block
    goes to ``retired``: the runner fails its other tasks at its next look, as for a block its
    watchdog found lost, rather than leave them to the interchange's heartbeat threshold."""
    executor = parsl.dfk().executors.get(label)
    if isinstance(executor, BlockProviderExecutor) and retire_block(executor, block):
        logger.info("retired block %s of %s: %s", block, label, why)
        if retired is not None:
            retired.put((label, block))


def _managers_of(executor: Any) -> list[dict[str, Any]] | None:
    """The interchange's managers of an executor that has one; None for any other."""
    return interchange_managers(executor) if isinstance(executor, HighThroughputExecutor) else None


def _handle_lost(
    found: list[Lost], executors: Sequence[Any], submitter: _Submitter, watchdog: Watchdog, console: Console
) -> str | None:
    """Record what the watchdog found, cancel the blocks concerned and fail their tasks at once
    (``ManagerLost``, as the interchange would once its heartbeat threshold passed: see
    :mod:`resilient_flows.workflow._failfast`); Parsl retries them and starts new blocks. The
    reason when an interchange exited: then only a new Parsl instance helps."""
    for lost in found:
        if lost.pool_gone is not None and not _runs_local_blocks(
            executors, lost.executor or _executor_of(submitter, lost.seen_by)
        ):
            continue  # a batch job's pool seen gone here: its scheduler ends the job, Parsl's heartbeat finds it
        submitter.events.emit(
            "lost",
            lost.task,
            attempt=lost.attempt,
            block=lost.block,
            executor=lost.executor,
            reason=lost.reason,
            silent_s=lost.silent_s,
        )
        label = lost.executor or _executor_of(submitter, lost.seen_by)
        if lost.task:
            what = f"{lost.task} (attempt {lost.attempt})"
        elif lost.block is not None:
            what = f"block {lost.block} of {label}" if label else f"block {lost.block}"
        else:
            what = f"executor {label}"
        console.print(f"[bold yellow]lost {what}:[/] {lost.reason}")
        if lost.task is None and lost.block is None:
            return lost.reason
        for executor in executors:
            if label not in (None, executor.label) or not isinstance(executor, BlockProviderExecutor):
                continue
            if lost.block is not None and retire_block(executor, lost.block):
                watchdog.forget_block(executor.label, lost.block)
                console.print(f"cancelled block {lost.block} of {executor.label}; its tasks are retried")
            if lost.block is not None:
                if lost.pool_gone is not None:  # before the retry handler asks why the attempts ended
                    _record_pool_seen_lost(submitter, lost.block, lost.pool_gone, watchdog.beats())
                fail_lost_tasks(executor, str(lost.block), {**submitter.stages, **submitter.futures}, watchdog.beats())
    return None


def _runs_local_blocks(executors: Sequence[Any], label: str | None) -> bool:
    """Whether executor ``label`` starts its blocks as processes of this host (``LocalProvider``):
    only there does the runner fail a lost pool's tasks itself; a batch job's pool that dies keeps
    its managers registered, and a retry would be sent to them."""
    return any(label in (None, e.label) and isinstance(getattr(e, "provider", None), LocalProvider) for e in executors)


def _record_pool_seen_lost(submitter: _Submitter, block: str, why: str, beats: Mapping[str, Mapping[str, Any]]) -> None:
    """Record the pool's loss for each member attempt that ran in ``block``, as it would have."""
    for name, beat in beats.items():
        attempt, host = beat.get("attempt"), beat.get("host")
        if name in submitter.futures and str(beat.get("block")) == block and isinstance(attempt, int):
            record_pool_seen_lost(member_dir(submitter.run_dir, name), attempt, str(host), block, why)


def _executor_of(submitter: _Submitter, name: str | None) -> str | None:
    """The label of the executor that runs task ``name`` (a member or stage); None if unknown."""
    future = submitter.futures.get(name or "") or submitter.stages.get(name or "")
    record = getattr(future, "task_record", None)
    label = record.get("executor") if isinstance(record, dict) else None
    return label if isinstance(label, str) else None


@contextlib.contextmanager
def _holding(run_dir: Path, orphan_timeout_s: float, token: str | None = None) -> Iterator[None]:
    """Hold the run while the block runs: its lock, its lease (renewed from a thread, naming the
    ``token`` this runner's blocks carry), and the guard that cancels this runner's blocks if it
    dies and stays away (see :mod:`resilient_flows.workflow._leaseguard`)."""
    RunnerLock(run_dir, orphan_timeout_s, token).acquire()
    me = os.getpid()
    command = [sys.executable, "-m", "resilient_flows.cli.leaseguard", str(run_dir), "--runner", str(me)]
    started = process_start_time(me)
    with run_layout(run_dir).guard_log.open("ab") as log:
        guard = subprocess.Popen(
            [*command, *([] if started is None else ["--started", str(started)])],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # the signal that ends this runner, or its terminal's hang-up, spares it
        )
    try:
        with LeaseRenewer(run_dir):
            yield
    finally:
        end_lease(run_dir)
        guard.terminate()
        try:
            guard.wait(timeout=GUARD_EXIT_S)
        except subprocess.TimeoutExpired:  # stuck in a read of a hung file system
            guard.kill()
            guard.wait()


def _execute(run_dir: Path, plan: Plan, members: list[MemberSpec], console: Console) -> int:
    _put_interpreter_on_path()
    site_file = plan.site_file
    if site_file is None:  # read back from the run directory: the site is read once, here
        site_file = SiteFile.open(plan.site, plan.workflow.site)
        plan = dataclasses.replace(plan, site_file=site_file)
    facts = site_file.facts()
    runner_log = run_layout(run_dir).runner_log
    token = new_token()
    with Interrupts() as interrupts:  # Ctrl-C and SIGTERM: see resilient_flows.workflow._interrupt
        try:
            with library_output_to_log(runner_log, console), _holding(run_dir, facts.orphan_timeout_s, token):
                return _run_held(run_dir, plan, members, console, facts, interrupts, token)
        except StopNow:
            console.print(
                f"[bold yellow]stopped at once[/] ({interrupts.name} twice): every process of the run was "
                f"killed; members resume from their newest committed checkpoint with: {escape(resume_line(run_dir))}",
                soft_wrap=True,
            )
            return interrupts.status


def _run_held(
    run_dir: Path,
    plan: Plan,
    members: list[MemberSpec],
    console: Console,
    facts: SiteFacts,
    interrupts: Interrupts,
    token: str | None = None,
) -> int:
    console.print(f"run [bold]{plan.workflow.name}[/] on site [bold]{plan.site}[/]: {run_dir}")
    loop = _RunLoop(run_dir, plan, members, facts, interrupts, token)  # where monitoring cannot start, it says
    if plan.workflow.monitoring:
        console.print(f"Parsl monitoring: parsl-visualize sqlite:///{run_layout(run_dir).monitoring_db.resolve()}")
        note = visualize_note()
        if note is not None:
            console.print(f"[yellow]{escape(note)}[/]")
    return loop.run(console)


class _RunLoop:
    """One run from a held lease to its report, in phases: set up what the run submits and
    watches; per Parsl instance, start Parsl, submit, poll until everything is done (or the
    interchange is lost, which needs a new instance), stop Parsl; then report."""

    def __init__(
        self,
        run_dir: Path,
        plan: Plan,
        members: list[MemberSpec],
        facts: SiteFacts,
        interrupts: Interrupts,
        token: str | None = None,
    ) -> None:
        workflow = self.workflow = plan.workflow
        self.run_dir, self.plan, self.facts, self.interrupts = run_dir, plan, facts, interrupts
        self.tracker = StatusTracker(run_dir)
        self.index = MemberIndex(run_dir, plan)
        self.started = time.monotonic()
        self.ledger = BlockLedger(run_dir) if token is None else BlockLedger(run_dir, token=token)
        self.controllers = [
            PBTController(campaign, run_dir, [m for m in plan.members if m.name.startswith(f"{campaign.name}-")])
            for campaign in workflow.explore
            if campaign.strategy == "pbt"
        ]
        self.stages = workflow.stage_specs()
        self.retired: queue.SimpleQueue = queue.SimpleQueue()  # (executor, block) the retry handler retired
        if plan.site_file is None:
            raise WorkflowError("a run needs its site file read first (as _execute does)")
        self.site_config = functools.partial(
            _site_config,
            plan.site_file,
            run_dir,
            workflow.retries,
            workflow.free_stops,
            workflow.name if workflow.monitoring else None,
            token=self.ledger.token,
            preload=worker_preload(plan.members, bool(workflow.stages), bool(workflow.analytics)),
            shrinkable=any(m.min_nodes is not None and m.min_nodes < m.nodes for m in plan.members),
            retired=self.retired,
        )
        self.config = self.site_config()
        executors = self.config.executors
        self.mpi_mode = any(getattr(e, "enable_mpi_mode", False) for e in executors)
        self.prioritized = _prioritized(self.config)
        self.submitter = _Submitter(run_dir, self.mpi_mode)
        slots = worker_slots(self.config)
        self.ondemand = OnDemandAnalytics(workflow.analytics, workflow.cosched, run_dir, slots, self._submit_analytics)
        self.pending = [m for m in members if m.parent is None]  # clones wait until their source serves them
        self.members = members
        self.adoption: Adoption | None = None  # an earlier runner's attempts that train on: see _adopt
        self._first_parsl = True
        self._listed: list[MemberSpec] | None = None
        self._names: list[tuple[str, int]] = []
        self._members: set[str] = set()
        self._families: dict[str, str] = {}
        self.block_clock: BlockClock | None = None
        self.standby = Standby({TOKEN_ENV: self.ledger.token})  # replaced by each Parsl instance's own
        self.kept: list[Kept] = []  # waiting pools of a lost Parsl instance (or runner), for the next one

    def run(self, console: Console) -> int:
        with Live(console=console, refresh_per_second=4, transient=True) as live, self.interrupts.armed():
            try:
                while not self.interrupts.requested:  # one pass per Parsl instance: a lost interchange needs a new one
                    lost_parsl = self._one_parsl(console, live)
                    if lost_parsl is None or self.interrupts.requested:
                        break
                    console.print(f"[bold yellow]{lost_parsl}[/]: starting Parsl again; unfinished tasks resume")
                    given_up = self._given_up()
                    self.pending = resumed_first(self.run_dir, self.submitter.restart(self._adopted(), given_up))
                    self.ondemand.drop_unfinished()
                    self.config = self.site_config()
            finally:
                if self.adoption is not None:  # stopped before the adopted attempts ended: theirs go too
                    self._cancel_previous(console)
                    self.adoption.abandon()
        cancel_kept(self.kept)  # none adopted them: the run stopped before another instance started
        self.kept = []
        if self.interrupts.requested:
            return self._stopped(console)
        return self._report(console)

    def _submit_analytics(self, specs: list[dict], part: str, priority: int | None) -> Future:
        run_dir = str(self.run_dir)
        if self.mpi_mode:
            return analytics_app(specs, run_dir, part, parsl_resource_specification=mpi_resources())
        if priority is None or not self.prioritized:
            return analytics_app(specs, run_dir, part)
        return analytics_app(specs, run_dir, part, parsl_resource_specification={"priority": priority})

    def _given_up(self) -> set[str]:
        """The members whose task ended as the lost Parsl instance was given up (see
        :meth:`ResumingRetryHandler.abandon`)."""
        handler = self.config.retry_handler
        return handler.given_up if isinstance(handler, ResumingRetryHandler) else set()

    def _adopted(self) -> set[str]:
        return set() if self.adoption is None else self.adoption.names()

    def _cancel_previous(self, console: Console) -> None:
        for what in self.ledger.cancel_previous(self.config.executors):
            console.print(f"cancelled {what}, left by an earlier runner")

    def _adopt(self, console: Console) -> None:
        """Adopt the attempts earlier runners left training, where every live one can be (see
        :mod:`resilient_flows.workflow._adopt`); the lease is this runner's already. A member
        resumed on another rank count (``resume --ranks``) cannot be: its attempt runs on the old."""
        records = adoptable(self.run_dir, self.members, {m.name: m.ranks for m in self.plan.members})
        if not records:
            return
        specs = {m.name: m for m in self.members}
        site_s = self.facts.stall_timeout_s
        self.adoption = Adoption(
            self.run_dir, records, specs, lambda m, r: stall_timeout(m.stall_timeout_s, r.get("step_s"), site_s)
        )
        for name, record in sorted(records.items()):
            self.submitter.adopt(specs[name], self.adoption.future(name))
            where = f"pid {record.get('pid', '?')} on {record.get('host', '?')}"
            reason = f"adopted: attempt {record['attempt']} ({where}) of an earlier runner trains on"
            self.submitter.events.emit("warning", name, attempt=record["attempt"], reason=reason)
            console.print(f"{name}: {reason}")
        self.pending = [m for m in self.pending if m.name not in records]

    def _take_waiting_pools(self, console: Console) -> None:
        """Keep the standby pools earlier runners left waiting, preloaded, for the first Parsl
        instance to adopt instead of starting its first blocks cold (see
        :mod:`resilient_flows.workflow._standby`)."""
        self.kept = left_waiting(self.ledger.previous(), self.config.executors)
        pools = ((record_pid(k.resource), k.resource["started"]) for k in self.kept)
        self.ledger.take((pid, started) for pid, started in pools if pid is not None)
        for kept in self.kept:
            console.print(f"{kept.label}: a standby pool an earlier runner left (its block {kept.block}) takes over")

    def _watch_adopted(self, console: Console) -> None:
        """Take the results of adopted attempts that ended, and submit the members of those that
        ended without one; once none is left, cancel what earlier runners left."""
        if self.adoption is None:
            return
        resubmit, lost = self.adoption.update()
        if lost is not None:
            console.print(f"[bold yellow]{lost}[/]: earlier runners' blocks cancelled, their members resume here")
            self._cancel_previous(console)
            resubmit += self.adoption.abandon()
        for member in resubmit:
            self.submitter.submit(member)
        if not self.adoption.names():
            self.adoption = None
            self._cancel_previous(console)

    def _one_parsl(self, console: Console, live: Live) -> str | None:
        """Start Parsl, submit what is pending, poll until done; why Parsl was lost, or None."""
        first = self._first_parsl
        if first:
            self._first_parsl = False
            self._adopt(console)
            if self.adoption is not None and not self.pending:
                _no_initial_blocks(self.config)
            else:  # members to start now: on a pool left waiting, where there is one, not a cold block
                self._take_waiting_pools(console)
        if self.adoption is None:
            self._cancel_previous(console)
        clear_heartbeats(self.run_dir, keep=self._adopted())
        lower_init_blocks(self.config.executors, self.kept)  # a kept pool is its first block
        dfk, self.config = load_parsl(self.config, self._fresh_config, console)
        watchdog = Watchdog(self.run_dir, self.facts.stall_timeout_s, {})
        # block ids and go files are the new instance's; the first instance's standby waits for its
        # run to be under way, a later one's (the interchange was lost: a burst) starts at once
        self.standby = Standby({TOKEN_ENV: self.ledger.token}, self.facts.standby_after_s if first else 0.0)
        while not self.retired.empty():  # blocks of the lost instance, whose ids the new one reuses
            self.retired.get()
        cancel_kept(self.standby.adopt(self.config.executors, self.kept))
        self.kept = []
        if self.facts.walltime_s is not None:  # blocks end on time: see resilient_flows.workflow._walltime
            self.block_clock = BlockClock(self.run_dir, self.facts.walltime_s, _managers_of)
        lost_parsl = None
        try:
            if not self.interrupts.requested:
                self.submitter.submit_stages(self.stages)
                for member in self.pending:
                    self.submitter.submit(member)
            while not self.interrupts.requested and (lost_parsl := self._poll(watchdog, console, live)) is None:
                time.sleep(POLL_SECONDS)
            if lost_parsl is None:  # stopped by a signal: Parsl shuts down as after a run
                with quiet_stops():
                    self._drain(console, live)
                lost_parsl = _DONE
        finally:
            if lost_parsl not in (None, _DONE) and not self.interrupts.requested:
                self.kept = self.standby.keep(self.config.executors)  # spared by the shutdown, for the next
                for kept in self.kept:
                    self.ledger.spare(kept.label, kept.block)
            with quiet_stops() if self.interrupts.requested else contextlib.nullcontext():
                self._stop_parsl(dfk, lost_parsl)
        return None if lost_parsl == _DONE else lost_parsl

    def _fresh_config(self) -> Config:
        """The site's configuration built anew (for another try to start Parsl), with one initial
        block fewer for each waiting pool kept from a lost instance."""
        config = self.site_config()
        lower_init_blocks(config.executors, self.kept)
        return config

    def _stop_parsl(self, dfk: Any, lost_parsl: str | None) -> None:
        """Shut the Parsl instance down: at once after a second stop signal, abandoned after its
        interchange was lost, else as Parsl does (its blocks cancelled)."""
        executors = self.config.executors
        logs = parsl_file_logs(self.config.run_dir)
        try:
            if self.interrupts.again:
                kill_parsl(dfk, executors, self.ledger)
            elif lost_parsl not in (None, _DONE):
                if isinstance(self.config.retry_handler, ResumingRetryHandler):
                    self.config.retry_handler.abandon()  # before its connections close under its launches
                abandon_parsl(dfk, executors)
            else:
                dfk.cleanup()
        except StopNow:  # in the middle of a shutdown
            kill_parsl(dfk, executors, self.ledger)
            raise
        finally:
            parsl.clear()
            close_parsl_logs(logs)
            self.ledger.reap(executors, everything=True)
            if self.interrupts.requested:  # a command member that outlived its stop: its launcher is gone
                kill_commands(self.ledger.token, self.run_dir)

    def _drain(self, console: Console, live: Live) -> None:
        """The first stop signal: every running member commits a checkpoint and stops, and nothing
        starts or is retried meanwhile (see :mod:`resilient_flows.workflow._interrupt`)."""
        name = self.interrupts.name
        console.print(
            f"[bold yellow]{name}[/]: the running members commit a checkpoint and stop"
            + (" (Ctrl-C again: stop at once)" if name == "SIGINT" else ""),
            soft_wrap=True,
        )
        handler = self.config.retry_handler
        if isinstance(handler, ResumingRetryHandler):
            handler.stop_requeueing()
        everyone = self.index.members()
        drain = Drain(
            self.run_dir, {m.name for m in everyone}, f"the runner was stopped ({name})", stop_wait_s(everyone)
        )
        drain.hold(self.config.executors)
        names, families = [(m.name, m.steps) for m in everyone], {m.name: m.family for m in everyone}
        try:
            while not drain.update():
                statuses = self.tracker.update(names, families)
                live.update(status_table(statuses, f"{self.workflow.name}: stopping ({name})"))
                time.sleep(POLL_SECONDS / 5)
        finally:
            drain.finish()

    def _stopped(self, console: Console) -> int:
        """The table as the members left it, and how to continue; 128 + the signal's number."""
        everyone = self.index.members()
        statuses = self.tracker.update([(m.name, m.steps) for m in everyone], {m.name: m.family for m in everyone})
        console.print(status_table(statuses, f"{self.workflow.name}: stopped ({self.interrupts.name})"))
        console.print(
            f"[bold yellow]stopped[/] ({self.interrupts.name}): members resume from their newest committed "
            f"checkpoint with: {escape(resume_line(self.run_dir))}",
            soft_wrap=True,
        )
        return self.interrupts.status

    def _poll(self, watchdog: Watchdog, console: Console, live: Live) -> str | None:
        """One look at the run: :data:`_DONE` when everything is done, why Parsl was lost, or None."""
        everyone = self.index.members()
        self.submitter.submit_new_clones(self.index.clones())
        elapsed = time.monotonic() - self.started
        if everyone is not self._listed:  # the index gives the same list until a member is added
            self._listed, self._names = everyone, [(m.name, m.steps) for m in everyone]
            self._members = {m.name for m in everyone}
            self._families = {m.name: m.family for m in everyone}
        statuses = self.tracker.update(self._names, self._families)
        self.ondemand.update(elapsed, everyone, statuses)
        if self.submitter.all_done() and all(f.done() for f in self.ondemand.futures):
            return _DONE
        for controller in self.controllers:
            controller.update(everyone, statuses)
        executors = self.config.executors
        self.ledger.record(executors)
        self.ledger.reap(executors)
        self._watch_adopted(console)
        watchdog.ignored = self._adopted()
        if len(watchdog.timeouts) != len(everyone):  # members are only ever added
            watchdog.timeouts = {m.name: m.stall_timeout_s for m in everyone}
        lost_parsl = _handle_lost(watchdog.check(executors), executors, self.submitter, watchdog, console)
        if lost_parsl is not None:
            return lost_parsl
        self._fail_retired(executors, watchdog)
        self.standby.update(executors)
        self.ledger.record(executors)  # a standby block started now is cancelled should this runner die
        if self.block_clock is not None:
            for label, block in self.block_clock.update(executors, watchdog.beats(), self._members):
                watchdog.forget_block(label, block)
                console.print(
                    f"block {block} of {label} drained before its walltime; its members continue on a new one"
                )
        table = status_table(statuses, f"{self.workflow.name} ({elapsed:.0f} s)")
        if self.stages:
            events = self.tracker.events_of([s.name for s in self.stages])
            table = Group(stage_table(self.run_dir, self.stages, events), table)
        live.update(table)
        return None

    def _fail_retired(self, executors: Sequence[Any], watchdog: Watchdog) -> None:
        """Fail at once the tasks still running in the blocks the retry handler retired (one of
        their tasks failed for the machine's fault), as for a block the watchdog found lost."""
        while not self.retired.empty():
            label, block = self.retired.get()
            watchdog.forget_block(label, block)
            futures = {**self.submitter.stages, **self.submitter.futures}
            for executor in executors:
                if executor.label == label:
                    fail_lost_tasks(executor, block, futures, watchdog.beats())

    def _report(self, console: Console) -> int:
        """Write and print the report; 1 when a member or stage failed."""
        workflow, run_dir, submitter = self.workflow, self.run_dir, self.submitter
        futures = {**submitter.stages, **submitter.futures}
        failed = {name: f.exception() for name, f in futures.items() if f.exception() is not None}
        for name in submitter.futures:  # its process died after the result was written: a warning event says so
            if name in failed and has_result(run_dir, name):
                del failed[name]
        reports = [f.result() for f in self.ondemand.futures if f.exception() is None]
        everyone = self.index.members()
        statuses = self.tracker.update([(m.name, m.steps) for m in everyone], {m.name: m.family for m in everyone})
        title = f"{workflow.name}: {time.monotonic() - self.started:.0f} s on {self.plan.site}"
        extra = []
        if self.stages:
            extra.append(stage_table(run_dir, self.stages))
        if workflow.explore:
            extra.append(campaign_table(workflow, everyone, statuses))
        if any(request.slots for request in workflow.analytics):
            extra.append(ondemand_table(run_dir))
        summary, plot = run_path(run_dir, workflow.report.summary), run_path(run_dir, workflow.report.plot)
        try:
            table = write_report(statuses, summary, plot, title, tuple(extra), run_dir)
        except OSError as exc:  # a full or failing file system must not hide how the run ended
            console.print(f"[bold red]could not write the report:[/] {exc}")
            table = status_table(statuses, title)
        page = run_path(run_dir, workflow.report.page)
        try:
            write_dashboard_report(run_dir, page)
        except (OSError, ResilientFlowsError) as exc:  # the tables and the plot are written: say so, go on
            console.print(f"[bold yellow]could not write the report page {escape(str(page))}:[/] {escape(str(exc))}")
        console.print(table)
        console.print(OutputTails(run_dir, failed_tails(run_dir, statuses.values())), crop=False)
        for shown in extra:
            console.print(shown)
        for report in reports:
            for name, values in report.items():
                shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
                console.print(f"analytics {name}: {shown}")
        for name, exc in failed.items():
            what = "stage" if name in submitter.stages else "member"
            console.print(f"[bold red]{what} {name} failed:[/] {escape(f'{type(exc).__name__}: {exc}')}")
            console.print(f"  its output: {escape(logs_command(run_dir, name))}", soft_wrap=True)
        console.print(f"report: {summary}, {plot}, {page}")
        return 1 if failed else 0
