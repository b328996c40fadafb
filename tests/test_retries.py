"""Retries that tell the truth: a stop is free only while the member makes progress, quick attempts
back off, and a member whose process dies after writing its result finished (with a warning)."""

from __future__ import annotations

import datetime
import json
import math
from pathlib import Path
from typing import Any

import pytest
from parsl.executors.high_throughput.errors import WorkerLost

from resilient_flows.apps import BACKOFF_S, MAX_BACKOFF_S, ResumingRetryHandler
from resilient_flows.errors import Preempted
from resilient_flows.rundir import DamageLog, attempt_heartbeat_path
from resilient_flows.training import MemberSpec, read_events
from resilient_flows.training._command import run_command

LAUNCHED = datetime.datetime(2026, 12, 5, 12, 0, 0)


def record_of(spec: MemberSpec, run_dir: Path, took_s: float = 60.0, fail_cost: float = 0, try_id: int = 0) -> dict:
    """A Parsl task record as the retry handler sees it, for an attempt that ran ``took_s``."""
    return {
        "id": 0,
        "func_name": "command_app",
        "args": (spec.to_dict(), str(run_dir)),
        "kwargs": {},
        "fail_cost": fail_cost,
        "try_id": try_id,
        "try_time_launched": LAUNCHED,
        "try_time_returned": LAUNCHED + datetime.timedelta(seconds=took_s),
    }


def commit(run_dir: Path, name: str, step: int) -> None:
    """A committed checkpoint of ``step`` in the member's shared tier, as the runner sees one."""
    directory = run_dir / "members" / name / "checkpoints" / f"step-{step:08d}"
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text("{}")


def failures(run_dir: Path) -> list[tuple[str, float]]:
    return [(e["cause"], e["cost"]) for e in read_events(run_dir) if e["kind"] == "failed"]


def member(name: str = "m", command: tuple[str, ...] = ("true",)) -> MemberSpec:
    return MemberSpec(name=name, workload="", params={}, steps=20, command=list(command))


def test_stops_without_progress_are_free_only_up_to_the_limit(tmp_path: Path) -> None:
    spec = member()
    handler = ResumingRetryHandler(retries=5, free_without_progress=2)
    record = record_of(spec, tmp_path)
    costs = []
    for _ in range(4):
        cost = handler(Preempted("m", None, "exit 75"), record)
        record["fail_cost"] += cost
        record["try_id"] += 1
        costs.append(cost)
    assert costs == [0.0, 0.0, 1.0, 1.0]
    causes = failures(tmp_path)
    assert causes[:2] == [("preempted", 0.0)] * 2
    assert causes[2] == ("preempted without progress (3 attempts in a row without a newer checkpoint)", 1.0)
    assert causes[3][0].startswith("preempted without progress (4 attempts")


def test_once_the_runner_stops_nothing_is_retried_and_a_stop_leaves_its_own_event_last(tmp_path: Path) -> None:
    """Ctrl-C: a member that stopped as asked is not requeued, and no `failed` event follows its
    `preempted` one; another failure is recorded, with no `retried`."""
    handler = ResumingRetryHandler(retries=5)
    handler.stop_requeueing()
    assert handler(Preempted("m", 4, "the runner was stopped (SIGINT)"), record_of(member(), tmp_path)) == math.inf
    assert list(read_events(tmp_path)) == []
    assert handler(RuntimeError("boom"), record_of(member("other"), tmp_path)) == math.inf
    assert [e["kind"] for e in read_events(tmp_path)] == ["failed"]


def test_a_task_that_ends_in_an_abandoned_parsl_instance_is_no_failure_and_is_given_up(tmp_path: Path) -> None:
    """The interchange was lost: a retry whose submission finds the instance's connections closed
    (it raced the runner's abandon) is neither recorded nor retried, and is named for the next
    instance; before, each such submission cost a retry, and a member could run out of them."""
    import zmq

    handler = ResumingRetryHandler(retries=2)
    handler.abandon()
    for error in (zmq.error.ContextTerminated(), zmq.error.ZMQError(88, "Socket operation on non-socket")):
        assert handler(error, record_of(member(), tmp_path)) == math.inf
    assert list(read_events(tmp_path)) == [] and handler.given_up == {"m"}


def test_a_restart_submits_again_what_the_abandoned_instance_gave_up(tmp_path: Path) -> None:
    from concurrent.futures import Future

    from resilient_flows.workflow._runner import _Submitter

    submitter = _Submitter(tmp_path)
    done, failed, running = Future(), Future(), Future()
    done.set_result({"member": "a"})
    failed.set_exception(RuntimeError("out of retries in the lost instance"))
    submitter.futures = {"a": done, "b": failed, "c": running, "d": Future()}
    submitter.specs = {name: member(name) for name in "abcd"}
    restarted = submitter.restart(adopted={"d"}, given_up={"b"})
    assert [m.name for m in restarted] == ["b", "c"] and set(submitter.futures) == {"a", "d"}


def test_an_adopted_attempt_that_ends_after_a_restart_lets_the_run_end(tmp_path: Path) -> None:
    """The runner resumed, adopted an earlier runner's attempt, lost its interchange and started
    Parsl again; the adopted attempt ended after that. Before, the run then never ended."""
    from concurrent.futures import Future

    from resilient_flows.workflow._runner import _Submitter

    submitter = _Submitter(tmp_path)
    adopted, lost = Future(), Future()
    submitter.adopt(member("a"), adopted)
    submitter.futures["b"], submitter.specs["b"] = lost, member("b")
    submitter._watch(lost)
    assert [m.name for m in submitter.restart(adopted={"a"})] == ["b"] and not submitter.all_done()
    adopted.set_result({"member": "a"})
    assert submitter.all_done()


def test_a_newer_checkpoint_makes_the_next_stops_free_again(tmp_path: Path) -> None:
    spec = member()
    handler = ResumingRetryHandler(retries=5, free_without_progress=1)
    record = record_of(spec, tmp_path)
    assert handler(Preempted("m", None, "exit 75"), record) == 0.0  # first stop: free
    commit(tmp_path, "m", 4)
    assert handler(Preempted("m", 4, "exit 75"), record) == 0.0  # progress: the streak starts over
    assert handler(Preempted("m", 4, "exit 75"), record) == 0.0  # one free stop without progress
    assert handler(Preempted("m", 4, "exit 75"), record) == 1.0


def test_starts_declined_near_a_drain_are_free_and_not_stops_without_progress(tmp_path: Path) -> None:
    """A member that declined to start (its block drained before it could checkpoint) trained
    nothing by design: however often a retry lands on that block again, it costs nothing, and the
    streak of stops without progress is neither grown nor reset by it."""
    from resilient_flows.training._walltime import write_declined

    spec = member()
    (tmp_path / "members" / "m").mkdir(parents=True)
    handler = ResumingRetryHandler(retries=1, free_without_progress=2)
    record = record_of(spec, tmp_path, took_s=1.0)
    assert handler(Preempted("m", None, "exit 75"), record) == 0.0  # a plain stop: the streak is 1
    for _ in range(5):
        record["try_id"] += 1
        write_declined(tmp_path / "members" / "m", record["try_id"] + 1, "7")
        assert handler(Preempted("m", None, "declined"), record) == 0.0
    record["try_id"] += 1
    assert handler(Preempted("m", None, "exit 75"), record) == 0.0  # the second plain stop in a row
    record["try_id"] += 1
    assert handler(Preempted("m", None, "exit 75"), record) == 1.0
    causes = [cause for cause, _ in failures(tmp_path)]
    assert causes[1:6] == ["declined to start: its block is drained before a checkpoint"] * 5


def test_quick_attempts_back_off_doubling_and_a_long_one_resets_the_wait(tmp_path: Path) -> None:
    spec = member()
    handler = ResumingRetryHandler(retries=100, free_without_progress=100)
    waits: list[float | None] = []
    for ran in (0.2, 0.2, 0.2, 120.0, 0.2):  # seconds each attempt ran after its backoff
        record = record_of(spec, tmp_path, took_s=(waits[-1] or 0.0) + ran if waits else ran)
        handler(Preempted("m", None, "exit 75"), record)
        waits.append(record["kwargs"].get("backoff_s"))
    assert waits == [BACKOFF_S, 2 * BACKOFF_S, 4 * BACKOFF_S, None, BACKOFF_S]
    retried = [e.get("wait_s") for e in read_events(tmp_path) if e["kind"] == "retried"]
    assert retried == waits


def test_a_quick_attempt_that_committed_a_checkpoint_is_retried_without_a_backoff(tmp_path: Path) -> None:
    """A node lost three seconds into an attempt that checkpointed: no crash loop, so the retry
    (on a spare node) starts at once; the same attempt without progress waits."""
    spec = member()
    handler = ResumingRetryHandler(retries=100, free_without_progress=100)
    commit(tmp_path, "m", 4)
    progressed = record_of(spec, tmp_path, took_s=3.0)
    handler(Preempted("m", None, "exit 75"), progressed)
    stalled = record_of(spec, tmp_path, took_s=3.0, try_id=1)
    handler(Preempted("m", None, "exit 75"), stalled)
    assert (progressed["kwargs"].get("backoff_s"), stalled["kwargs"].get("backoff_s")) == (None, BACKOFF_S)
    assert [e.get("wait_s") for e in read_events(tmp_path) if e["kind"] == "retried"] == [None, BACKOFF_S]


def test_the_backoff_doubles_up_to_its_cap_although_each_attempt_sleeps_it_first(tmp_path: Path) -> None:
    """An attempt's length counts from its launch, its backoff included: that must not make it long."""
    handler = ResumingRetryHandler(retries=100, free_without_progress=100)
    spec = member()
    slept = 0.0
    for _ in range(8):
        record = record_of(spec, tmp_path, took_s=slept + 0.5)
        handler(Preempted("m", None, "exit 75"), record)
        slept = record["kwargs"]["backoff_s"]
    waits = [e["wait_s"] for e in read_events(tmp_path) if e["kind"] == "retried"]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, MAX_BACKOFF_S, MAX_BACKOFF_S, MAX_BACKOFF_S]


@pytest.mark.parametrize("exception", [WorkerLost(3, "n1"), RuntimeError("gloo abort")])
def test_a_member_whose_process_dies_after_its_result_is_not_retried_nor_failed(
    tmp_path: Path, exception: Exception
) -> None:
    spec = MemberSpec(name="m", workload="mlp-digits", params={}, steps=20)
    (tmp_path / "members" / "m").mkdir(parents=True)
    (tmp_path / "members" / "m" / "result.json").write_text('{"member": "m"}')
    record: dict[str, Any] = {**record_of(spec, tmp_path), "func_name": "train_app"}
    assert ResumingRetryHandler(retries=2)(exception, record) == math.inf
    events = list(read_events(tmp_path))
    assert [e["kind"] for e in events] == ["warning"]
    assert "after writing its result" in events[0]["reason"] and type(exception).__name__ in events[0]["reason"]


def test_a_command_that_aborts_after_reporting_its_result_finished_with_a_warning(tmp_path: Path) -> None:
    """What torch's gloo threads do at interpreter exit now and then: SIGABRT after everything is committed."""
    report = '"$RESILIENT_FLOWS_RUN_DIR/members/$RESILIENT_FLOWS_MEMBER/command-result.json"'
    spec = member(command=("sh", "-c", f"echo '{{\"loss\": 0.5}}' > {report}; kill -ABRT $$"))
    result = run_command(spec.to_dict(), str(tmp_path))
    assert (result["loss"], result["exit_status"]) == (0.5, -6)
    kinds = [(e["kind"], e.get("reason")) for e in read_events(tmp_path) if e["kind"] != "started"]
    assert kinds == [
        ("warning", "the command was killed by SIGABRT after reporting its result"),
        ("finished", None),
    ]
    assert (tmp_path / "members" / "m" / "result.json").is_file()


def test_a_command_that_fails_after_reporting_its_result_failed(tmp_path: Path) -> None:
    """Only a signal at exit is forgiven: a script that reports, then fails in its own code, failed."""
    from resilient_flows.training._command import CommandFailed

    report = '"$RESILIENT_FLOWS_RUN_DIR/members/$RESILIENT_FLOWS_MEMBER/command-result.json"'
    spec = member(command=("sh", "-c", f"echo '{{}}' > {report}; exit 1"))
    with pytest.raises(CommandFailed, match="status 1"):
        run_command(spec.to_dict(), str(tmp_path))
    assert not (tmp_path / "members" / "m" / "result.json").exists()


def test_a_command_that_aborts_before_reporting_is_killed_not_finished(tmp_path: Path) -> None:
    from resilient_flows.training._command import CommandKilled

    spec = member(command=("sh", "-c", "kill -ABRT $$"))
    with pytest.raises(CommandKilled, match="SIGABRT"):
        run_command(spec.to_dict(), str(tmp_path))
    assert not (tmp_path / "members" / "m" / "result.json").exists()


@pytest.mark.slow
def test_a_script_that_only_exits_75_ends_and_one_that_aborts_after_its_result_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the runner on the local site: the first would have been requeued forever, the
    second retried although it finished."""
    from resilient_flows import apps
    from resilient_flows.cli import main

    # Every attempt here counts as quick, however long it queued for a worker on a loaded machine
    # (an attempt's length counts from its launch): the backoff doubles each time (the reset after
    # a long attempt is test_quick_attempts_back_off_doubling_and_a_long_one_resets_the_wait's).
    monkeypatch.setattr(apps, "QUICK_ATTEMPT_S", 600.0)

    report = '"$RESILIENT_FLOWS_RUN_DIR/members/$RESILIENT_FLOWS_MEMBER/command-result.json"'
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(
        "name: truth\nretries: 1\nfree_stops: 2\nmembers:\n"
        "  - {name: stuck, steps: 1, command: [sh, -c, 'exit 75']}\n"
        f"  - {{name: aborts, steps: 1, command: [sh, -c, {json.dumps(f'echo {{{{}}}} > {report}; kill -ABRT $$')}]}}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["run", str(workflow), "--run-dir", str(run_dir)]) == 1  # stuck failed, aborts did not
    events = list(read_events(run_dir))
    stuck = [(e["kind"], e.get("cause"), e.get("cost")) for e in events if e["member"] == "stuck"]
    free, costly = ("failed", "preempted", 0.0), ("failed", "preempted without progress", 1.0)
    assert [(kind, cause.split(" (")[0], cost) for kind, cause, cost in stuck if kind == "failed"] == [
        free,
        free,
        costly,
        costly,
    ]
    assert sum(kind == "started" for kind, _, _ in stuck) == 4  # 1 + 2 free + 1 paid retry (retries: 1)
    waits = [e["wait_s"] for e in events if e["member"] == "stuck" and e["kind"] == "retried"]
    assert waits == [1.0, 2.0, 4.0]
    aborts = [e["kind"] for e in events if e["member"] == "aborts"]
    assert aborts[-2:] == ["warning", "finished"] and "failed" not in aborts and "retried" not in aborts

    assert main(["status", str(run_dir)]) == 1
    from resilient_flows.workflow._status import member_statuses

    states = {name: s.state for name, s in member_statuses(run_dir, [("stuck", 1), ("aborts", 1)]).items()}
    assert states == {"stuck": "failed", "aborts": "finished"}


# ----------------------------------------------------------------------------- the machine's faults


def mpi_record(spec: MemberSpec, run_dir: Path, try_id: int = 0) -> dict[str, Any]:
    """The task record of a member on several nodes, run by the executor ``slurm``."""
    return {**record_of(spec, run_dir, try_id=try_id), "func_name": "mpi_train_app", "executor": "slurm"}


def nodes_member() -> MemberSpec:
    return MemberSpec(name="m", workload="mlp-digits", params={}, steps=20, ranks=2, nodes=2)


def started_attempt(run_dir: Path, name: str = "m") -> Path:
    """The member's directory with one more attempt counted, as its rank 0 does when it starts."""
    from resilient_flows.rundir import TaskLayout

    directory = run_dir / "members" / name
    directory.mkdir(parents=True, exist_ok=True)
    TaskLayout(directory).count_attempt()
    return directory


def test_a_lost_worker_pool_is_the_machines_fault_its_block_retired_before_the_retry(tmp_path: Path) -> None:
    """``ManagerLost``: free even without progress (while stops would be), its block handed over."""
    from parsl.executors.high_throughput.errors import ManagerLost

    retired: list[tuple[str, str, str]] = []
    handler = ResumingRetryHandler(retries=2, free_without_progress=1, on_block_lost=lambda *a: retired.append(a))
    spec = nodes_member()
    started_attempt(tmp_path)
    beat = attempt_heartbeat_path(tmp_path, "m")  # the lost attempt's, left behind by its killed process
    beat.parent.mkdir(parents=True)
    beat.write_text(json.dumps({"task": "m", "attempt": 1, "block": "4", "committed": None}))
    record = mpi_record(spec, tmp_path)
    assert handler(ManagerLost(b"x", "n1"), record) == 0.0
    assert handler(ManagerLost(b"x", "n1"), record) == 1.0  # a second in a row without progress
    first, second = [e for e in read_events(tmp_path) if e["kind"] == "failed"]
    assert (first["failure_kind"], first["cause"], first["cost"]) == (
        "infrastructure",
        "infrastructure: its worker pool was lost",
        0.0,
    )
    assert second["cause"].startswith("infrastructure: its worker pool was lost without progress (2 attempts")
    assert [(label, block) for label, block, _ in retired] == [("slurm", "4")]  # the second had no heartbeat left


def test_a_hung_worker_its_pool_replaced_is_the_machines_fault_and_its_block_is_kept(tmp_path: Path) -> None:
    """``WorkerHung``: free without progress, unlike a plain lost worker, and no block is retired:
    the pool that found it stopped lives on, with a new worker for the retry."""
    from resilient_flows.sites._hung import WorkerHung

    retired: list[tuple[str, str, str]] = []
    handler = ResumingRetryHandler(retries=2, on_block_lost=lambda *a: retired.append(a))
    spec = member()
    started_attempt(tmp_path)
    beat = attempt_heartbeat_path(tmp_path, "m")
    beat.parent.mkdir(parents=True)
    beat.write_text(json.dumps({"task": "m", "attempt": 1, "block": "0", "committed": None}))
    record = {**record_of(spec, tmp_path), "executor": "local"}
    assert handler(WorkerHung(1, "n1", 2.5), record) == 0.0
    assert handler(WorkerLost(1, "n1"), record) == 1.0  # the same loss, its cause unknown: charged
    assert failures(tmp_path) == [
        (
            "infrastructure: its worker hung (worker 1 on host n1 was stopped for 2.5 s: its pool killed it and "
            "started another)",
            0.0,
        ),
        ("lost without progress", 1.0),
    ]
    assert retired == []


def test_the_retry_after_a_lost_pool_keeps_its_place_ahead_of_members_never_started(tmp_path: Path) -> None:
    """With ``lost_priority`` (HTEX's queue by priority), the retry after the machine's fault is sent
    at it, the task's other resources kept; a retry after the member's own error keeps none."""
    from parsl.executors.high_throughput.errors import ManagerLost

    handler = ResumingRetryHandler(retries=2, lost_priority=1)
    spec = member()
    started_attempt(tmp_path)
    beat = attempt_heartbeat_path(tmp_path, "m")
    beat.parent.mkdir(parents=True)
    beat.write_text(json.dumps({"task": "m", "attempt": 1, "block": "0", "committed": None}))
    lost = {**record_of(spec, tmp_path), "executor": "local", "resource_specification": {"other": 3}}
    assert handler(ManagerLost(b"x", "vm"), lost) == 0.0
    assert lost["resource_specification"] == {"other": 3, "priority": 1}
    crashed = {**record_of(spec, tmp_path), "id": 1, "executor": "local", "resource_specification": {}}
    assert handler(RuntimeError("its own bug"), crashed) == 1.0
    assert crashed["resource_specification"] == {}
    unordered = {**record_of(spec, tmp_path), "id": 2, "executor": "local", "resource_specification": {}}
    assert ResumingRetryHandler(retries=2)(ManagerLost(b"x", "vm"), unordered) == 0.0
    assert unordered["resource_specification"] == {}


def test_a_rank_that_saw_its_peer_gone_makes_the_launchers_exit_status_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node of rank 1 died: srun exits 1, but rank 0 recorded that its peer's connection closed."""
    from parsl.app.errors import BashExitFailure

    from resilient_flows.training import record_fault

    retired: list[tuple[str, str, str]] = []
    handler = ResumingRetryHandler(retries=2, on_block_lost=lambda *a: retired.append(a))
    directory = started_attempt(tmp_path)
    monkeypatch.setenv("PARSL_WORKER_BLOCK_ID", "0")  # rank 0 runs in its block's worker pool
    closed = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.247.0.3]:46809")
    record_fault(directory, 0, closed)
    assert handler(BashExitFailure("mpi_train_app", 1), mpi_record(nodes_member(), tmp_path)) == 0.0
    (failed,) = [e for e in read_events(tmp_path) if e["kind"] == "failed"]
    assert failed["failure_kind"] == "infrastructure" and failed["cost"] == 0.0
    assert failed["cause"].startswith("infrastructure: a peer rank is gone (rank 0 on ")
    assert [(label, block) for label, block, _ in retired] == [("slurm", "0")]
    assert not (directory / "fault.json").exists()  # consumed: it was about that attempt only


def test_a_node_lost_with_a_spare_left_in_its_block_keeps_the_block_for_the_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launch watcher found rank 1's node dead and one node left beside the survivor: the
    retry restarts in the same block, which is not retired; once no spare is left, it is."""
    from parsl.app.errors import BashExitFailure

    from resilient_flows.rundir import TaskLayout
    from resilient_flows.training import record_fault

    retired: list[tuple[str, str, str]] = []
    handler = ResumingRetryHandler(retries=2, on_block_lost=lambda *a: retired.append(a))
    monkeypatch.setenv("PARSL_WORKER_BLOCK_ID", "0")
    for left, kept in ((2, True), (1, False)):
        directory = started_attempt(tmp_path)
        record_fault(directory, 0, RuntimeError("Connection closed by peer [10.247.0.3]:46809"))
        layout = TaskLayout(directory)
        layout.write_fault({**layout.read_fault(), "lost_nodes": ["n2"], "nodes_left": left, "nodes_needed": 2})
        assert handler(BashExitFailure("mpi_train_app", 1), mpi_record(nodes_member(), tmp_path)) == 0.0
        failed = [e for e in read_events(tmp_path) if e["kind"] == "failed"][-1]
        assert failed["failure_kind"] == "infrastructure" and failed["cost"] == 0.0
        assert failed["cause"].endswith("; node(s) n2 lost, 2 left in its block") == kept, failed["cause"]
        assert [(label, block) for label, block, _ in retired] == ([] if kept else [("slurm", "0")])


def test_a_rank_that_failed_on_its_own_is_charged_though_its_peer_saw_it_gone(tmp_path: Path) -> None:
    from parsl.app.errors import BashExitFailure

    from resilient_flows.training import attempt_fault, record_fault

    retired: list[tuple[str, str, str]] = []
    handler = ResumingRetryHandler(retries=2, on_block_lost=lambda *a: retired.append(a))
    directory = started_attempt(tmp_path)
    record_fault(directory, 1, ValueError("a bug in the workload"))
    record_fault(directory, 0, ConnectionResetError("Connection reset by peer"))
    fault = attempt_fault(directory)
    assert fault is not None and (fault["kind"], fault["rank"]) == ("error", 1)
    assert handler(BashExitFailure("mpi_train_app", 1), mpi_record(nodes_member(), tmp_path)) == 1.0
    (failed,) = [e for e in read_events(tmp_path) if e["kind"] == "failed"]
    assert (failed["failure_kind"], failed["cause"]) == ("error", "error") and retired == []


def test_an_attempt_that_saw_its_pool_gone_and_stopped_is_free_and_its_block_retired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool whose multiprocessing manager died can still report the attempt's stop (exit 75):
    the attempt's record makes it the machine's fault, and its block gets no retry."""
    from resilient_flows.training import record_pool_lost

    retired: list[tuple[str, str, str]] = []
    handler = ResumingRetryHandler(retries=0, on_block_lost=lambda *a: retired.append(a))
    directory = started_attempt(tmp_path)
    monkeypatch.setenv("PARSL_WORKER_BLOCK_ID", "2")
    record_pool_lost(directory, "its worker pool's multiprocessing manager (pid 9) exited")
    stopped = Preempted("m", 5, "its worker pool's multiprocessing manager (pid 9) exited")
    assert handler(stopped, {**record_of(nodes_member(), tmp_path), "executor": "local"}) == 0.0
    assert failures(tmp_path) == [
        ("infrastructure: its worker pool was lost (its worker pool's multiprocessing manager (pid 9) exited)", 0.0)
    ]
    assert [(label, block) for label, block, _ in retired] == [("local", "2")]


@pytest.mark.parametrize(("recorded", "cost"), [(None, 0.0), (ValueError("a bug in the workload"), 1.0)])
def test_the_peer_lost_exit_status_is_the_machines_fault_unless_a_rank_failed_on_its_own(
    tmp_path: Path, recorded: Exception | None, cost: float
) -> None:
    """No rank's record could be read (a lost node's file system): a rank's status 76 says a peer
    was lost; a rank's own error, recorded, wins."""
    from parsl.app.errors import BashExitFailure

    from resilient_flows.training import EXIT_PEER_LOST, record_fault

    handler = ResumingRetryHandler(retries=2)
    directory = started_attempt(tmp_path)
    if recorded is not None:
        record_fault(directory, 1, recorded)
    assert handler(BashExitFailure("mpi_train_app", EXIT_PEER_LOST), mpi_record(nodes_member(), tmp_path)) == cost
    expected = "infrastructure: a peer rank is gone (a rank exited with status 76)" if cost == 0.0 else "error"
    assert failures(tmp_path) == [(expected, cost)]


def test_a_fault_recorded_by_an_earlier_attempt_is_not_this_ones(tmp_path: Path) -> None:
    from resilient_flows.training import attempt_fault, record_fault

    directory = started_attempt(tmp_path)
    record_fault(directory, 0, RuntimeError("Connection closed by peer"))
    started_attempt(tmp_path)
    assert attempt_fault(directory) is None


@pytest.mark.slow
def test_a_retry_waiting_out_its_backoff_beats_and_its_block_is_not_declared_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command that exits 75 at once is retried after a 30 s backoff, on a site whose stall
    timeout is 8 s (a block that just took a task may stay silent three times that, 24 s): a
    worker that held the retry silently for its backoff had its block declared lost and cancelled,
    and ``status`` showed ``ManagerLost`` as the last error. The waiting retry beats: no ``lost``
    event, the costly stop is the only failure, and the last error is the real one."""
    from resilient_flows import apps
    from resilient_flows.cli import main
    from resilient_flows.workflow._member_table import last_error
    from resilient_flows.workflow._status import member_statuses

    monkeypatch.setattr(apps, "QUICK_ATTEMPT_S", 600.0)  # every attempt quick, however long it queued
    monkeypatch.setattr(apps, "BACKOFF_S", 30.0)  # the first wait: longer than a start may be silent
    site = tmp_path / "site.yaml"
    text = (Path(__file__).parents[1] / "site-configs" / "local.yaml").read_text()
    site.write_text(text.replace("stall_timeout: 30s", "stall_timeout: 8s"))
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(
        "name: backoff\nretries: 0\nfree_stops: 1\nmembers:\n"
        "  - {name: stuck, steps: 1, command: [sh, -c, 'exit 75']}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["run", str(workflow), "--site", str(site), "--run-dir", str(run_dir)]) == 1
    damage = DamageLog()
    events = list(read_events(run_dir, damage))
    assert not damage and [e for e in events if e["kind"] == "lost"] == []
    assert [e["wait_s"] for e in events if e["kind"] == "retried"] == [30.0]
    failed = [(e["cause"].split(" (")[0], e["cost"], e["error"]) for e in events if e["kind"] == "failed"]
    assert [(cause, cost) for cause, cost, _ in failed] == [("preempted", 0.0), ("preempted without progress", 1.0)]
    (status,) = member_statuses(run_dir, [("stuck", 1)]).values()
    assert (status.state, status.failures, status.attempts) == ("failed", 1, 2)
    assert status.errors == [failed[-1][2]] and last_error(status).startswith("Preempted: member stuck preempted")
