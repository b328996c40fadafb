"""``plan.json`` round-trips: every kind of member that ``run`` writes reads back in ``status``,
``lineage``, ``resume`` and ``clone``, also after the runner was SIGKILLed.

The plan stores every field of the workflow, defaults included; a validator that judged whether a
key was written, not its value, once refused every run with a command member when it was read back.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from resilient_flows.cli import main
from resilient_flows.clone import _request as request
from resilient_flows.clone import request_clone
from resilient_flows.errors import WorkflowError
from resilient_flows.rundir import member_dir
from resilient_flows.training import MemberSpec, read_events
from resilient_flows.training._command import run_command
from resilient_flows.training._members import newest_committed, register_member
from resilient_flows.workflow import Plan, load_workflow, plan_workflow, read_plan
from resilient_flows.workflow._recorded_plan import create_run_dir, run_members
from resilient_flows.workflow._status import loss_curve

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "command_script.py"
PYTHON = sys.executable
CLI = Path(PYTHON).with_name("resilient-flows")

#: One workflow body per kind of member; each names its members distinctly, so that a view can be
#: searched for them.
KINDS = {
    "workload": "members:\n  - {name: wl, workload: mlp-digits, steps: 5, params: {hidden: 8}, stall_timeout: 2m}\n",
    "command": (
        "members:\n  - {name: cmd, command: 'sh -c \"echo {lr} {name}\"', steps: 5, params: {lr: 0.1}, grace: 30s}\n"
    ),
    "distributed": "members:\n  - {name: dist, workload: mlp-digits, steps: 5, ranks: 2, parallel: fsdp, threads: 2}\n",
    "expanded": (
        "members:\n  - {name: grid, workload: mlp-digits, steps: 5, grid: {lr: [0.1, 0.2]}, seeds: [1, 2]}\n"
        "  - {name: cnt, command: [sh, -c, 'echo {lr} {seed}'], steps: 5, params: {lr: 0.1}, count: 2}\n"
    ),
    "campaign": (
        "explore:\n"
        "  - {name: pbt, strategy: pbt, workload: mlp-digits, steps: 50, interval: 10, population: 2,\n"
        "     hyperparameters: {lr: {range: [0.01, 0.1], log: true}}}\n"
        "  - {name: rnd, strategy: random, command: [sh, -c, 'echo {lr}'], steps: 5, population: 2,\n"
        "     hyperparameters: {lr: {range: [0.01, 0.1]}}}\n"
        "  - {name: sweep, strategy: grid, workload: mlp-digits, steps: 5,\n"
        "     hyperparameters: {hidden: {values: [8, 16]}}}\n"
    ),
    "cloned": (
        "members:\n  - {name: src, workload: mlp-digits, steps: 5}\n"
        "  - {name: cmd, command: [sh, -c, 'echo {lr}'], steps: 5, params: {lr: 0.1}}\n"
        "clones:\n  - {member: src, at_step: 2, n: 2, overrides: [{}, {lr: 0.5}], ranks: 2}\n"
        "  - {member: cmd, at_step: 1, overrides: {lr: 0.2}}\n"
    ),
    "settings": (
        "checkpoint: {interval: 30s, keep: 2, overlap: true, persist_every: {shared: 2}, node_mtbf: 1d}\n"
        "stages:\n  - {name: sim, loop: 'resilient_flows.examples.heat:simulate', every: 5s, params: {size: 8}}\n"
        "members:\n  - {name: wl, workload: mlp-digits, steps: 5, after: [sim], checkpoint: {interval: auto}}\n"
        "  - {name: cmd, command: [sh, -c, 'exit 0'], steps: 1}\n"
        "faults:\n  - {kill: wl, at_step: 3}\n"
        "analytics:\n  - {when: {member: wl, step: 3}, members: [wl], slots: 1, duration: 2s}\n"
        "cosched: {policy: dp, max_delay: 1m}\n"
    ),
}


@pytest.fixture
def written_clones(monkeypatch: pytest.MonkeyPatch) -> list[MemberSpec]:
    """The specs of the clones, as ``request_clone`` writes them into the run directory."""
    written: list[MemberSpec] = []

    def record(run_dir: Path, spec: MemberSpec) -> Path:
        written.append(spec)
        return register_member(run_dir, spec)

    monkeypatch.setattr(request, "register_member", record)
    return written


def start_like_run(tmp_path: Path, body: str) -> tuple[Path, Plan]:
    """What ``resilient-flows run`` writes before it starts Parsl (see ``runner.start_run``): the
    plan, the run directory, and the clones the workflow asks for."""
    path = tmp_path / "wf.yaml"
    path.write_text(f"name: rt\n{body}")
    workflow = load_workflow(path)
    plan = plan_workflow(workflow, run_name="rt", build_site=False)
    run_dir = create_run_dir(tmp_path / "run", plan, path.read_text())
    for clone in workflow.clones:
        request_clone(run_dir, clone.member, clone.n, clone.overrides, at_step=clone.at_step, ranks=clone.ranks)
    return run_dir, plan


def shows(text: str, name: str) -> bool:
    """Whether ``text`` names member ``name`` as a word of its own (not inside ``name.c1``)."""
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", text) is not None


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_of_member_reads_back_as_run_wrote_it(
    tmp_path: Path, kind: str, written_clones: list[MemberSpec]
) -> None:
    run_dir, plan = start_like_run(tmp_path, KINDS[kind])
    read = read_plan(run_dir)
    assert (read.site, read.members) == (plan.site, plan.members)
    assert read.workflow.model_dump() == plan.workflow.model_dump()
    assert run_members(run_dir, read) == [*plan.members, *written_clones]
    assert bool(written_clones) == (kind == "cloned")


@pytest.mark.parametrize("kind", list(KINDS))
def test_status_lineage_clone_and_resume_read_every_kind(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from resilient_flows.workflow import _runner as runner

    run_dir, plan = start_like_run(tmp_path, KINDS[kind])
    source = plan.members[0].name
    assert main(["clone", str(run_dir), source]) == 0
    members = run_members(run_dir, read_plan(run_dir))
    assert members[-1].parent is not None and members[-1].parent.member == source
    names = [m.name for m in members]

    assert main(["status", str(run_dir), "--all"]) == 1  # nothing finished
    out = capsys.readouterr().out
    assert all(shows(out, name) for name in names), out
    assert main(["lineage", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert all(shows(out, name) for name in names), out

    resumed: list[list[MemberSpec]] = []
    monkeypatch.setattr(runner, "_execute", lambda _dir, _plan, pending, _console: resumed.append(pending) or 0)
    assert main(["resume", str(run_dir)]) == 0  # everything up to starting Parsl
    assert resumed == [members]


@pytest.mark.parametrize(("key", "value"), [("ranks", "2"), ("parallel", "fsdp"), ("evaluate", "m:f")])
def test_a_command_member_refuses_workload_settings_by_their_value(tmp_path: Path, key: str, value: str) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text(f"name: rt\nmembers:\n  - {{name: cmd, command: [sh, -c, 'exit 0'], steps: 1, {key}: {value}}}\n")
    with pytest.raises(WorkflowError, match=rf"member 'cmd': {key} apply to workloads; a command launches"):
        load_workflow(path)


def test_a_command_member_accepts_the_defaults_its_plan_stores(tmp_path: Path) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text(
        "name: rt\nmembers:\n  - {name: cmd, command: [sh, -c, 'exit 0'], steps: 1, ranks: 1, parallel: ddp}\n"
    )
    (member,) = plan_workflow(load_workflow(path), build_site=False).members
    assert (member.ranks, member.parallel, member.command) == (1, "ddp", ["sh", "-c", "exit 0"])


# ---------------------------------------------------------------------------------- end to end

#: Steps of the member; its first attempt sleeps :data:`FIRST_PACE_S` per step, so that it is
#: still training when its runner is killed and when ``resume`` cancels what that runner left;
#: later attempts run at full speed.
STEPS = 80
FIRST_PACE_S = 0.3


def command_workflow() -> str:
    pace = f'test "$RESILIENT_FLOWS_ATTEMPT" = 1 && pace={FIRST_PACE_S} || pace=0'
    script = f'{pace}; exec {shlex.quote(PYTHON)} {shlex.quote(str(SCRIPT))} --lr {{lr}} --step-s "$pace"'
    member = {"name": "trainer", "steps": STEPS, "params": {"lr": 0.05}, "command": ["sh", "-c", script]}
    return f"name: rt\ncheckpoint: {{interval: 10}}\nmembers:\n  - {json.dumps(member)}\n"


def cli(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def wait_for_a_commit(run_dir: Path, runner: subprocess.Popen, timeout: float = 120) -> int:
    """The first step the member committed to the shared tier, once it has."""
    deadline = time.monotonic() + timeout
    tier = member_dir(run_dir, "trainer") / "checkpoints"
    while time.monotonic() < deadline:
        step = newest_committed([tier])
        if step >= 0:
            return step
        assert runner.poll() is None, "the runner ended before the member committed a checkpoint"
        time.sleep(0.2)
    raise AssertionError(f"no committed checkpoint within {timeout} s")


def leave_nothing_behind(run_dir: Path) -> None:
    """Cancel the blocks and interchanges recorded by the killed runner, as ``resume`` would have."""
    from parsl.providers import LocalProvider

    from resilient_flows.workflow._blocks import BlockLedger, cancel_block, process_start_time

    for record in BlockLedger(run_dir, runner=-1).previous():
        if "interchange" not in record:
            cancel_block(LocalProvider(), record)
        elif process_start_time(record["interchange"]) == record.get("started"):
            os.kill(record["interchange"], signal.SIGKILL)


@pytest.mark.slow
def test_a_command_member_run_is_inspected_and_resumed_after_its_runner_was_sigkilled(tmp_path: Path) -> None:
    """The runner alone is SIGKILLed (its interchange and pool live on); the run stays readable,
    and ``resume`` adopts the member's attempt, which trains on to the uninterrupted run's weights
    (see :mod:`resilient_flows.workflow._adopt`), then cancels what the killed runner left."""
    path = tmp_path / "wf.yaml"
    path.write_text(command_workflow())
    run_dir = tmp_path / "run"
    with (tmp_path / "runner.log").open("w") as log:
        runner = subprocess.Popen([CLI, "run", path, "--run-dir", run_dir], stdout=log, stderr=subprocess.STDOUT)
    resumed = None
    try:
        committed = wait_for_a_commit(run_dir, runner)
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=10)

        status = cli("status", run_dir)
        assert status.returncode == 1 and shows(status.stdout, "trainer"), status.stdout + status.stderr
        lineage = cli("lineage", run_dir)
        assert lineage.returncode == 0 and shows(lineage.stdout, "trainer"), lineage.stdout + lineage.stderr
        resumed = cli("resume", run_dir, timeout=180)
    finally:
        if runner.poll() is None:
            runner.kill()
        if resumed is None:
            leave_nothing_behind(run_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "left by an earlier runner" in resumed.stdout
    assert cli("status", run_dir).returncode == 0

    events = [e for e in read_events(run_dir) if e["member"] == "trainer"]
    assert [e["attempt"] for e in events if e["kind"] == "started"] == [1]
    ((attempt, reason),) = [(e["attempt"], e["reason"]) for e in events if e["kind"] == "warning"]
    assert attempt == 1 and reason.startswith("adopted: attempt 1 ")
    assert [e for e in events if e["kind"] in ("resumed", "failed", "lost")] == []
    assert committed < STEPS - 1  # it was killed mid-run, and no step was trained twice:
    steps = [json.loads(line)["step"] for line in (member_dir(run_dir, "trainer") / "metrics.jsonl").open()]
    assert steps == list(range(STEPS))
    result = json.loads((member_dir(run_dir, "trainer") / "result.json").read_text())

    (spec,) = read_plan(run_dir).members
    plain = replace(spec, command=[PYTHON, str(SCRIPT), "--lr", "0.05"])
    reference = tmp_path / "reference"
    expected = run_command(plain.to_dict(), str(reference))
    assert (result["step"], result["digest"]) == (STEPS - 1, expected["digest"])
    assert loss_curve(run_dir, "trainer") == loss_curve(reference, "trainer")
