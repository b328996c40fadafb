"""Standby blocks: a site that asks for one, the runner's bookkeeping of which blocks run and which
wait (a real HighThroughputExecutor whose blocks are recorded but not launched), and a standby
pool that waits for its go file."""

from __future__ import annotations

import json
import os
import signal
import string
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from parsl.jobs.states import JobState, JobStatus

from resilient_flows.errors import SiteConfigError
from resilient_flows.sites import SiteFile, load_site
from resilient_flows.sites._parsl import go_file, is_standby, is_warm, split_argv
from resilient_flows.sites._warmpool import wait_for_go
from resilient_flows.workflow._standby import Kept, Standby, cancel_kept, lower_init_blocks

LOCAL = {"type": "LocalProvider", "init_blocks": 1, "min_blocks": 0, "max_blocks": 1}


def site(tmp_path: Path, executor: dict[str, Any]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"executors": [executor]}))
    return path


STANDBY = {"type": "HighThroughputExecutor", "label": "w", "warm_workers": True, "standby_pool": True}


def standby_executor(tmp_path: Path) -> Any:
    """The executor of a standby site as a runner configures it, whose blocks are recorded as Parsl
    records them but never launched; its run directory is ``tmp_path``."""
    path = site(tmp_path, {**STANDBY, "provider": LOCAL})
    (executor,) = SiteFile.open(path).config(standby_blocks=True).executors
    executor.run_dir = str(tmp_path)
    launched = iter(range(100, 200))
    executor._launch_block = lambda block: str(next(launched))
    return executor


def test_a_standby_pool_is_a_warm_pool_that_waits_for_its_go_file(tmp_path: Path) -> None:
    executor = standby_executor(tmp_path)
    assert is_warm(executor) and is_standby(executor)
    modules, standby, pool_argv = split_argv(executor.launch_cmd.split()[3:])
    assert standby is True and "torch" in modules and pool_argv[:2] == ["{debug}", "{max_workers_per_node}"]
    (plain,) = load_site(
        site(tmp_path, {"type": "HighThroughputExecutor", "label": "p", "warm_workers": True, "provider": LOCAL})
    ).executors
    assert is_warm(plain) and not is_standby(plain)


def test_a_plain_parsl_script_gets_the_standby_site_s_pools_warm_and_starting_at_once(tmp_path: Path) -> None:
    """Only a runner tells a waiting pool to go: in a script of the user's own, one would wait forever."""
    (executor,) = load_site(site(tmp_path, {**STANDBY, "provider": LOCAL})).executors
    assert is_warm(executor) and not is_standby(executor)


@pytest.mark.parametrize(
    ("executor", "message"),
    [
        (
            {"type": "HighThroughputExecutor", "label": "w", "standby_pool": True, "provider": LOCAL},
            "standby_pool needs warm_workers: true (a standby waits preloaded)",
        ),
        (
            {"type": "HighThroughputExecutor", "label": "w", "warm_workers": True, "standby_pool": 1},
            "standby_pool must be true or false, got 1",
        ),
        (
            {
                "type": "HighThroughputExecutor",
                "label": "w",
                "warm_workers": True,
                "standby_pool": True,
                "provider": {"type": "SlurmProvider"},
            },
            "standby_pool applies to a LocalProvider's blocks only (elsewhere a standby is a batch job)",
        ),
    ],
)
def test_a_misplaced_standby_pool_key_is_one_clear_line(tmp_path: Path, executor: dict[str, Any], message: str) -> None:
    path = site(tmp_path, executor)
    with pytest.raises(SiteConfigError) as caught:
        load_site(path)
    assert str(caught.value) == f"{path}: executors[0] (HighThroughputExecutor): {message}"


def go_files(tmp_path: Path) -> list[str]:
    directory = tmp_path / "w" / "standby"
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def test_the_runner_runs_one_block_keeps_one_waiting_and_runs_it_once_the_first_is_lost(tmp_path: Path) -> None:
    executor = standby_executor(tmp_path)
    standby = Standby()
    assert standby.update([executor]) == []  # no block yet: nothing to run, no standby beside nothing
    assert sorted(executor.status_facade) == []
    executor.scale_out_facade(1)  # the strategy's initial block
    executor._tasks = {0: None, 1: None, 2: None}  # outstanding
    assert standby.update([executor]) == [("w", "0")]
    assert go_files(tmp_path) == ["go-0"] and Path(go_file(executor.worker_logdir, "0")).exists()
    assert sorted(executor.status_facade) == ["0", "1"] and go_files(tmp_path) == ["go-0"]  # 1 waits
    assert executor.provider.max_blocks == 2  # the strategy counts the waiting block: it starts none
    assert standby.update([executor]) == []
    assert sorted(executor.status_facade) == ["0", "1"]
    executor._status["0"] = JobStatus(JobState.SCALED_IN)  # the runner retired the lost block
    assert standby.update([executor]) == [("w", "1")]  # and a new standby beside it
    assert go_files(tmp_path) == ["go-0", "go-1"]
    assert sorted(executor.status_facade) == ["0", "1", "2"] and executor.provider.max_blocks == 2
    executor._status["2"] = JobStatus(JobState.FAILED)  # a standby that could not start is replaced
    assert standby.update([executor]) == []
    assert sorted(executor.status_facade) == ["0", "1", "2", "3"] and go_files(tmp_path) == ["go-0", "go-1"]


def test_a_first_standby_waits_for_the_run_to_be_under_way_and_one_after_a_loss_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that ends within ``standby_after`` never starts a standby; once its first block ran
    that long, or lost a block, one is started."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    executor = standby_executor(tmp_path)
    standby = Standby(after_s=30.0)
    executor.scale_out_facade(1)
    executor._tasks = {0: None}
    assert standby.update([executor]) == [("w", "0")]
    now[0] += 29.9
    assert standby.update([executor]) == [] and sorted(executor.status_facade) == ["0"]  # no standby yet
    now[0] += 0.1
    assert standby.update([executor]) == [] and sorted(executor.status_facade) == ["0", "1"]  # under way

    lost = standby_executor(tmp_path / "lost")
    standby = Standby(after_s=30.0)
    lost.scale_out_facade(1)
    lost._tasks = {0: None}
    assert standby.update([lost]) == [("w", "0")]
    lost._status["0"] = JobStatus(JobState.SCALED_IN)  # lost 5 s in: the strategy starts a block cold
    now[0] += 5.0
    lost.scale_out_facade(1)
    assert standby.update([lost]) == [("w", "1")]
    assert sorted(lost.status_facade) == ["0", "1", "2"]  # and a standby beside it at once: a burst


def test_a_site_says_how_long_a_run_runs_before_its_standby_starts(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[1] / "site-configs" / "local.yaml").read_text()
    path = tmp_path / "site.yaml"
    path.write_text(text)
    assert SiteFile.open(path).facts().standby_after_s == 30.0
    path.write_text(text.replace("\nfacts:\n", "\nfacts:\n  standby_after: 0s\n"))
    assert SiteFile.open(path).facts().standby_after_s == 0.0
    path.write_text(text.replace("\nfacts:\n", "\nfacts:\n  standby_after: soon\n"))
    with pytest.raises(SiteConfigError, match=r"facts\.standby_after must be a duration like 30s or 0s"):
        SiteFile.open(path).facts()


def test_no_standby_is_started_once_no_task_is_outstanding(tmp_path: Path) -> None:
    executor = standby_executor(tmp_path)
    standby = Standby()
    executor.scale_out_facade(1)
    executor._tasks = {}
    assert standby.update([executor]) == [("w", "0")]
    assert sorted(executor.status_facade) == ["0"] and executor.provider.max_blocks == 1


def test_an_executor_without_standby_is_left_alone(tmp_path: Path) -> None:
    (executor,) = load_site(
        site(tmp_path, {"type": "HighThroughputExecutor", "label": "w", "warm_workers": True, "provider": LOCAL})
    ).executors
    executor.run_dir = str(tmp_path)
    executor._launch_block = lambda block: "100"
    executor.scale_out_facade(1)
    executor._tasks = {0: None}
    assert Standby().update([executor]) == []
    assert go_files(tmp_path) == [] and sorted(executor.status_facade) == ["0"]


def test_a_standby_pool_goes_on_only_once_its_go_file_exists(tmp_path: Path) -> None:
    argv = ["-a", "127.0.0.1", f"--logdir={tmp_path}", "--block_id=3", "--port=1"]
    waiting = threading.Thread(target=wait_for_go, args=(argv,), daemon=True)
    waiting.start()
    waiting.join(1.0)
    assert waiting.is_alive()  # no go file: it cannot have gone on
    Path(go_file(tmp_path, "3")).parent.mkdir()
    Path(go_file(tmp_path, "3")).touch()
    waiting.join(60)
    assert not waiting.is_alive()


#: A module whose import takes a while and says at which priority it ran, and a worker's function
#: that says at which priority the worker runs.
NICE_PROBE = """\
import os, threading, time
with open(os.environ["PROBE_OUT"], "a") as out:
    out.write(f"import {os.getpid()} {os.getpriority(os.PRIO_PROCESS, threading.get_native_id())}\\n")
time.sleep(float(os.environ["PROBE_IMPORT_S"]))

def report():
    with open(os.environ["PROBE_OUT"], "a") as out:
        out.write(f"worker {os.getppid()} {os.getpriority(os.PRIO_PROCESS, 0)}\\n")
"""

#: A standby's start as the warm pool makes it: its fork server preloading at the lowest priority,
#: then its go file (at once, or once the fork server said it is ready: argv[1]), then a worker forked.
STANDBY_START = """\
import multiprocessing, os, signal, sys, time
import probe
from resilient_flows.sites import _warmpool

if __name__ == "__main__":
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # as the warm pool does: xdist's worker ignores it
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["resilient_flows.sites._preload"])
    _warmpool.start_fork_server(["probe"], idle=os.environ["PROBE_SAID"])
    while sys.argv[1] == "once-ready" and (_warmpool._read_said(os.environ["PROBE_SAID"]) or [])[1:] != ["ready"]:
        time.sleep(0.05)
    _warmpool._hurry(os.environ["PROBE_SAID"], ["probe"])
    _warmpool.start_fork_server(["probe"])
    worker = context.Process(target=probe.report)
    worker.start()
    worker.join()
"""


@pytest.mark.parametrize("go", ["at-once", "once-ready"])
def test_a_standby_imports_at_the_lowest_priority_and_its_workers_run_at_the_usual_one(tmp_path: Path, go: str) -> None:
    """A standby's fork server imports niced to 19 (on a busy machine it may not have started yet).
    Go while it still imports: it is replaced by one that imports at the usual priority. Go once
    it is done: it serves the workers. Either way each worker runs at the pool's own priority,
    never at the standby's."""
    (tmp_path / "probe.py").write_text(NICE_PROBE)
    (tmp_path / "start.py").write_text(STANDBY_START)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "PROBE_OUT": str(tmp_path / "probe.out"),
        "PROBE_SAID": str(tmp_path / "preload"),
        "PROBE_IMPORT_S": "1.5",
    }
    command = [sys.executable, str(tmp_path / "start.py"), go]
    start = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    _, err = start.communicate(timeout=240)
    assert start.returncode == 0, err
    idle = int((tmp_path / "preload").read_text().split()[0])
    lines = [line.split() for line in (tmp_path / "probe.out").read_text().splitlines()]
    imports = {int(pid): int(nice) for kind, pid, nice in lines if kind == "import" and int(pid) != start.pid}
    ((_, server, nice),) = [line for line in lines if line[0] == "worker"]
    assert imports.get(idle, 19) == 19 and int(nice) == 0, lines  # the standby's imports niced, never a worker
    if go == "at-once":
        assert int(server) != idle and imports[int(server)] == 0, lines  # replaced: imported at the usual priority
    else:
        assert int(server) == idle and list(imports) == [idle], lines


def started(executor: Any) -> Any:
    """``executor`` with its launch command composed as its start composes it (all but the block id)."""
    fields = {name for _, name, _, _ in string.Formatter().parse(executor.launch_cmd) if name}
    values = {name: f"<{name}>" for name in fields}
    executor.launch_cmd = executor.launch_cmd.format(**{**values, "debug": "", "logdir": executor.worker_logdir})
    return executor


def test_a_waiting_pool_of_a_lost_instance_is_the_next_instance_s_first_block(tmp_path: Path) -> None:
    """The lost instance's shutdown no longer knows the waiting block; the new executor takes it as
    its block 0, starts one initial block fewer, and its go file tells the pool the new arguments."""
    old = started(standby_executor(tmp_path / "000"))
    before = Standby()
    old.scale_out_facade(2)
    old._tasks = {0: None}
    old.provider.resources = {job: {"job_id": job, "remote_pid": 4242, "status": None} for job in ("100", "101")}
    assert before.update([old]) == [("w", "0")]
    (kept,) = before.keep([old])
    assert (kept.label, kept.block, kept.job_id) == ("w", "1", "101")
    assert kept.go == go_file(old.worker_logdir, "1")
    assert old.blocks_to_job_id == {"0": "100"} and sorted(old.status_facade) == ["0"]
    assert list(old.provider.resources) == ["100"]  # the shutdown cancels block 0 only

    new = standby_executor(tmp_path / "001")
    assert new.provider.init_blocks == 1
    lower_init_blocks([new], [kept])
    assert new.provider.init_blocks == 0
    new = started(new)
    after = Standby()
    assert after.adopt([new], [kept]) == []
    assert new.blocks_to_job_id == {"0": "101"} and new.status_facade["0"].state == JobState.RUNNING
    assert new.provider.resources["101"]["remote_pid"] == 4242
    assert after.update([new]) == [("w", "0")]
    assert not Path(go_file(new.worker_logdir, "0")).exists()  # the pool waits for its old file
    old_argv = split_argv(old._get_launch_command("1").split()[3:])[2]
    argv, environ = wait_for_go(old_argv)
    assert argv == split_argv(new._get_launch_command("0").split()[3:])[2] and environ == {}
    assert f"--logdir={new.worker_logdir}" in argv and "--block_id=0" in argv
    assert new.scale_out_facade(1) == ["1"]  # the next block is numbered after it


def test_a_kept_block_that_no_instance_adopted_is_cancelled_with_its_group(tmp_path: Path) -> None:
    waiting = subprocess.Popen(["sleep", "300"], start_new_session=True)  # stands in for a waiting pool's group
    try:
        resource = {"job_id": "1", "remote_pid": waiting.pid, "status": None}
        cancel_kept([Kept("w", "1", str(tmp_path / "go-1"), "1", resource)])
        assert waiting.wait(timeout=30) == -15  # SIGTERM, as Parsl cancels a local block
    finally:
        if waiting.poll() is None:
            waiting.kill()


def test_members_with_a_checkpoint_go_first_to_a_new_parsl_instance(tmp_path: Path) -> None:
    """After a lost interchange: the members it stopped keep their place ahead of those never started."""
    from resilient_flows.training import MemberSpec
    from resilient_flows.workflow._runner import resumed_first

    members = [MemberSpec(name=f"m-{i}", workload="mlp-digits", params={}, steps=20) for i in range(4)]
    for name in ("m-1", "m-3"):
        step = tmp_path / "members" / name / "checkpoints" / "step-00000010"
        step.mkdir(parents=True)
        (step / "manifest.json").write_text("{}")
    assert [m.name for m in resumed_first(tmp_path, members)] == ["m-1", "m-3", "m-0", "m-2"]


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("killed", ["every worker", "one worker"])
def test_a_resume_takes_over_the_standby_pool_a_killed_runner_left_waiting(tmp_path: Path, killed: str) -> None:
    """The runner SIGKILLed with its members' workers (nothing left to adopt), or with one of them
    (the other member's attempt is adopted and trains on): the resume runs the members it must
    start on the killed runner's waiting pool, preloaded, instead of a cold block; its workers carry
    the new runner's token (a task with the old one would refuse to start), every member reaches
    the fault-free weights, and nothing of either runner is left."""
    from test_watchdog import (
        CLI,
        TWO_LONGER,
        assert_every_member_matches_a_fault_free_run,
        blocks_of,
        pools_of,
        processes,
        running_pool,
        standby_at_once,
        wait_for_checkpoints,
    )

    from resilient_flows.rundir import read_events, read_records, run_layout
    from resilient_flows.workflow._blocks import process_start_time

    run_dir = tmp_path / "run"
    # the member whose worker survives must still train when the resume starts, to be adopted
    workflow = TWO_LONGER if killed == "every worker" else TWO_LONGER.replace("steps: 1500", "steps: 4000")
    (tmp_path / "wf.yaml").write_text(workflow)
    site = standby_at_once(tmp_path)
    runner = subprocess.Popen(
        [CLI, "run", tmp_path / "wf.yaml", "--site", site, "--run-dir", run_dir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_checkpoints(run_dir, 2, runner)
        deadline = time.monotonic() + 120
        while len(blocks_of(run_dir)) < 2:  # the standby beside the running block
            assert time.monotonic() < deadline, "no standby block"
            time.sleep(0.2)
        time.sleep(1)  # recorded as it starts: its pool may still be importing
        (waiting,) = [r for r in read_records(run_layout(run_dir)) if "go" in r and not Path(r["go"]).exists()]
        pool = running_pool(run_dir)
        runner.kill()
        runner.wait(timeout=10)
        everything = processes()
        servers = {pid for pid, (parent, cmd) in everything.items() if parent == pool and "forkserver" in cmd}
        workers = sorted(pid for pid, (parent, _) in everything.items() if parent in servers)
        for pid in workers if killed == "every worker" else workers[:1]:
            os.kill(pid, signal.SIGKILL)
        resumed = subprocess.run([CLI, "resume", run_dir], capture_output=True, text=True, timeout=300)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"a standby pool an earlier runner left (its block {waiting['block']}) takes over" in resumed.stdout
    assert resumed.stdout.count("of an earlier runner trains on") == (0 if killed == "every worker" else 1)
    mine = [r for r in read_records(run_layout(run_dir)) if "block" in r and r["runner"] != waiting["runner"]]
    assert (mine[0]["pid"], mine[0]["started"]) == (waiting["pid"], waiting["started"])  # no cold first block
    assert mine[0]["token"] == waiting["token"] and Path(waiting["go"]).exists()  # it carries the old one
    gone_by = time.monotonic() + 10  # killed as the resume ended: gone once the kernel and init have reaped it
    while process_start_time(waiting["pid"]) is not None and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert process_start_time(waiting["pid"]) is None and pools_of(run_dir) == []
    events = list(read_events(run_dir))
    assert not [e for e in events if "took the run over" in json.dumps(e)]  # no task refused its token
    assert_every_member_matches_a_fault_free_run(run_dir, tmp_path / "reference")
