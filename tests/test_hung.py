"""Hung workers: a warm pool kills a worker it finds stopped and reports its task as ``WorkerHung``;
the member resumes on the worker forked in its place, bit-exact, charged nothing, on the same block
(real Parsl, the local site), instead of waiting for the watchdog's stall timeout and a new block."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import python_env
from slurm import wait_for

from resilient_flows.rundir._heartbeat import attempt_heartbeat_path, read_attempt_heartbeat
from resilient_flows.sites._hung import HUNG_S, LATE_S, HangWatch, WorkerHung
from resilient_flows.training import read_events, run_member
from resilient_flows.workflow import read_plan

CLI = Path(sys.executable).with_name("resilient-flows")


def checkpoints(run_dir: Path) -> int:
    return sum(e["kind"] == "checkpointed" for e in read_events(run_dir))


class Fake:
    """Process states and a clock that the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.states: dict[int, str] = {}

    def state(self, pid: int) -> str | None:
        return self.states.get(pid)

    def clock(self) -> float:
        return self.now


def test_a_worker_stopped_at_every_look_for_the_hung_time_is_reported_until_it_is_gone() -> None:
    fake = Fake()
    watch = HangWatch(fake.state, fake.clock)
    fake.states = {1: "T", 2: "S", 3: "t"}  # stopped, sleeping, traced (a debugger)
    seen = []
    for _ in range(6):
        seen.append(watch.look([1, 2, 3]))
        fake.now += 0.5
    assert seen == [{}, {}, {}, {}, {1: 2.0}, {1: 2.5}]
    assert watch.look([2, 3]) == {}  # killed and replaced: forgotten


def test_a_worker_that_runs_again_or_a_late_look_starts_the_count_again() -> None:
    fake = Fake()
    watch = HangWatch(fake.state, fake.clock)
    fake.states = {1: "T"}
    watch.look([1])
    fake.now = 1.5
    fake.states = {1: "R"}  # continued in between
    watch.look([1])
    fake.states = {1: "T"}
    fake.now = 2.0
    assert watch.look([1]) == {}
    fake.now += LATE_S + 0.5
    assert watch.look([1]) == {}  # late: the pool may have been stopped with it (a suspended job)
    fake.now += HUNG_S / 2
    assert watch.look([1]) == {}
    fake.now += HUNG_S / 2
    assert watch.look([1]) == {1: HUNG_S}


def test_a_hung_worker_survives_the_trip_to_the_runner_as_itself() -> None:
    """The pool pickles it into the task's result; the runner unpickles it by its class."""
    import pickle

    hung = pickle.loads(pickle.dumps(WorkerHung(3, "node7", 2.5)))
    assert (type(hung), hung.worker_id, hung.hostname, hung.stopped_s) == (WorkerHung, 3, "node7", 2.5)
    assert str(hung) == "worker 3 on host node7 was stopped for 2.5 s: its pool killed it and started another"


WORKFLOW = """\
name: hung
checkpoint: {interval: 5}
members:
  - {name: m, workload: 'paced:train', steps: 300, stall_timeout: 120s, params: {steps: 300, step_s: 0.05}}
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stopped_worker_is_replaced_by_its_pool_and_its_member_resumes_on_the_same_block_free(
    tmp_path: Path,
) -> None:
    """The member's stall timeout (120 s) is far longer than the test: only the pool can have
    noticed. No ``lost`` event, no block cancelled, no retry charged, the same digest as without
    the stop."""
    (tmp_path / "wf.yaml").write_text(WORKFLOW)
    run_dir = tmp_path / "run"
    env = python_env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    runner = subprocess.Popen(
        [CLI, "run", tmp_path / "wf.yaml", "--site", "local", "--run-dir", run_dir],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    stopped = None
    try:
        wait_for(lambda: runner.poll() is not None or checkpoints(run_dir) >= 2, 180, "two checkpoints")
        assert runner.poll() is None, runner.communicate()[0]
        beat = read_attempt_heartbeat(attempt_heartbeat_path(run_dir, "m"))
        assert beat is not None
        stopped = int(beat["pid"])
        os.kill(stopped, signal.SIGSTOP)
        out, _ = runner.communicate(timeout=180)
    finally:
        if runner.poll() is None:
            runner.kill()
        if stopped is not None and Path(f"/proc/{stopped}").exists():  # the test failed before the pool acted
            os.kill(stopped, signal.SIGCONT)
    assert runner.returncode == 0, out

    events = list(read_events(run_dir))
    assert not [e for e in events if e["kind"] == "lost"]
    (failed,) = [e for e in events if e["kind"] == "failed"]
    assert (failed["error"].split(":")[0], failed["cost"], failed["failure_kind"]) == (
        "WorkerHung",
        0.0,
        "infrastructure",
    )
    assert failed["cause"].startswith("infrastructure: its worker hung (worker ")
    starts = [(e["attempt"], e["block"], e["pid"] == stopped) for e in events if e["kind"] == "started"]
    assert starts == [(1, "0", True), (2, "0", False)]

    (spec,) = read_plan(run_dir).members
    result = json.loads((run_dir / "members" / "m" / "result.json").read_text())
    assert result["digest"] == run_member(spec.to_dict(), str(tmp_path / "reference"))["digest"]
