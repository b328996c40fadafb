"""Where everything of a run lies. ::

    <run>/workflow.yaml        the workflow file as given
    <run>/plan.json            the validated workflow, its site and every member's spec
    <run>/events.jsonl         everything that happened (resilient_flows.rundir._events)
    <run>/blocks.jsonl         the pilot jobs and interchanges of every runner (the block ledger)
    <run>/runner.json          the runner's lease; <run>/guard.log its guard's output
    <run>/runner.log           what libraries said while a runner ran (warnings, log records), and
                               the whole output of runners started with ``--detach``; appended
    <run>/block-times.json     when each running block started, ends and is drained (members read it)
    <run>/blocks/<job>/lost-nodes.json  the nodes a batch job (a block) lost: no member launches there again
    <run>/heartbeats/<task>    one file per running attempt (members, stages, analytics)
    <run>/parsl/               Parsl's run directory: submit scripts, interchange and worker logs
    <run>/parsl/monitoring.db  Parsl's monitoring database, for parsl-visualize (``monitoring: true``)
    <run>/report/              summary table and loss plot (where the workflow's report: says)
    <run>/members/<name>/      a member (clones included), laid out as a TaskLayout
    <run>/stages/<name>/       a stage of a pipeline, laid out as a TaskLayout

A member's or stage's directory::

    spec.json                  its spec (members registered after planning: clones)
    attempts                   how many attempts have started
    checkpoints/               its shared checkpoint tier
    metrics.jsonl              a line per step logged
    control.json               a request to stop or retire, from the runner or the CLI
    pace.json                  its observed seconds per step and per checkpoint commit, kept across attempts
    declined.json              the last attempt that declined to start (its block about to be drained)
    fault.json                 how the last failed attempt of a member on several ranks failed, as a rank saw it
    logs/attempt-<n>.log       what attempt n printed (stdout and stderr, in order), its traceback last;
                               logs/attempt-<n>.rank-<r>.log: rank r of a member on several MPI ranks
    clone-order.<request>.json (an order to clone it), seed.json (what a clone started from), handoff.json
    (a fork's hand-off), command-result.json (a command's report), output/ (a stage's output),
    result.json (written last: the task finished)

The properties are names, so that the runner, the members and the views agree; the ``read_*`` and
``write_*`` methods are the files' I/O, each file with the cap of its kind (:mod:`resilient_flows.capped`)
and written atomically (:mod:`resilient_flows.rundir._files`).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import Any

from resilient_flows.capped import CONTROL_CAP, DOCUMENT_CAP, read_capped
from resilient_flows.durable import write_atomically
from resilient_flows.rundir._files import read_json, read_object, write_json


@dataclass(frozen=True)
class TaskLayout:
    """The directory of one member or stage."""

    root: Path

    @property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @property
    def attempts(self) -> Path:
        return self.root / "attempts"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def control(self) -> Path:
        return self.root / "control.json"

    @property
    def pace(self) -> Path:
        return self.root / "pace.json"

    @property
    def declined(self) -> Path:
        return self.root / "declined.json"

    @property
    def fault(self) -> Path:
        return self.root / "fault.json"

    @property
    def seed(self) -> Path:
        return self.root / "seed.json"

    @property
    def handoff(self) -> Path:
        return self.root / "handoff.json"

    @property
    def logs(self) -> Path:
        """What each attempt printed: ``attempt-<n>.log``, its stdout and stderr interleaved as a
        terminal shows them, a failed attempt's traceback last; ``attempt-<n>.rank-<r>.log``, rank
        r's of a member on several MPI ranks (rank 0's, with its launcher's messages, is ``attempt-<n>.log``)."""
        return self.root / "logs"

    def attempt_log(self, attempt: int, rank: int = 0) -> Path:
        """What attempt ``attempt`` printed: rank 0's (and its launcher's) in ``attempt-<n>.log``,
        another rank's in ``attempt-<n>.rank-<r>.log``."""
        return self.logs / (f"attempt-{attempt}.log" if rank == 0 else f"attempt-{attempt}.rank-{rank}.log")

    @property
    def command_report(self) -> Path:
        return self.root / "command-result.json"

    @property
    def output(self) -> Path:
        """A stage's output, which later stages read."""
        return self.root / "output"

    @property
    def result(self) -> Path:
        return self.root / "result.json"

    def clone_order(self, request: str, suffix: str = ".json") -> Path:
        """An order to clone this member for ``request`` (``.forking`` once being served)."""
        return self.root / f"clone-order.{request}{suffix}"

    def clone_orders(self) -> list[Path]:
        """Every pending clone order here, in no particular order."""
        return list(self.root.glob(self.clone_order("*").name))

    def write_spec(self, spec: dict[str, Any]) -> None:
        """Register the task: its directory and spec."""
        self.root.mkdir(parents=True, exist_ok=True)
        write_json(self.spec, spec, indent=2)

    def read_spec(self) -> Any:
        return read_object(self.spec, DOCUMENT_CAP, "member spec")

    def read_attempts(self) -> int:
        """How many attempts have started; 0 before the first."""
        try:
            return int(read_capped(self.attempts, CONTROL_CAP, "attempt counter") or 0)
        except FileNotFoundError:
            return 0

    def count_attempt(self) -> int:
        """Count one more attempt; which attempt it is (1 for the first)."""
        attempt = self.read_attempts() + 1
        write_json(self.attempts, attempt)
        return attempt

    def write_control(self, action: str, reason: str, block: str | None = None) -> Path:
        """``block``: the request is meant for the attempt on that Parsl block only (a block's drain)."""
        self.root.mkdir(parents=True, exist_ok=True)
        record = {"action": action, "reason": reason, **({} if block is None else {"block": block})}
        write_json(self.control, record)
        return self.control

    def read_control(self) -> Any:
        return read_object(self.control, CONTROL_CAP, "control request")

    def write_pace(self, record: dict[str, Any]) -> None:
        """Not fsynced: advice for the next attempt, rewritten at every stop."""
        write_json(self.pace, record, fsync=False)

    def read_pace(self) -> Any:
        return read_json(self.pace, CONTROL_CAP, "member pace")

    def write_declined(self, record: dict[str, Any]) -> None:
        write_json(self.declined, record, fsync=False)

    def read_declined(self) -> Any:
        return read_json(self.declined, CONTROL_CAP, "declined start")

    def write_fault(self, record: dict[str, Any]) -> None:
        write_json(self.fault, record, fsync=False)

    def read_fault(self) -> Any:
        return read_json(self.fault, CONTROL_CAP, "rank fault")

    def write_clone_order(self, request: str, order: dict[str, Any]) -> Path:
        path = self.clone_order(request)
        self.root.mkdir(parents=True, exist_ok=True)
        write_json(path, order)
        return path

    def read_clone_order(self, path: Path) -> Any:
        """One of :meth:`clone_orders`."""
        return read_json(path, CONTROL_CAP, "clone order")

    def write_fork_marker(self, request: str, record: dict[str, Any]) -> None:
        """Mark the order for ``request`` as being served (by which attempt and process); not
        fsynced: it is advice to the clones waiting for the hand-off, on the source's critical path."""
        write_json(self.clone_order(request, ".forking"), record, fsync=False)

    def read_fork_marker(self, request: str) -> Any:
        return read_json(self.clone_order(request, ".forking"), CONTROL_CAP, "fork marker")

    def remove_fork_marker(self, request: str) -> None:
        self.clone_order(request, ".forking").unlink(missing_ok=True)

    def write_seed(self, record: dict[str, Any]) -> None:
        write_json(self.seed, record)

    def read_seed(self) -> Any:
        return read_object(self.seed, CONTROL_CAP, "clone seed")

    def write_handoff(self, record: dict[str, Any]) -> None:
        """Not fsynced, like the fork marker: written on the source's critical path."""
        write_json(self.handoff, record, fsync=False)

    def read_handoff(self) -> Any:
        return read_json(self.handoff, CONTROL_CAP, "fork hand-off")

    def write_command_report(self, report: dict[str, Any]) -> None:
        write_json(self.command_report, report, indent=2)

    def read_command_report(self) -> Any:
        return read_json(self.command_report, DOCUMENT_CAP, "the command's report")

    def write_result(self, result: dict[str, Any]) -> None:
        """Written last: from then on the task counts as finished, whatever its process does."""
        write_json(self.result, result, indent=2)

    def read_result(self) -> dict[str, Any] | None:
        """The result, or None while there is none (it is renamed into place whole); one that is
        damaged is :class:`~resilient_flows.errors.DamagedFileError`."""
        try:
            return read_object(self.result, DOCUMENT_CAP, "member result")
        except FileNotFoundError:
            return None

    def has_result(self) -> bool:
        """Whether the result is in place: a regular file, as :meth:`read_result` reads it (a
        link, perhaps to another run's result, is none)."""
        try:
            return S_ISREG(self.result.lstat().st_mode)
        except OSError:
            return False


@dataclass(frozen=True)
class RunLayout:
    """The run directory ``root``."""

    root: Path

    @property
    def workflow(self) -> Path:
        return self.root / "workflow.yaml"

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def blocks(self) -> Path:
        return self.root / "blocks.jsonl"

    @property
    def lease(self) -> Path:
        return self.root / "runner.json"

    @property
    def block_times(self) -> Path:
        return self.root / "block-times.json"

    @property
    def guard_log(self) -> Path:
        return self.root / "guard.log"

    @property
    def runner_log(self) -> Path:
        return self.root / "runner.log"

    @property
    def heartbeats(self) -> Path:
        return self.root / "heartbeats"

    @property
    def parsl(self) -> Path:
        return self.root / "parsl"

    @property
    def monitoring_db(self) -> Path:
        """Parsl's monitoring database, for ``parsl-visualize``: every Parsl instance of the run (a
        resume, a restart after a lost interchange) adds its workflow row to the same one."""
        return self.parsl / "monitoring.db"

    @property
    def members(self) -> Path:
        return self.root / "members"

    @property
    def stages(self) -> Path:
        return self.root / "stages"

    def member(self, name: str) -> TaskLayout:
        return TaskLayout(self.members / name)

    def stage(self, name: str) -> TaskLayout:
        return TaskLayout(self.stages / name)

    def write_workflow(self, source_text: str) -> None:
        """The workflow file as given, kept beside its plan."""
        write_atomically(self.workflow, source_text)

    def spec_files(self) -> list[Path]:
        """The spec file of every member directory, in the order they were written (registered). A
        symbolic link is no member directory (walks of a run directory follow none), but a spec file
        that is one is listed, for its reader to refuse and say so."""
        try:
            entries = list(os.scandir(self.members))
        except (FileNotFoundError, NotADirectoryError):
            return []
        spec_name = TaskLayout(self.members).spec.name
        found = []
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                path = Path(entry.path, spec_name)
                with contextlib.suppress(FileNotFoundError):
                    found.append((path.lstat().st_mtime_ns, entry.name, path))
        return [path for _, _, path in sorted(found)]

    def heartbeat(self, task: str) -> Path:
        return self.heartbeats / task

    def lost_nodes(self, job: str) -> Path:
        """The nodes the batch job ``job`` (a block, by its scheduler's id) lost."""
        return self.root / "blocks" / job / "lost-nodes.json"

    def write_lost_nodes(self, job: str, record: dict[str, Any]) -> None:
        path = self.lost_nodes(job)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, record, fsync=False)

    def read_lost_nodes(self, job: str) -> Any:
        return read_json(self.lost_nodes(job), CONTROL_CAP, "lost nodes")

    def write_block_times(self, record: dict[str, Any]) -> None:
        """Not fsynced: rewritten by the runner whenever a block starts, ends or its drain moves."""
        write_json(self.block_times, record, fsync=False)

    def read_block_times(self) -> Any:
        return read_json(self.block_times, DOCUMENT_CAP, "block times")

    def read_lease(self) -> Any:
        return read_json(self.lease, CONTROL_CAP, "runner lease")

    def write_lease(self, record: dict[str, Any]) -> None:
        """Not fsynced: the lease lives by its mtime, renewed every few seconds."""
        write_json(self.lease, record, fsync=False)


def run_layout(run_dir: str | os.PathLike) -> RunLayout:
    return RunLayout(Path(run_dir))


def member_layout(run_dir: str | os.PathLike, name: str) -> TaskLayout:
    return RunLayout(Path(run_dir)).member(name)


def stage_layout(run_dir: str | os.PathLike, name: str) -> TaskLayout:
    return RunLayout(Path(run_dir)).stage(name)


def member_dir(run_dir: str | os.PathLike, name: str) -> Path:
    return member_layout(run_dir, name).root


def has_result(run_dir: str | os.PathLike, name: str) -> bool:
    """Whether member ``name`` finished: its result is written last, durably, once its
    final checkpoint is committed, so whatever its process does afterwards cannot undo that."""
    return member_layout(run_dir, name).has_result()


def count_attempt(directory: Path) -> int:
    """Count one more attempt of the task whose directory this is; which attempt it is (1 for the first)."""
    return TaskLayout(directory).count_attempt()
