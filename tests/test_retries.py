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
