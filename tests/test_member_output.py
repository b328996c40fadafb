"""A member's own output: each attempt's stdout, stderr and traceback in its member's directory,
for Python, command and MPI members; ``resilient-flows logs``; the end of a failed member's
output under ``status``'s table."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, python_env
from rich.console import Console
from test_views import append, make_run

from resilient_flows.cli import main
from resilient_flows.rundir import follow_log, member_layout, tail_lines
from resilient_flows.training._output import attempt_output
from resilient_flows.workflow._output_tails import OutputTails, failed_tails

HERE = Path(__file__).resolve().parent


def body(path: Path) -> list[str]:
    """The lines of an attempt's log after its header line."""
    lines = path.read_text().splitlines()
    assert lines[0].startswith("--- attempt "), lines[0]
    return lines[1:]


# ------------------------------------------------------------------------ capture in a worker

WORKER = """
import os, subprocess, sys
from resilient_flows.errors import Preempted
from resilient_flows.rundir import member_layout
from resilient_flows.training._output import attempt_output

layout = member_layout(sys.argv[1], "a")
print("the worker before")
try:
    with attempt_output(layout, 1):
        print("printed by attempt 1")
        print("to stderr", file=sys.stderr)
        subprocess.run(["echo", "from a child process"], check=True)
        os.write(1, b"written to descriptor 1\\n")
        raise ValueError("boom")
except ValueError:
    pass
print("the worker between")
try:
    with attempt_output(layout, 2):
        print("printed by attempt 2")
        raise Preempted("a", 4, "signal SIGTERM")
except Preempted:
    pass
print("the worker after")
"""


def test_an_attempts_output_goes_to_its_file_and_the_worker_gets_its_own_back(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(tmp_path)], env=python_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["the worker before", "the worker between", "the worker after"]
    assert done.stderr == ""
    logs = tmp_path / "members/a/logs"
    first = body(logs / "attempt-1.log")
    assert first[:5] == [
        "printed by attempt 1",
        "to stderr",
        "from a child process",
        "written to descriptor 1",
        "Traceback (most recent call last):",
    ]
    assert first[-2:] == ['  File "<string>", line 15, in <module>', "ValueError: boom"]  # from where it was raised
    assert body(logs / "attempt-2.log") == [
        "printed by attempt 2",
        "member a preempted (signal SIGTERM) after committing step 4",
    ]


def test_in_a_thread_of_the_runner_only_the_traceback_is_written(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """A ``ThreadPoolExecutor`` runs tasks in the runner's threads: its descriptors are not the task's."""
    layout = member_layout(tmp_path, "t")

    def attempt() -> None:
        with contextlib.suppress(ValueError), attempt_output(layout, 1):
            print("on the runner's stdout")
            raise ValueError("in a thread")

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join()
    assert capfd.readouterr().out == "on the runner's stdout\n"
    lines = body(layout.attempt_log(1))
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "ValueError: in a thread"


def test_a_link_in_the_logs_place_is_not_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    layout = member_layout(tmp_path, "a")
    layout.logs.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("")
    layout.attempt_log(1).symlink_to(elsewhere)
    with attempt_output(layout, 1):
        ran = True
    assert ran and elsewhere.read_text() == ""
    assert "member output of attempt 1 not captured" in caplog.text


# ------------------------------------------------------------------------ reading the logs


def test_tail_lines_reads_the_end_only_and_skips_column_marks(tmp_path: Path) -> None:
    log = tmp_path / "attempt-1.log"
    text = "x" * 100_000 + "\n" + '  File "t.py", line 1, in f\n    g()\n    ^^^\nValueError: v\n\n'
    log.write_text(text)
    assert tail_lines(log, 3) == ['  File "t.py", line 1, in f', "    g()", "ValueError: v"]
    assert tail_lines(log, 10, cap=40) == ["    g()", "ValueError: v"]  # from the last 40 bytes only


def test_follow_copies_what_is_written_until_the_attempt_ends(tmp_path: Path) -> None:
    log = tmp_path / "attempt-1.log"
    log.write_text("one\n")
    writes = iter(["two\n", "three\n", ""])

    def ended() -> bool:  # the attempt writes a line between two looks, the last one just before it ends
        line = next(writes)
        with log.open("a") as f:
            f.write(line or "last words\n")
        return not line

    out = io.BytesIO()
    follow_log(log, out, ended, sleep=lambda s: None)
    assert out.getvalue().decode() == "one\ntwo\nthree\nlast words\n"


@pytest.fixture
def run_with_logs(tmp_path: Path) -> Path:
    """A run of three members: m-0 failed after two attempts, the second on two ranks; m-1 runs."""
    run_dir, _ = make_run(tmp_path, 3, running=2)
    append(
        run_dir,
        [
            {"time": 3.0, "kind": "failed", "member": "m-0", "attempt": 1, "error": "ValueError: first", "cost": 1},
            {"time": 4.0, "kind": "started", "member": "m-0", "attempt": 2},
            {"time": 5.0, "kind": "failed", "member": "m-0", "attempt": 2, "error": "BashExitFailure: 1", "cost": 1},
        ],
    )
    logs = run_dir / "members/m-0/logs"
    logs.mkdir()
    (logs / "attempt-1.log").write_text("--- attempt 1 on h\nfirst attempt\n")
    (logs / "attempt-2.log").write_text("--- attempt 2 on h\nrank 0 says\na peer rank is gone\n")
    (logs / "attempt-2.rank-1.log").write_text(
        "--- attempt 2 rank 1 on h\nrank 1 says\nTraceback (most recent call last):\n"
        '  File "w.py", line 3, in train\n    step()\nRuntimeError: ' + "e" * 300 + "\n"
    )
    return run_dir


def test_logs_prints_the_latest_attempt_every_rank_or_the_one_asked_for(
    run_with_logs: Path, capsysbinary: pytest.CaptureFixture
) -> None:
    run = str(run_with_logs)
    logs = run_with_logs / "members/m-0/logs"
    assert main(["logs", run, "m-0"]) == 0
    assert capsysbinary.readouterr().out.decode() == (
        f"==> rank 0: {logs / 'attempt-2.log'} <==\n--- attempt 2 on h\nrank 0 says\na peer rank is gone\n"
        f"==> rank 1: {logs / 'attempt-2.rank-1.log'} <==\n{(logs / 'attempt-2.rank-1.log').read_text()}"
    )
    assert main(["logs", run, "m-0", "--attempt", "1"]) == 0
    assert capsysbinary.readouterr().out == b"--- attempt 1 on h\nfirst attempt\n"
    assert main(["logs", run, "m-0", "--rank", "1"]) == 0
    assert capsysbinary.readouterr().out.decode() == (logs / "attempt-2.rank-1.log").read_text()
    assert main(["logs", run, "m-0", "--attempt", "1", "--follow"]) == 0  # over: a later attempt started
    assert capsysbinary.readouterr().out == b"--- attempt 1 on h\nfirst attempt\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nobody"], "has no member 'nobody'; its members: m-0, m-1, m-2"),
        (["m-0", "--attempt", "3"], "m-0 has no attempt 3; its attempts with output: 1, 2"),
        (["m-0", "--attempt", "1", "--rank", "1"], "attempt 1 of m-0 has no output of rank 1; ranks: 0"),
        (["m-1"], "m-1 has printed nothing yet: no attempt of it has started"),
    ],
)
def test_logs_mistakes_are_one_line(
    run_with_logs: Path, capsys: pytest.CaptureFixture, argv: list[str], message: str
) -> None:
    assert main(["logs", str(run_with_logs), *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_logs_of_a_directory_that_is_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["logs", str(tmp_path), "m-0"]) == 2
    assert "is not a run directory (no plan.json)" in capsys.readouterr().err


def test_ctrl_c_ends_follow_quietly(run_with_logs: Path, monkeypatch, capsysbinary: pytest.CaptureFixture) -> None:
    import resilient_flows.cli._logs as logs

    def interrupted(_: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("resilient_flows.rundir.holding_runner", lambda run_dir: object())
    monkeypatch.setattr(logs, "time", SimpleNamespace(sleep=interrupted))
    assert main(["logs", str(run_with_logs), "m-0", "--rank", "1", "--follow"]) == 0  # a runner holds it: it waits
    captured = capsysbinary.readouterr()
    assert captured.out.endswith(b"RuntimeError: " + b"e" * 300 + b"\n") and captured.err == b""


def test_follow_waits_for_the_first_attempt_while_a_runner_holds_the_run(
    run_with_logs: Path, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture
) -> None:
    import resilient_flows.cli._logs as logs

    log = run_with_logs / "members/m-1/logs/attempt-1.log"

    def first_attempt_starts(_: float) -> None:  # the member starts and ends while `logs` waits
        log.parent.mkdir(exist_ok=True)
        log.write_text("--- attempt 1 on h\nat last\n")
        (run_with_logs / "members/m-1/result.json").write_text("{}")

    monkeypatch.setattr("resilient_flows.rundir.holding_runner", lambda run_dir: object())
    monkeypatch.setattr(logs, "time", SimpleNamespace(sleep=first_attempt_starts))
    assert main(["logs", str(run_with_logs), "m-1", "--follow"]) == 0
    assert capsysbinary.readouterr().out == b"--- attempt 1 on h\nat last\n"


def test_status_shows_the_end_of_a_failed_members_output_within_the_width(
    run_with_logs: Path, capsys: pytest.CaptureFixture
) -> None:
    run = str(run_with_logs)
    assert main(["status", run]) == 1
    out = capsys.readouterr().out
    below = out[out.index("m-0 failed; the end") :].splitlines()
    assert below[:5] == [
        "m-0 failed; the end of attempt 2's output (members/m-0/logs/attempt-2.rank-1.log):",
        "  rank 1 says",
        "  Traceback (most recent call last):",
        '    File "w.py", line 3, in train',
        "      step()",
    ]
    assert below[5].startswith("  RuntimeError: eee") and below[6] == f"  all of it: resilient-flows logs {run} m-0"
    from resilient_flows.workflow import member_statuses

    statuses = member_statuses(run, [(f"m-{k}", 50) for k in range(3)])
    tails = failed_tails(run, statuses.values())
    for width in (80, 120):
        console = Console(file=io.StringIO(), width=width, color_system=None)
        console.print(OutputTails(run, tails))
        lines = console.file.getvalue().splitlines()
        (error,) = [line for line in lines if line.startswith("  RuntimeError: ")]
        assert max(map(len, lines)) <= width and error.endswith("…")
    whole = Console(file=io.StringIO(), width=1000, color_system=None)
    whole.print(OutputTails(run, tails, cut=False))
    assert "e" * 300 in whole.file.getvalue()


def test_status_json_names_each_attempts_files_and_the_latest(
    run_with_logs: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["status", str(run_with_logs), "--json"]) == 1
    members = {m["name"]: m for m in json.loads(capsys.readouterr().out)["members"]}
    assert (members["m-0"]["state"], members["m-0"]["attempts"]) == ("failed", 2)
    assert members["m-0"]["logs"] == [
        {"attempt": 1, "rank": 0, "file": "members/m-0/logs/attempt-1.log"},
        {"attempt": 2, "rank": 0, "file": "members/m-0/logs/attempt-2.log"},
        {"attempt": 2, "rank": 1, "file": "members/m-0/logs/attempt-2.rank-1.log"},
    ]
    assert members["m-0"]["log"] == "members/m-0/logs/attempt-2.log"
    assert [(members[m]["logs"], members[m]["log"]) for m in ("m-1", "m-2")] == [([], None)] * 2  # none printed


# ------------------------------------------------------------------------ members of a real run

ONE_WORKER = (
    (REPO / "site-configs/local.yaml").read_text().replace("max_workers_per_node: auto", "max_workers_per_node: 1")
)


@pytest.mark.slow
def test_each_members_output_is_in_its_own_attempt_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """One worker runs them all, one after another: a stage, a failing Python member (two
    attempts), a command member, and a Python member that finishes; none's output is in another's
    file, and ``status --json`` names each one's (the stage's as a member's)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    site = tmp_path / "one-worker.yaml"
    site.write_text(ONE_WORKER.replace("standby_pool: true", "standby_pool: false"))
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(
        "name: loud\nretries: 1\nstages:\n  - {name: loudly, loop: 'loud_workload:loop'}\nmembers:\n"
        "  - {name: bad, workload: 'loud_workload:train', steps: 1}\n"
        "  - {name: cmd, steps: 1, command: [sh, -c, 'echo out of cmd; echo err of cmd >&2; exit 3']}\n"
        "  - {name: good, workload: 'loud_workload:train', steps: 1}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["run", str(workflow), "--site", str(site), "--run-dir", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert f"resilient-flows logs {run_dir} bad" in out and f"resilient-flows logs {run_dir} cmd" in out
    logs = {m: run_dir / "members" / m / "logs" for m in ("bad", "cmd", "good")}
    assert sorted(p.name for p in logs["bad"].iterdir()) == ["attempt-1.log", "attempt-2.log"]
    for attempt in (1, 2):
        lines = body(logs["bad"] / f"attempt-{attempt}.log")
        assert lines[:4] == [
            f"stdout of bad rank 0, attempt {attempt}",
            f"stderr of bad rank 0, attempt {attempt}",
            "a child process of bad rank 0",
            "descriptor 1 of bad rank 0",
        ]
        assert lines[4] == "Traceback (most recent call last):"
        assert lines[-1] == f"ValueError: bad cannot train (attempt {attempt})"
    assert [body(logs["cmd"] / f"attempt-{a}.log") for a in (1, 2)] == [["out of cmd", "err of cmd"]] * 2
    assert body(logs["good"] / "attempt-1.log") == [
        "stdout of good rank 0, attempt 1",
        "stderr of good rank 0, attempt 1",
        "a child process of good rank 0",
        "descriptor 1 of good rank 0",
    ]
    assert main(["logs", str(run_dir), "bad", "--attempt", "1"]) == 0
    assert capsys.readouterr().out == (logs["bad"] / "attempt-1.log").read_text()
    assert main(["status", str(run_dir)]) == 1
    status = capsys.readouterr().out
    assert "bad failed; the end of attempt 2's output (members/bad/logs/attempt-2.log):" in status
    assert "  ValueError: bad cannot train (attempt 2)" in status.splitlines()
    summary = (run_dir / "report/summary.txt").read_text()
    assert "  ValueError: bad cannot train (attempt 2)" in summary.splitlines()

    assert main(["status", str(run_dir), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    (stage,) = document["stages"]
    assert (stage["name"], stage["state"], stage["attempts"]) == ("loudly", "finished", 1)
    assert stage["logs"] == [{"attempt": 1, "rank": 0, "file": "stages/loudly/logs/attempt-1.log"}]
    assert stage["log"] == "stages/loudly/logs/attempt-1.log"
    assert body(run_dir / stage["log"]) == ["stdout of the stage loudly", "stderr of the stage loudly"]
    members = {m["name"]: m for m in document["members"]}
    assert [members[m]["log"] for m in ("bad", "cmd", "good")] == [
        "members/bad/logs/attempt-2.log",
        "members/cmd/logs/attempt-2.log",
        "members/good/logs/attempt-1.log",
    ]
    assert main(["logs", str(run_dir), "loudly"]) == 0
    assert capsys.readouterr().out == (run_dir / stage["log"]).read_text()


@pytest.mark.mpi
@pytest.mark.slow
def test_each_rank_of_an_mpi_member_writes_its_own_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(
        "name: loud\nretries: 0\nmembers:\n  - {name: dp, workload: 'loud_workload:train', steps: 1, ranks: 2}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["run", str(workflow), "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    logs = run_dir / "members/dp/logs"
    assert sorted(p.name for p in logs.iterdir()) == ["attempt-1.log", "attempt-1.rank-1.log"]
    for rank, path in ((0, logs / "attempt-1.log"), (1, logs / "attempt-1.rank-1.log")):
        lines = body(path)
        mine = [line for line in lines if f"dp rank {rank}" in line]
        assert mine == [
            f"stdout of dp rank {rank}, attempt 1",
            f"stderr of dp rank {rank}, attempt 1",
            f"a child process of dp rank {rank}",
            f"descriptor 1 of dp rank {rank}",
        ]
        assert not [line for line in lines if f"dp rank {1 - rank}" in line]  # the other rank's is not here
    assert "mpi_member" in (logs / "attempt-1.log").read_text().splitlines()[0]  # the launcher's header
    assert main(["logs", str(run_dir), "dp", "--rank", "1"]) == 0
    assert capsys.readouterr().out == (logs / "attempt-1.rank-1.log").read_text()
