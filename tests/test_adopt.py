"""A resumed run adopts the attempts its killed runner left training: which it adopts, how it
follows them to their end, and how a task of the dead runner's queue refuses to start."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from slurm import wait_for

from resilient_flows.apps import _wait
from resilient_flows.errors import Superseded
from resilient_flows.rundir import TOKEN_ENV, append_record, run_layout, superseded
from resilient_flows.rundir._heartbeat import Heartbeat, attempt_heartbeat_path
from resilient_flows.rundir._lease import end_lease, read_lease
from resilient_flows.sites._hung import HUNG_S, process_state
from resilient_flows.training import MemberSpec, read_events
from resilient_flows.training._command import run_command
from resilient_flows.workflow import read_plan
from resilient_flows.workflow._adopt import FRESH_S, RESULT_GRACE_S, Adoption, adoptable, interchanges_alive
from resilient_flows.workflow._blocks import RunnerLock, process_start_time
from resilient_flows.workflow._watchdog import Watchdog, clear_heartbeats


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def beat(run_dir: Path, task: str, age_s: float = 0.0, **fields: object) -> None:
    """A heartbeat record of a live attempt on this host (this process), last written ``age_s`` ago."""
    path = attempt_heartbeat_path(run_dir, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"task": task, "attempt": 1, "pid": os.getpid(), "host": socket.gethostname(), "block": "0"}
    path.write_text(json.dumps({**record, "step": None, "step_s": None, **fields}))
    then = time.time() - age_s
    os.utime(path, (then, then))


@pytest.fixture
def interchange(tmp_path: Path) -> subprocess.Popen:
    """A live process recorded in the block ledger as the interchange of an earlier runner."""
    proc = subprocess.Popen(["sleep", "60"])
    record = {"runner": -1, "executor": "local", "interchange": proc.pid, "started": process_start_time(proc.pid)}
    append_record(run_layout(tmp_path), record)
    yield proc
    proc.kill()
    proc.wait()


def specs(*names: str) -> list[MemberSpec]:
    return [MemberSpec(name=name, workload="mlp-digits", params={}, steps=10) for name in names]


# ----------------------------------------------------------------------------- a superseded runner's tasks


def test_a_task_refuses_to_start_once_another_runner_holds_the_lease(tmp_path: Path) -> None:
    RunnerLock(tmp_path, token="new").acquire()
    assert superseded(tmp_path, token="new") is None
    assert "took the run over" in superseded(tmp_path, token="old")
    assert superseded(tmp_path, token="") is None  # a member run outside a workflow carries none
    end_lease(tmp_path)
    assert read_lease(tmp_path).token == "new"  # kept once the runner let go of the run


def test_a_lease_without_a_token_supersedes_nothing(tmp_path: Path) -> None:
    RunnerLock(tmp_path).acquire()
    assert superseded(tmp_path, token="old") is None


def test_a_superseded_task_leaves_no_heartbeat_and_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    RunnerLock(tmp_path, token="new").acquire()
    monkeypatch.setenv(TOKEN_ENV, "old")
    with pytest.raises(Superseded, match="task m-0: runner"):
        _wait(0.0, str(tmp_path), "m-0")  # before it starts: a task the dead runner's interchange held
    with pytest.raises(Superseded, match="task m-0: runner"):
        Heartbeat(tmp_path, "m-0", attempt=2).start()  # after its file exists: the new runner may not have seen it
    assert not attempt_heartbeat_path(tmp_path, "m-0").exists()
    monkeypatch.setenv(TOKEN_ENV, "new")
    with Heartbeat(tmp_path, "m-0", attempt=2):
        assert attempt_heartbeat_path(tmp_path, "m-0").exists()


# ----------------------------------------------------------------------------- what is adopted


def test_live_attempts_of_pending_members_are_adopted_and_stale_ones_are_not(
    tmp_path: Path, interchange: subprocess.Popen
) -> None:
    beat(tmp_path, "m-0", attempt=3)
    beat(tmp_path, "m-1", age_s=FRESH_S + 5)  # killed a while ago
    found = adoptable(tmp_path, specs("m-0", "m-1", "m-2"))
    assert found is not None and set(found) == {"m-0"} and found["m-0"]["attempt"] == 3


def test_an_attempt_whose_process_is_gone_is_not_adopted(tmp_path: Path, interchange: subprocess.Popen) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    beat(tmp_path, "m-0", pid=dead.pid)
    assert adoptable(tmp_path, specs("m-0")) == {}


@pytest.mark.parametrize(
    ("task", "fields"),
    [
        ("prep", {}),  # a stage
        ("m-0", {"attempt": None, "waiting_s": 5.0}),  # a retry waiting out its backoff
        ("m-0", {"pool_lost": "pool 12 exited"}),
        ("m-9", {}),  # a member that is not pending (finished)
    ],
)
def test_one_live_task_that_cannot_be_adopted_adopts_none(
    tmp_path: Path, interchange: subprocess.Popen, task: str, fields: dict
) -> None:
    beat(tmp_path, "m-1")
    beat(tmp_path, task, **fields)
    assert adoptable(tmp_path, specs("m-0", "m-1")) is None


def test_a_member_resumed_on_another_rank_count_is_not_adopted(tmp_path: Path, interchange: subprocess.Popen) -> None:
    beat(tmp_path, "m-0")
    assert adoptable(tmp_path, specs("m-0"), {"m-0": 1}) == {"m-0": adoptable(tmp_path, specs("m-0"))["m-0"]}
    assert adoptable(tmp_path, specs("m-0"), {"m-0": 2}) is None  # ``resume --ranks m-0=1`` of a 2-rank member


def test_nothing_is_adopted_once_the_earlier_runner_s_interchange_is_gone(
    tmp_path: Path, interchange: subprocess.Popen
) -> None:
    beat(tmp_path, "m-0")
    assert interchanges_alive(tmp_path)
    interchange.kill()
    interchange.wait()
    assert not interchanges_alive(tmp_path)
    assert adoptable(tmp_path, specs("m-0")) is None


# ----------------------------------------------------------------------------- following adopted attempts


def adoption(tmp_path: Path, clock: Clock, *names: str, stall_s: float = 10.0) -> Adoption:
    records = {name: {"attempt": 1} for name in names}
    return Adoption(tmp_path, records, {m.name: m for m in specs(*names)}, lambda m, r: stall_s, clock)


def test_an_adopted_attempt_that_finished_resolves_with_its_result_and_is_not_submitted(tmp_path: Path) -> None:
    clock = Clock()
    beat(tmp_path, "m-0")
    adopted = adoption(tmp_path, clock, "m-0")
    future = adopted.future("m-0")
    assert adopted.update() == ([], None) and adopted.names() == {"m-0"}
    (tmp_path / "members" / "m-0").mkdir(parents=True)
    (tmp_path / "members" / "m-0" / "result.json").write_text(json.dumps({"step": 9}))
    attempt_heartbeat_path(tmp_path, "m-0").unlink()
    assert adopted.update() == ([], None)
    assert adopted.names() == set() and future.result() == {"member": "m-0"}


def test_an_adopted_attempt_that_ended_without_a_result_is_submitted_after_its_grace(tmp_path: Path) -> None:
    clock = Clock()
    beat(tmp_path, "m-0")
    adopted = adoption(tmp_path, clock, "m-0")
    future = adopted.future("m-0")
    attempt_heartbeat_path(tmp_path, "m-0").unlink()
    assert adopted.update() == ([], None)  # it may be writing its result
    clock.now += RESULT_GRACE_S + 1
    resubmit, lost = adopted.update()
    assert [m.name for m in resubmit] == ["m-0"] and lost is None
    assert future.done() and future.result() is None and adopted.names() == set()


def test_an_adopted_attempt_killed_on_this_host_is_submitted_at_once(tmp_path: Path) -> None:
    clock = Clock()
    dead = subprocess.Popen(["true"])
    dead.wait()
    beat(tmp_path, "m-0")
    beat(tmp_path, "m-1")
    adopted = adoption(tmp_path, clock, "m-0", "m-1")
    beat(tmp_path, "m-0", pid=dead.pid)  # its last beat, then SIGKILL: the file stays, fresh for a while
    resubmit, lost = adopted.update()
    assert [m.name for m in resubmit] == ["m-0"] and lost is None and adopted.names() == {"m-1"}
    assert not attempt_heartbeat_path(tmp_path, "m-0").exists()  # this runner's watchdog would take it for its own


def test_a_silent_adopted_attempt_is_given_up_with_every_other(tmp_path: Path) -> None:
    clock = Clock()
    beat(tmp_path, "m-0")
    beat(tmp_path, "m-1")
    adopted = adoption(tmp_path, clock, "m-0", "m-1", stall_s=10.0)
    clock.now += 5
    beat(tmp_path, "m-1")  # m-1 beats on, m-0 falls silent
    assert adopted.update() == ([], None)
    clock.now += 6
    resubmit, lost = adopted.update()
    assert resubmit == [] and lost == "adopted attempt of m-0 has not beaten for 11 s (stall timeout 10 s)"
    assert sorted(m.name for m in adopted.abandon()) == ["m-0", "m-1"]
    assert not attempt_heartbeat_path(tmp_path, "m-0").exists() and not attempt_heartbeat_path(tmp_path, "m-1").exists()


def test_an_adopted_attempt_stopped_on_this_host_is_given_up_once_it_stayed_stopped(tmp_path: Path) -> None:
    """A worker SIGSTOPped as its runner was killed beats no more: the resume gives it up once it
    has seen it stopped for HUNG_S, not after the stall timeout; one continued in time is kept."""
    clock = Clock()
    stopped = subprocess.Popen(["sleep", "60"])
    try:
        beat(tmp_path, "m-0", pid=stopped.pid)
        record = json.loads(attempt_heartbeat_path(tmp_path, "m-0").read_text())  # as adoptable() found it
        adopted = Adoption(tmp_path, {"m-0": record}, {m.name: m for m in specs("m-0")}, lambda m, r: 10.0, clock)
        stopped.send_signal(signal.SIGSTOP)
        wait_for(lambda: process_state(stopped.pid) == "T", 10, "the process stopped")
        assert adopted.update() == ([], None)
        clock.now += HUNG_S / 2
        stopped.send_signal(signal.SIGCONT)
        wait_for(lambda: process_state(stopped.pid) != "T", 10, "the process continued")
        assert adopted.update() == ([], None)  # continued: the count starts again
        stopped.send_signal(signal.SIGSTOP)
        wait_for(lambda: process_state(stopped.pid) == "T", 10, "the process stopped")
        assert adopted.update() == ([], None)
        clock.now += HUNG_S
        assert adopted.update() == ([], f"adopted attempt of m-0 has been stopped for {HUNG_S:.0f} s (hung)")
    finally:
        stopped.kill()
        stopped.wait()


def test_an_adopted_attempt_whose_pool_is_lost_is_given_up(tmp_path: Path) -> None:
    clock = Clock()
    beat(tmp_path, "m-0")
    adopted = adoption(tmp_path, clock, "m-0")
    beat(tmp_path, "m-0", pool_lost="pool 12 exited")
    assert adopted.update() == ([], "adopted attempt of m-0 lost its pool: pool 12 exited")


def test_the_watchdog_and_the_heartbeat_sweep_leave_adopted_attempts_alone(tmp_path: Path) -> None:
    clock = Clock()
    beat(tmp_path, "m-0", block="0")
    beat(tmp_path, "m-1", block="0")
    watchdog = Watchdog(tmp_path, 10.0, {}, clock)
    watchdog.ignored = {"m-0"}
    assert watchdog.check([]) == []
    clock.now += 60
    assert [lost.task for lost in watchdog.check([])] == ["m-1"]  # m-0's block 0 is an earlier runner's
    clear_heartbeats(tmp_path, keep={"m-0"})
    assert [p.name for p in (tmp_path / "heartbeats").iterdir()] == ["m-0"]


# ----------------------------------------------------------------------------- end to end

REPO = Path(__file__).resolve().parents[1]
CLI = Path(sys.executable).with_name("resilient-flows")
STEPS = 100


def paced_workflow() -> str:
    """Three command members of :data:`STEPS` steps of 0.2 s each: on the local site's two workers,
    two train while the third waits in the interchange's queue."""
    script = [sys.executable, str(REPO / "tests" / "command_script.py"), "--lr", "{lr}", "--step-s", "0.2"]
    member = {"name": "c", "steps": STEPS, "params": {"lr": 0.05}, "command": script, "count": 3}
    return f"name: adopt\ncheckpoint: {{interval: 10}}\nmembers:\n  - {json.dumps(member)}\n"


def pools_of(run_dir: Path) -> list[str]:
    """The processes whose command line names ``run_dir``, each as its pid and command line."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
            if str(run_dir) in command:
                found.append(f"{entry}: {command}")
    return found


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_resume_adopts_the_attempts_of_a_sigkilled_runner_and_no_member_trains_twice(tmp_path: Path) -> None:
    """The runner alone is SIGKILLed while two members train and a third waits in its queue: the
    resume adopts the two (they train on, started once, no step redone), the third starts once
    (in the old pool before the resume took the lease, or refused there and run by the resume),
    every member reaches the uninterrupted run's weights, and nothing of the killed runner is left."""
    (tmp_path / "wf.yaml").write_text(paced_workflow())
    run_dir = tmp_path / "run"
    with (tmp_path / "runner.log").open("w") as log:
        runner = subprocess.Popen([CLI, "run", tmp_path / "wf.yaml", "--run-dir", run_dir], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 180
        while {e["member"] for e in read_events(run_dir) if e["kind"] == "checkpointed"} < {"c-0", "c-1"}:
            assert runner.poll() is None and time.monotonic() < deadline, "no checkpoint of c-0 and c-1"
            time.sleep(0.2)
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=10)
        resumed = subprocess.run([CLI, "resume", run_dir], capture_output=True, text=True, timeout=300)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    events = list(read_events(run_dir))
    adopted = {e["member"] for e in events if e["kind"] == "warning" and e["reason"].startswith("adopted: ")}
    assert {"c-0", "c-1"} <= adopted, resumed.stdout
    assert "left by an earlier runner" in resumed.stdout
    assert [e for e in events if e["kind"] in ("resumed", "failed", "lost")] == []
    for spec in read_plan(run_dir).members:
        assert [e["attempt"] for e in events if e["kind"] == "started" and e["member"] == spec.name] == [1]
        steps = [json.loads(line)["step"] for line in (run_dir / "members" / spec.name / "metrics.jsonl").open()]
        assert steps == list(range(STEPS))
        result = json.loads((run_dir / "members" / spec.name / "result.json").read_text())
        plain = replace(spec, command=[*spec.command[:-2], "--step-s", "0"])
        assert result["digest"] == run_command(plain.to_dict(), str(tmp_path / "reference"))["digest"]
    assert pools_of(run_dir) == []


def test_a_resume_whose_every_member_was_adopted_starts_no_block_until_one_is_submitted() -> None:
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    from resilient_flows.workflow._runner import _no_initial_blocks

    def config(strategy: str | None) -> Config:
        executor = HighThroughputExecutor(label="local", provider=LocalProvider(init_blocks=1, min_blocks=0))
        return Config(executors=[executor], strategy=strategy)

    scaled = config("simple")
    _no_initial_blocks(scaled)
    assert scaled.executors[0].provider.init_blocks == 0  # the strategy starts one once a task waits
    for strategy in (None, "none", "init_only"):  # nothing would ever start one
        fixed = config(strategy)
        _no_initial_blocks(fixed)
        assert fixed.executors[0].provider.init_blocks == 1
