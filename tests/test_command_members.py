"""Command members: the run contract, validation of ``command:``, the launcher's signals and exit
statuses, and runs on a real local Parsl executor with real processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from resilient_flows.apps import ResumingRetryHandler
from resilient_flows.checkpoint import CheckpointConfig, TierSpec
from resilient_flows.cli import main
from resilient_flows.clone import request_clone
from resilient_flows.errors import Preempted, SiteConfigError, WorkflowError
from resilient_flows.training import MemberSpec, RunContract, read_events
from resilient_flows.training._command import CommandFailed, CommandKilled, run_command
from resilient_flows.training._members import read_spec, register_member
from resilient_flows.workflow import load_workflow, plan_workflow
from resilient_flows.workflow._status import loss_curve, member_statuses

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "command_script.py"
PYTHON = sys.executable


def write(directory: Path, text: str, name: str = "wf.yaml") -> Path:
    path = directory / name
    path.write_text(text)
    return path


def sh_member(name: str, script: str, **extra: str) -> str:
    """A workflow member running ``sh -c script`` (one step, for the progress table)."""
    fields = "".join(f", {k}: {v}" for k, v in extra.items())
    return f"  - {{name: {name}, steps: 1, command: [sh, -c, {json.dumps(script)}]{fields}}}\n"


# ---------------------------------------------------------------------------------- the contract


def test_the_contract_round_trips_through_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_SCRATCH", str(tmp_path / "node7"))
    spec = MemberSpec(
        name="m",
        workload="",
        params={"lr": 0.1},
        seed=3,
        steps=50,
        checkpoint=CheckpointConfig(
            tiers=(TierSpec("${NODE_SCRATCH}/m", name="local"), TierSpec("checkpoints", name="shared")),
            interval_steps=25,
        ),
        command=["true"],
    )
    contract = RunContract.for_member(spec, tmp_path / "run", attempt=2)
    env = contract.to_env()
    shared = str((tmp_path / "run/members/m/checkpoints").resolve())
    checkpoint = json.loads(env["RESILIENT_FLOWS_CHECKPOINT"])
    assert [t["path"] for t in checkpoint["tiers"]] == [str(tmp_path / "node7/m"), shared]  # expanded where it runs
    assert env["RESILIENT_FLOWS_CHECKPOINT_DIR"] == shared
    assert json.loads(env["RESILIENT_FLOWS_PARAMS"]) == {"lr": 0.1, "seed": 3, "steps": 50}
    assert (env["RESILIENT_FLOWS_ATTEMPT"], checkpoint["interval_steps"]) == ("2", 25)
    assert RunContract.from_env(env) == contract

    with pytest.raises(WorkflowError, match=r"^RESILIENT_FLOWS_RUN_DIR is not set: this script expects"):
        RunContract.from_env({})
    with pytest.raises(WorkflowError, match=r"RESILIENT_FLOWS_ATTEMPT must be a positive integer, got 'x'"):
        RunContract.from_env({**env, "RESILIENT_FLOWS_ATTEMPT": "x"})


def test_the_command_sees_its_contract(tmp_path: Path) -> None:
    spec = MemberSpec(name="env", workload="", params={"k": "v"}, steps=1, command=[PYTHON, "-c", DUMP_ENV])
    result = run_command(spec.to_dict(), str(tmp_path))
    assert result == {"member": "env", "attempts": 1, "exit_status": 0}
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert RunContract.from_env(seen) == RunContract.for_member(spec, tmp_path, attempt=1)
    checkpoint = CheckpointConfig.from_json(seen["RESILIENT_FLOWS_CHECKPOINT"])
    assert ([t.name for t in checkpoint.tiers], checkpoint.interval_steps) == (["shared"], 10)
    started, finished = read_events(tmp_path)
    assert (started["kind"], finished["kind"], finished["exit_status"]) == ("started", "finished", 0)


DUMP_ENV = (
    "import json, os\n"
    "seen = {k: v for k, v in os.environ.items() if k.startswith('RESILIENT_FLOWS_')}\n"
    "open(os.path.join(seen['RESILIENT_FLOWS_RUN_DIR'], 'seen.json'), 'w').write(json.dumps(seen))\n"
)


# ---------------------------------------------------------------------------------- validation

VALID = """\
name: c
members:
  - name: m
    command: [sh, -c, "echo {lr} {seed}"]
    steps: 5
    params: {lr: 0.1}
"""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('[sh, -c, "echo {lr} {seed}"]', "[]"), r"wf.yaml:4: members\[0\].command: member 'm': command is empty"),
        (('[sh, -c, "echo {lr} {seed}"]', '""'), r"wf.yaml:4: members\[0\].command: member 'm': command is empty"),
        (
            ('[sh, -c, "echo {lr} {seed}"]', "[no-such-program-x, run]"),
            r"wf.yaml:4: members\[0\].command: member 'm': program 'no-such-program-x' not found on PATH nor in /",
        ),
        (
            ("{lr} {seed}", "{foo}"),
            r"wf.yaml:4: members\[0\].command: member 'm': command has placeholder \{foo\}, but no param 'foo' "
            r"\(params: lr; also name, seed, steps\)",
        ),
        (
            ("    params: {lr: 0.1}\n", ""),
            r"wf.yaml:4: members\[0\].command: member 'm': command has placeholder \{lr\}, but no param 'lr'",
        ),
        (("{lr} {seed}", "{lr"), r"wf.yaml:4: members\[0\].command: member 'm': command word 'echo \{lr' has a "),
        (("{lr} {seed}", "{lr.x}"), r"members\[0\].command: .*a placeholder is a param's name in braces"),
        (('[sh, -c, "echo {lr} {seed}"]', "'sh -c \"x'"), r"members\[0\].command: .*cannot be split into words"),
        (
            ("    steps: 5\n", "    steps: 5\n    workload: mlp-digits\n"),
            r"wf.yaml:3: members\[0\]: member 'm': give 'workload' .*not both",
        ),
        (
            ('    command: [sh, -c, "echo {lr} {seed}"]\n', ""),
            r"wf.yaml:3: members\[0\].workload: required key is missing; give 'workload' .* or 'command'",
        ),
        (
            ("    steps: 5\n", "    steps: 5\n    ranks: 2\n"),
            r"member 'm': ranks apply to workloads; a command launches",
        ),
        (("    steps: 5\n", "    steps: 5\n    grace: 0s\n"), r"members\[0\].grace: grace must be positive"),
    ],
)
def test_a_bad_command_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture, change, message) -> None:
    old, new = change
    assert old in VALID
    assert main(["validate", str(write(tmp_path, VALID.replace(old, new)))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert re.search(message, err), err


def test_a_program_beside_the_workflow_must_be_executable(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    path = write(tmp_path, VALID.replace('[sh, -c, "echo {lr} {seed}"]', "[train.sh, '{lr}']"))
    assert main(["validate", str(path)]) == 2
    assert "program 'train.sh' in " in capsys.readouterr().err
    script.chmod(0o755)
    assert main(["validate", str(path)]) == 0
    (member,) = plan_workflow(load_workflow(path), build_site=False).members
    assert member.command == [str(script), "0.1"]  # found beside the workflow: the worker finds it anywhere
    assert member.workdir == str(tmp_path.resolve())


def test_placeholders_are_filled_per_member_of_a_grid_and_a_campaign(tmp_path: Path) -> None:
    text = (
        "name: g\nmembers:\n"
        "  - {name: m, steps: 7, command: 'sh -c \"echo {lr} {name} {seed} {steps}\"', grid: {lr: [0.1, 1]}, "
        "seeds: [4, 5], grace: 2m}\n"
        "explore:\n  - {name: e, strategy: grid, steps: 3, command: [sh, -c, 'echo {width}'], "
        "hyperparameters: {width: {values: [8, 16]}}}\n"
    )
    specs = plan_workflow(load_workflow(write(tmp_path, text)), build_site=False).members
    assert [s.command[-1] for s in specs] == [
        "echo 0.1 m-0 4 7",
        "echo 0.1 m-1 5 7",
        "echo 1 m-2 4 7",
        "echo 1 m-3 5 7",
        "echo 8",
        "echo 16",
    ]
    assert {s.grace_s for s in specs} == {120.0, None} and {s.workload for s in specs} == {""}


def test_the_site_grace_applies_to_command_members_that_name_none(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text((HERE.parent / "site-configs" / "local.yaml").read_text() + "  stop_grace: 25s\n")
    text = (
        "name: g\nmembers:\n"
        + sh_member("own", "exit 0", grace="2m")
        + sh_member("site", "exit 0")
        + "  - {name: builtin, workload: mlp-digits, steps: 3}\n"
    )
    specs = plan_workflow(load_workflow(write(tmp_path, text)), site=str(site), build_site=False).members
    assert {s.name: s.grace_s for s in specs} == {"own": 120.0, "site": 25.0, "builtin": None}
    site.write_text(site.read_text().replace("stop_grace: 25s", "stop_grace: -5s"))
    with pytest.raises(SiteConfigError, match=r"facts\.stop_grace must be"):
        plan_workflow(load_workflow(write(tmp_path, text)), site=str(site), build_site=False)


def test_a_clone_of_a_command_member_gets_its_own_command_line(tmp_path: Path) -> None:
    text = VALID.replace('"echo {lr} {seed}"', '"echo {lr} {seed} {name}"') + "clones:\n  - {member: m, at_step: 2}\n"
    assert main(["validate", str(write(tmp_path, text))]) == 0
    (spec,) = plan_workflow(load_workflow(write(tmp_path, text)), build_site=False).members
    run_dir = tmp_path / "run"
    register_member(run_dir, spec)
    names = request_clone(run_dir, "m", 2, [{}, {"lr": 0.5, "seed": 7}])
    clones = [read_spec(run_dir, name) for name in names]
    assert [c.command for c in clones] == [
        ["sh", "-c", "echo 0.1 0 m.c1"],
        ["sh", "-c", "echo 0.5 7 m.c2"],
    ]
    assert clones[1].params == {"lr": 0.5} and clones[1].command_template == spec.command_template


def test_command_members_cannot_be_evaluated(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    analytics = VALID + "analytics:\n  - {after: 5s}\n"
    assert main(["validate", str(write(tmp_path, analytics))]) == 2
    assert "would evaluate command members (m)" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- the launcher

GROUP_STOPS = """\
( trap 'echo grandchild stopped; exit 0' TERM; while :; do sleep 0.05; done ) &
trap 'wait; echo parent stopped; exit 75' TERM
echo ready
while :; do sleep 0.05; done
"""


def signal_when_ready(log: Path, signum: int) -> threading.Thread:
    """Send ``signum`` to this process (the launcher) once the command printed ``ready``."""

    def wait_and_signal() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (log.exists() and "ready" in log.read_text().splitlines()):
            time.sleep(0.02)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=wait_and_signal, daemon=True)
    thread.start()
    return thread


def test_a_stop_signal_reaches_the_whole_group_and_75_is_a_preemption(tmp_path: Path) -> None:
    spec = MemberSpec(name="g", workload="", params={}, steps=1, command=["sh", "-c", GROUP_STOPS])
    signal_when_ready(tmp_path / "members/g/logs/attempt-1.log", signal.SIGTERM)
    with pytest.raises(Preempted, match=r"member g preempted \(signal SIGTERM\) after committing step -1"):
        run_command(spec.to_dict(), str(tmp_path))
    output = (tmp_path / "members/g/logs/attempt-1.log").read_text()
    assert "grandchild stopped" in output and "parent stopped" in output
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the launcher's handler is gone
    assert not (tmp_path / "heartbeats/g").exists()


def test_a_command_that_ignores_the_stop_is_killed_after_its_grace(tmp_path: Path) -> None:
    stubborn = "trap '' TERM USR1; echo ready; sleep 30"
    spec = MemberSpec(name="s", workload="", params={}, steps=1, command=["sh", "-c", stubborn], grace_s=0.5)
    signal_when_ready(tmp_path / "members/s/logs/attempt-1.log", signal.SIGUSR1)
    began = time.monotonic()
    with pytest.raises(CommandKilled, match=r"killed by SIGKILL \(still running 0.5 s after signal SIGUSR1\)"):
        run_command(spec.to_dict(), str(tmp_path))
    assert time.monotonic() - began < 10


def test_a_failing_command_names_its_status_and_last_line(tmp_path: Path) -> None:
    spec = MemberSpec(
        name="f", workload="", params={}, steps=1, command=["sh", "-c", "echo; echo 'bad input' >&2; exit 3"]
    )
    with pytest.raises(CommandFailed, match=r"^command of member f exited with status 3: bad input$"):
        run_command(spec.to_dict(), str(tmp_path))
    assert (tmp_path / "members/f/attempts").read_text() == "1"
    assert not (tmp_path / "members/f/result.json").exists()


@pytest.mark.parametrize(
    ("exception", "progress", "cost", "cause"),
    [
        (Preempted("m", 9, "signal SIGTERM"), False, 0.0, "preempted"),
        (CommandKilled("m", "SIGKILL"), True, 0.0, "lost after progress"),
        (CommandKilled("m", "SIGKILL"), False, 1.0, "lost without progress"),
        (CommandFailed("m", 1), True, 1.0, "error"),
    ],
)
def test_exit_statuses_cost_what_they_mean(tmp_path: Path, exception, progress: bool, cost: float, cause: str) -> None:
    spec = MemberSpec(name="m", workload="", params={}, steps=20, command=["true"])
    if progress:
        (tmp_path / "members/m/checkpoints/step-00000009").mkdir(parents=True)
        (tmp_path / "members/m/checkpoints/step-00000009/manifest.json").write_text("{}")
    record = {"id": 0, "func_name": "command_app", "args": (spec.to_dict(), str(tmp_path)), "fail_cost": 0, "try_id": 0}
    assert ResumingRetryHandler(retries=2)(exception, record) == cost
    (failed,) = [e for e in read_events(tmp_path) if e["kind"] == "failed"]
    assert (failed["cause"], failed["cost"]) == (cause, cost)


def test_a_preemption_request_reaches_a_script_through_from_env(tmp_path: Path) -> None:
    """The runner's control file, not a signal: the script commits the step, exits 75, is requeued."""
    from resilient_flows.rundir import request_preemption

    spec = MemberSpec(name="p", workload="", params={"lr": 0.05}, steps=40, command=[PYTHON, str(SCRIPT)])
    request_preemption(tmp_path, "p", reason="analytics a1")
    with pytest.raises(Preempted, match=r"member p preempted \(the command exited with status 75\) after .* step 0"):
        run_command(spec.to_dict(), str(tmp_path))
    (preempted,) = [e for e in read_events(tmp_path) if e["kind"] == "preempted"]
    assert (preempted["step"], preempted["reason"], preempted["attempt"]) == (0, "analytics a1", 1)
    assert not (tmp_path / "members/p/control.json").exists()  # consumed


# ---------------------------------------------------------------------------------- workflows


def digest_of(run_dir: Path, name: str) -> str:
    return json.loads((run_dir / "members" / name / "result.json").read_text())["digest"]


@pytest.mark.slow
def test_command_members_finish_resume_bitwise_and_cost_what_their_exit_says(tmp_path: Path, capsys) -> None:
    """Real processes on the local site: the plain PyTorch script finishes; SIGKILLed mid-run or
    preempted, it resumes to the same weights bit for bit; each exit status costs what it means."""
    torch_member = f"[{PYTHON}, {SCRIPT}, --lr, '{{lr}}']"
    text = (
        "name: cmd\nretries: 1\ncheckpoint: {interval: 10}\nmembers:\n"
        f"  - {{name: ok, steps: 40, params: {{lr: 0.05}}, command: {torch_member}}}\n"
        f"  - {{name: killed, steps: 40, params: {{lr: 0.05}}, command: {torch_member}}}\n"
        f"  - {{name: stopped, steps: 40, params: {{lr: 0.05}}, command: {torch_member}}}\n"
        + sh_member("exit1", 'test "$RESILIENT_FLOWS_ATTEMPT" -ge 2 || exit 1')
        + sh_member("exit75", 'test "$RESILIENT_FLOWS_ATTEMPT" -ge 2 || exit 75')
        + sh_member("lost", 'test "$RESILIENT_FLOWS_ATTEMPT" -ge 2 || kill -9 $$')
        + sh_member("broken", "echo broken for good >&2; exit 3")
        + "faults:\n  - {kill: killed, at_step: 25}\n  - {preempt: stopped, at_step: 15}\n"
        + "clones:\n  - {member: ok, at_step: 10, n: 2, overrides: [{}, {lr: 0.2}]}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["run", str(write(tmp_path, text)), "--run-dir", str(run_dir)]) == 1  # broken failed
    out = capsys.readouterr().out
    assert "member broken failed: CommandFailed: command of member broken exited with status 3: broken for good" in out

    events = list(read_events(run_dir))

    def failures(name: str) -> list[tuple[str, float]]:
        return [(e["cause"], e["cost"]) for e in events if e["member"] == name and e["kind"] == "failed"]

    def attempts(name: str) -> int:
        return sum(1 for e in events if e["member"] == name and e["kind"] == "started")

    assert (failures("ok"), attempts("ok")) == ([], 1)
    # the script killed after step 25 lost nothing if a checkpoint of its had committed by then
    # (19, or 9 if 19 was still being written; on a loaded machine even 9 may still be in flight)
    (killed,) = [e for e in events if e["member"] == "killed" and e["kind"] == "failed"]
    progress = killed["checkpoint"] is not None
    expected = ("lost after progress", 0.0) if progress else ("lost without progress", 1.0)
    assert (failures("killed"), attempts("killed")) == ([expected], 2)
    assert (failures("stopped"), attempts("stopped")) == ([("preempted", 0.0)], 2)
    assert (failures("exit1"), attempts("exit1")) == ([("error", 1.0)], 2)
    assert (failures("exit75"), attempts("exit75")) == ([("preempted", 0.0)], 2)
    assert (failures("lost"), attempts("lost")) == ([("lost without progress", 1.0)], 2)
    assert (failures("broken"), attempts("broken")) == ([("error", 1.0), ("error", 1.0)], 2)

    # the killed script resumed from its newest committed checkpoint, the preempted one from the
    # step it stopped at
    assert killed["error"].startswith("CommandKilled: command of member killed was killed by SIGKILL")
    resumed = [e["step"] for e in events if e["member"] == "killed" and e["kind"] == "resumed"]
    assert resumed == ([killed["checkpoint"]] if progress else [])
    assert [e["step"] for e in events if e["member"] == "stopped" and e["kind"] == "preempted"] == [15]
    assert [e["step"] for e in events if e["member"] == "stopped" and e["kind"] == "resumed"] == [15]

    # bit for bit the uninterrupted run's weights and losses
    assert digest_of(run_dir, "killed") == digest_of(run_dir, "ok") == digest_of(run_dir, "stopped")
    assert loss_curve(run_dir, "killed") == loss_curve(run_dir, "ok") == loss_curve(run_dir, "stopped")
    assert sorted(loss_curve(run_dir, "ok")) == list(range(40))

    # clones of the script, forked after step 10 without stopping it: the unchanged one ends bit for
    # bit like its source, the other runs its own command line (--lr 0.2) from the same state
    assert [(e["step"], e["clones"]) for e in events if e["kind"] == "forked"] == [(10, ["ok.c1", "ok.c2"])]
    assert digest_of(run_dir, "ok.c1") == digest_of(run_dir, "ok")
    assert loss_curve(run_dir, "ok.c1") == {s: v for s, v in loss_curve(run_dir, "ok").items() if s > 10}
    assert digest_of(run_dir, "ok.c2") != digest_of(run_dir, "ok")
    assert read_spec(run_dir, "ok.c2").command[-2:] == ["--lr", "0.2"]

    # the table: progress for the script that logs through from_env, state alone for the others
    statuses = member_statuses(run_dir, [(n, s) for n, s in (("ok", 40), ("exit1", 1), ("broken", 1))])
    assert (statuses["ok"].state, statuses["ok"].step, statuses["ok"].attempts) == ("finished", 39, 1)
    assert (statuses["exit1"].state, statuses["exit1"].step, statuses["exit1"].failures) == ("finished", None, 1)
    assert (statuses["broken"].state, statuses["broken"].attempts, statuses["broken"].failures) == ("failed", 2, 2)


@pytest.mark.slow
def test_pbt_replaces_a_command_member_by_a_clone_running_its_own_command_line(tmp_path: Path) -> None:
    """PBT over the plain script: seed 4 draws lr 1e-5 (hopeless) and 0.05; the first is retired at
    the boundary after step 20 (the only one), replaced by a clone of the second with a perturbed lr.
    Steps of 0.3 s leave the runner 6 s to see the boundary and retire the first before it ends,
    also on a loaded machine (2 s were once too few)."""
    text = (
        "name: e\ncheckpoint: {interval: 10}\nexplore:\n"
        f"  - {{name: p, strategy: pbt, command: [{PYTHON}, {SCRIPT}, --lr, '{{lr}}', --step-s, '0.3'], steps: 40,"
        " population: 2, interval: 20, resample_probability: 0, seed: 4,"
        " hyperparameters: {lr: {values: [0.00001, 0.05]}}}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["run", str(write(tmp_path, text)), "--run-dir", str(run_dir)]) == 0
    events = list(read_events(run_dir))
    (exploited,) = [e for e in events if e["kind"] == "exploited"]
    assert (exploited["member"], exploited["donor"], exploited["step"]) == ("p-0", "p-1", 20)
    clone = exploited["clone"]
    assert read_spec(run_dir, clone).command[-4:] == ["--lr", str(exploited["overrides"]["lr"]), "--step-s", "0.3"]
    (cloned,) = [e for e in events if e["kind"] == "cloned" and e["member"] == clone]
    assert cloned["parent"] == "p-1" and cloned["overrides"] == exploited["overrides"]
    retired = json.loads((run_dir / "members" / "p-0" / "result.json").read_text())
    assert retired["retired"].startswith(f"pbt: replaced by {clone}")
    assert json.loads((run_dir / "members" / clone / "result.json").read_text())["step"] == 39


def test_a_killed_launcher_takes_its_command_along(tmp_path: Path) -> None:
    """A SIGKILLed worker cannot forward anything: its command must not train on beside the retry."""
    spec = MemberSpec(name="o", workload="", params={}, steps=1, command=["sh", "-c", "echo ready; exec sleep 30"])
    launcher = subprocess.Popen(
        [
            PYTHON,
            "-c",
            "import json, sys\nfrom resilient_flows.training._command import run_command\n"
            "run_command(json.loads(sys.argv[1]), sys.argv[2])",
            json.dumps(spec.to_dict()),
            str(tmp_path),
        ]
    )
    log = tmp_path / "members/o/logs/attempt-1.log"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (log.exists() and "ready" in log.read_text().splitlines()):
        time.sleep(0.02)
    (started,) = [e for e in read_events(tmp_path) if e["kind"] == "started"]
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{started['command_pid']}").exists():
        time.sleep(0.02)
    assert not Path(f"/proc/{started['command_pid']}").exists()


@pytest.mark.slow
def test_under_torchrun_the_ranks_write_one_sharded_checkpoint(tmp_path: Path) -> None:
    """Two torchrun ranks of the same script form one group: one metrics line per step, a
    checkpoint in two shards, and (training the same replica) the one-process run's weights."""
    torchrun = str(Path(PYTHON).with_name("torchrun"))
    two = [torchrun, "--standalone", "--nproc-per-node", "2", str(SCRIPT)]
    results = {
        name: run_command(
            MemberSpec(name=name, workload="", params={"lr": 0.05}, steps=20, command=command).to_dict(), str(tmp_path)
        )
        for name, command in (("one", [PYTHON, str(SCRIPT)]), ("two", two))
    }
    assert results["two"]["digest"] == results["one"]["digest"]
    shards = sorted(p.name for p in (tmp_path / "members/two/checkpoints/step-00000019").glob("shard-*"))
    assert shards == ["shard-00000-of-00002.safetensors", "shard-00001-of-00002.safetensors"]
    assert sorted(loss_curve(tmp_path, "two")) == list(range(20))
    assert len((tmp_path / "members/two/metrics.jsonl").read_text().splitlines()) == 20
