"""A detached runner (``run --detach``, ``resume --detach``) and ``status --follow``: the runner
outlives the terminal it was started from, a runner that cannot start is reported by the command
that started it, and the live table ends with the run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from test_lease import CLI, age, leftovers, quick_site, wait_for
from test_views import append, imported_by, make_run

from resilient_flows.cli import main
from resilient_flows.cli._console import console
from resilient_flows.rundir import (
    RENEW_S,
    end_lease,
    holding_runner,
    process_start_time,
    read_lease,
    run_layout,
    stat_fields,
)
from resilient_flows.workflow import follow_run
from resilient_flows.workflow._blocks import RunnerLock

TINY = (
    "name: tiny\ncheckpoint: {interval: 10}\n"
    "members:\n  - {name: m, workload: mlp-digits, steps: 30, params: {hidden: 16}}\n"
)


# ----------------------------------------------------------------------------- status --follow


def test_follow_redraws_until_the_runner_lets_go_of_the_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=1)
    RunnerLock(run_dir, orphan_timeout_s=60.0).acquire()  # held by this process, as by a runner

    def finish_then_let_go() -> None:
        time.sleep(0.5)
        result = {"member": "m-0", "step": 49, "loss": 0.1, "test_accuracy": 0.9}
        (run_dir / "members" / "m-0" / "result.json").write_text(json.dumps(result))
        append(run_dir, [{"time": 61.0, "kind": "finished", "member": "m-0", "step": 49}])
        time.sleep(0.5)
        end_lease(run_dir)

    ending = threading.Thread(target=finish_then_let_go)
    began = time.monotonic()
    ending.start()
    follow_run(run_dir, console(), refresh_s=0.1)
    took = time.monotonic() - began
    ending.join()
    assert 1.0 <= took < 5.0, took  # it waited for the runner, and noticed it let go
    assert main(["status", str(run_dir), "--follow"]) == 0  # let go of: the final table at once
    out = capsys.readouterr().out
    assert out.count("finished") == 2
    assert "resume" not in capsys.readouterr().err


def test_follow_ends_with_a_runner_that_died_and_says_how_to_continue(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=1)
    dead = subprocess.Popen(["true"])
    dead.wait()
    record = {"pid": dead.pid, "host": socket.gethostname(), "started": 1, "orphan_timeout_s": 60.0}
    run_layout(run_dir).write_lease(record)
    looks: list[object] = []

    def holder(run: Path) -> object:
        looks.append(holding_runner(run))
        return looks[-1]

    monkeypatch.setattr("resilient_flows.workflow._follow.holding_runner", holder)
    assert main(["status", str(run_dir), "--follow"]) == 1  # m-0 still at step 10 of 50
    assert looks == [None]  # one look, no redraw: the dead runner's lease is not waited out
    err = " ".join(capsys.readouterr().err.split())
    assert f"the run's runner (process {dead.pid} on {record['host']}) is gone" in err
    assert f"resilient-flows resume {run_dir} continues it" in err


def test_a_run_is_held_by_a_live_runner_here_or_a_fresh_lease_elsewhere(tmp_path: Path) -> None:
    layout = run_layout(tmp_path)
    RunnerLock(tmp_path).acquire()
    assert holding_runner(tmp_path).pid == os.getpid()  # type: ignore[union-attr]
    end_lease(tmp_path)
    assert holding_runner(tmp_path) is None  # let go of
    exited = subprocess.Popen(["true"])  # not reaped yet: a zombie, as a detached runner may be
    wait_for(lambda: stat_fields(exited.pid)[0] == "Z", 10, "the process to exit")
    layout.write_lease({"pid": exited.pid, "host": socket.gethostname(), "started": process_start_time(exited.pid)})
    assert holding_runner(tmp_path) is None
    exited.wait()
    layout.write_lease({"pid": 4242, "host": "login-2", "started": 1, "orphan_timeout_s": 60.0})
    assert holding_runner(tmp_path) is not None  # another host's runner: its lease is fresh
    age(tmp_path, 2 * RENEW_S + 1)
    assert holding_runner(tmp_path) is None


def test_status_follow_imports_neither_torch_nor_parsl(tmp_path: Path) -> None:
    run_dir, _ = make_run(tmp_path, 3, running=1)
    assert imported_by(["status", str(run_dir), "--follow"]) == []


# ----------------------------------------------------------------------------- start-up failures


def test_run_detach_reports_a_bad_workflow_or_site_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY.replace("mlp-digits", "nope"))
    run_dir = tmp_path / "run"
    assert main(["run", "--detach", str(bad), "--run-dir", str(run_dir)]) == 2
    good = tmp_path / "wf.yaml"
    good.write_text(TINY)
    assert main(["run", "--detach", str(good), "--site", "nosuch", "--run-dir", str(run_dir)]) == 2
    assert main(["resume", "--detach", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err), err
    assert "unknown workload 'nope'" in err[0] and "unknown site 'nosuch'" in err[1] and "no plan.json" in err[2]
    assert not run_dir.exists()


def test_resume_detach_refuses_a_run_that_a_runner_holds(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir, _ = make_run(tmp_path, 1, running=1)
    RunnerLock(run_dir).acquire()
    assert main(["resume", "--detach", str(run_dir)]) == 2
    assert f"is being run by process {os.getpid()}" in capsys.readouterr().err
    assert not run_layout(run_dir).runner_log.exists()


def test_a_runner_that_fails_to_start_is_reported_by_the_command_that_started_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir, _ = make_run(tmp_path, 1, running=1)
    assert main(["resume", "--detach", str(run_dir), "--ranks", "nosuch=2"]) == 2  # the runner's own check
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: the runner did not start: --ranks nosuch=2: 'nosuch' is not a member"), line
    assert line.endswith(f"(its output: {run_layout(run_dir).runner_log})")
    assert read_lease(run_dir) is None


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_a_detached_runner_outlives_its_terminal_and_status_follow_ends_with_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The command runs in a shell on a terminal of its own, which then hangs up (as when an ssh
    session drops) and whose process group is killed; the runner goes on, and ends the run."""
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(TINY)
    run_dir, out, status = tmp_path / "run", tmp_path / "out.txt", tmp_path / "rc"
    script = f"{CLI} run --detach {workflow} --site {quick_site(tmp_path, 'local')} --run-dir {run_dir} >{out} 2>&1"
    master, slave = os.openpty()
    shell = subprocess.Popen(  # a session whose controlling terminal is the pty: closing it hangs up
        ["setsid", "--ctty", "bash", "-c", f"{script}; echo $? >{status}; exec sleep 60"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    runner = None
    try:
        took = wait_for(status.exists, 30, "run --detach to return")
        assert status.read_text().strip() == "0", out.read_text()
        lease = holding_runner(run_dir)
        assert lease is not None, out.read_text()  # it returned while the runner holds the run
        runner = lease.pid
        assert f"pid {runner}" in out.read_text() and str(run_layout(run_dir).runner_log) in out.read_text()
        assert os.getsid(runner) == runner != os.getsid(shell.pid)  # a session of its own
        assert stat_fields(runner)[4] == "0"  # tty_nr: no controlling terminal
        os.close(master)  # the terminal hangs up: SIGHUP to its session
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
        assert process_start_time(runner) == lease.started, "the runner died with its terminal"

        assert main(["status", str(run_dir), "--follow"]) == 0  # returns when the run ends
        lease_now = read_lease(run_dir)
        assert lease_now is not None and lease_now.ended and lease_now.pid == runner
        assert "│ m " in capsys.readouterr().out
        log = run_layout(run_dir).runner_log.read_text()
        assert f"run tiny on site {tmp_path / 'local.yaml'}: {run_dir}" in log and "report:" in log
        wait_for(lambda: not leftovers(run_dir), 30, "the run's processes gone")
        assert took < 20, took  # returned long before the run ended
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
        if runner is not None and holding_runner(run_dir) is not None:
            os.kill(runner, signal.SIGINT)  # stops as a foreground run on Ctrl-C: its blocks cancelled
