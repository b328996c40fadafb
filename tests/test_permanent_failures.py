"""Errors that no retry can fix fail a member at once and say why, in the event log, in ``status``
and to a plain Parsl script; a run keeps library warnings off the terminal."""

from __future__ import annotations

import io
import logging
import math
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
from parsl.app.errors import BashExitFailure
from rich.console import Console

from resilient_flows.apps import ResumingRetryHandler
from resilient_flows.cli import main
from resilient_flows.errors import ParamsError, PermanentError
from resilient_flows.rundir import read_events
from resilient_flows.training import MemberSpec, StageSpec, run_command, run_stage
from resilient_flows.training._command import CommandCannotRun
from resilient_flows.workflow._member_table import last_error
from resilient_flows.workflow._plots import loss_figure
from resilient_flows.workflow._report import status_table
from resilient_flows.workflow._runlog import library_output_to_log
from resilient_flows.workflow._status import MemberStatus

#: A workload importable only from the directory that the tests write it to.
WORKLOAD = """\
import torch


def train(ctx):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx.track(model=model, optimizer=optimizer)
    for step in ctx.steps(ctx.params["steps"]):
        loss = model(torch.ones(1, 2)).square().sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ctx.log(step, loss=loss)
    return ctx.result(model)
"""


def record_of(spec: MemberSpec, run_dir: Path, func_name: str = "train_app", try_id: int = 0) -> dict[str, Any]:
    """A Parsl task record of an attempt (the first, by default), as the retry handler sees it."""
    return {
        "id": 0,
        "func_name": func_name,
        "args": (spec.to_dict(), str(run_dir)),
        "kwargs": {},
        "fail_cost": 0,
        "try_id": try_id,
        "executor": "x",
    }


def failures(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir) if e["kind"] in ("failed", "retried")]


@pytest.mark.parametrize(
    "exception",
    [
        PermanentError("workload 'x:train': cannot import 'x'"),
        ParamsError("loop function m:f: got an unexpected keyword argument 'lr'"),
        ModuleNotFoundError("No module named 'x'"),
        SyntaxError("invalid syntax"),
        BashExitFailure("mpi_train_app", 127),
        CommandCannotRun("m", 127, "nosuch: No such file or directory"),
    ],
)
def test_an_error_no_retry_can_fix_fails_the_member_at_once(tmp_path: Path, exception: Exception) -> None:
    spec = MemberSpec(name="m", workload="x:train", params={}, steps=5)
    assert ResumingRetryHandler(retries=3)(exception, record_of(spec, tmp_path)) == math.inf
    (failed,) = failures(tmp_path)  # failed, and no retried event
    assert (failed["kind"], failed["failure_kind"], failed["cost"], failed["attempt"]) == (
        "failed",
        "permanent",
        None,
        1,
    )
    assert failed["error"].startswith(type(exception).__name__) and failed["cause"].startswith("permanent")


def test_an_ordinary_error_still_costs_one_retry(tmp_path: Path) -> None:
    spec = MemberSpec(name="m", workload="x:train", params={}, steps=5)
    assert ResumingRetryHandler(retries=3)(TypeError("unsupported operand"), record_of(spec, tmp_path)) == 1.0
    assert [(e["kind"], e.get("failure_kind")) for e in failures(tmp_path)] == [("failed", "error"), ("retried", None)]


def test_the_handler_makes_a_missing_run_directory_and_never_hides_the_task_s_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Parsl script's run directory does not exist until a member makes it; one whose member
    failed first is made by the handler. A record it cannot make must not replace the error."""
    spec = MemberSpec(name="m", workload="x:train", params={}, steps=5)
    run_dir = tmp_path / "not" / "yet"
    assert ResumingRetryHandler(retries=1)(PermanentError("no"), record_of(spec, run_dir)) == math.inf
    assert [e["kind"] for e in read_events(run_dir)] == ["failed"]

    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a run directory below a file cannot be made
    with caplog.at_level(logging.WARNING, logger="resilient_flows.apps"):
        assert ResumingRetryHandler(retries=1)(RuntimeError("boom"), record_of(spec, blocked / "run")) == 1.0
        assert ResumingRetryHandler(retries=1)(ImportError("x"), record_of(spec, blocked / "run")) == math.inf
    assert "could not record the failure of train_app task 0 (RuntimeError: boom)" in caplog.text


def test_a_command_that_is_not_there_or_not_executable_cannot_run(tmp_path: Path) -> None:
    missing = MemberSpec(name="m", workload="", params={}, steps=1, command=["no-such-program-i26", "--flag"])
    with pytest.raises(CommandCannotRun, match=r"exit status 127\): no-such-program-i26: No such file or directory$"):
        run_command(missing.to_dict(), str(tmp_path))
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\n")  # not executable
    plain = MemberSpec(name="p", workload="", params={}, steps=1, command=[str(script)])
    with pytest.raises(CommandCannotRun, match=r"exit status 126\).*Permission denied$"):
        run_command(plain.to_dict(), str(tmp_path))
    shell = MemberSpec(name="s", workload="", params={}, steps=1, command=["sh", "-c", "no-such-program-i26"])
    with pytest.raises(CommandCannotRun, match="exit status 127"):  # a shell's own "not found"
        run_command(shell.to_dict(), str(tmp_path))
    nowhere = MemberSpec(name="w", workload="", params={}, steps=1, command=["true"], workdir=str(tmp_path / "gone"))
    with pytest.raises(CommandCannotRun, match=r"^command of member w could not be started: .*gone"):
        run_command(nowhere.to_dict(), str(tmp_path))


def test_a_stage_given_a_parameter_its_loop_does_not_take_fails_before_it_starts(tmp_path: Path) -> None:
    loop = "resilient_flows.examples.heat:simulate"
    stage = StageSpec(name="s", loop=loop, params={"size": 8, "no_such_param": 1})
    with pytest.raises(PermanentError, match=f"loop function '{loop}': unknown param 'no_such_param'"):
        run_stage(stage.to_dict(), str(tmp_path))
    assert not (tmp_path / "stages" / "s" / "attempts").exists()  # no attempt was started


def test_a_workload_that_takes_other_arguments_is_a_params_error(tmp_path: Path, monkeypatch) -> None:
    from resilient_flows.training import run_member

    (tmp_path / "badsig_i26.py").write_text("def train(ctx, lr):\n    return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = MemberSpec(name="m", workload="badsig_i26:train", params={}, steps=1)
    with pytest.raises(ParamsError, match="workload badsig_i26:train of member m: missing a required argument: 'lr'"):
        run_member(spec.to_dict(), str(tmp_path / "run"))


def test_status_shows_each_troubled_member_s_last_error_on_one_line() -> None:
    ok = MemberStatus("ok", 10, state="finished")
    bad = MemberStatus("bad", 10, state="failed", failures=1, errors=["WorkerLost: x", "PermanentError: " + "y" * 300])
    assert last_error(ok) == "-"
    shown = last_error(bad)
    assert len(shown) == 100 and shown.startswith("PermanentError: yyy") and shown.endswith("…")
    assert last_error(MemberStatus("t", 1, errors=["\nTraceback:  first   line\nsecond"])) == "Traceback: first line"
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(status_table({"ok": ok, "bad": bad}, "run"))
    text = console.file.getvalue()
    assert "last error" in text and "PermanentError: yyy" in text
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(status_table({"ok": ok}, "run"))
    assert "last error" not in console.file.getvalue()  # no column when nothing failed


def test_a_plot_without_metrics_says_so_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figure = loss_figure({"m": MemberStatus("m", 10, state="failed")}, "run")
    (axes,) = figure.axes
    assert axes.get_legend() is None and [t.get_text() for t in axes.texts] == ["no metrics yet"]


def test_a_run_s_library_warnings_go_to_its_log_and_its_own_to_the_console_too(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    log = tmp_path / "runner.log"
    out = io.StringIO()
    before = hooks()
    with library_output_to_log(log, Console(file=out, color_system=None, width=200)):
        warnings.warn("No artists with labels found to put in legend", UserWarning, stacklevel=1)
        logging.getLogger("matplotlib.legend").warning("a library's log record")
        logging.getLogger("resilient_flows.test").warning("our own warning")
    assert hooks() == before  # everything as it was
    written = log.read_text()
    assert "UserWarning: No artists" in written and "a library's log record" in written
    assert "our own warning" in written and out.getvalue() == "warning: our own warning\n"
    err = capfd.readouterr().err
    assert "No artists" not in err and "library's" not in err


def hooks() -> tuple[Any, ...]:
    """What :func:`library_output_to_log` changes while it holds."""
    return warnings.showwarning, logging.getLogger().handlers[:], logging.getLogger("resilient_flows").handlers[:]


# End to end, with real Parsl: the README's script, and a workflow run.


def unimportable_workload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workload module that this process can import and Parsl's workers cannot (not on their PYTHONPATH)."""
    directory = tmp_path / "mine"
    directory.mkdir()
    (directory / "wl_i26.py").write_text(WORKLOAD)
    monkeypatch.syspath_prepend(str(directory))
    return directory


def run_script_member(tmp_path: Path, run_dir: Path) -> Any:
    """The README's Parsl script: ``train_app`` under ``parsl.load(load_site(...))``; its result."""
    import parsl

    from resilient_flows.apps import train_app
    from resilient_flows.sites import load_site

    member = MemberSpec(name="m0", workload="wl_i26:train", params={}, steps=5)
    config = load_site("local", run_dir=str(tmp_path / "parsl"), retries=2, retry_handler=ResumingRetryHandler(2))
    with parsl.load(config):
        return train_app(member.to_dict(), str(run_dir)).result(timeout=120)


@pytest.mark.slow
def test_a_parsl_script_whose_workers_cannot_import_the_workload_gets_that_error_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    unimportable_workload(tmp_path, monkeypatch)
    run_dir = tmp_path / "run"  # as in the README: nothing makes it before the member runs
    with pytest.raises(PermanentError, match=r"no module named 'wl_i26'.*PYTHONPATH"):  # not the handler's error
        run_script_member(tmp_path, run_dir)
    (failed,) = failures(run_dir)
    assert failed["failure_kind"] == "permanent" and "no module named 'wl_i26'" in failed["error"]
    assert "FileNotFoundError" not in capfd.readouterr().err


@pytest.mark.slow
def test_a_parsl_script_whose_workers_import_the_workload_from_pythonpath_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = unimportable_workload(tmp_path, monkeypatch)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(directory), os.environ.get("PYTHONPATH", "")]))
    result = run_script_member(tmp_path, tmp_path / "run")
    assert (result["member"], result["step"]) == ("m0", 4)
    assert failures(tmp_path / "run") == []


@pytest.mark.slow
def test_a_run_whose_member_cannot_import_its_workload_fails_it_once_and_status_says_why(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    """The module imports where ``run`` checks it (the login node) but not on the workers (a
    library only the login node has, say): ``run`` starts, the member fails on its first attempt."""
    workflow = tmp_path / "wf.yaml"
    (tmp_path / "wl_login_i26.py").write_text(
        "import os\n"
        "if 'PARSL_WORKER_BLOCK_ID' in os.environ:\n"
        "    raise ImportError('libcuda.so.1: cannot open shared object file')\n"
        "def train(ctx):\n    return {}\n"
    )
    workflow.write_text("name: bad\nretries: 2\nmembers:\n  - {name: m0, workload: 'wl_login_i26:train', steps: 5}\n")
    run_dir = tmp_path / "run"
    assert main(["run", str(workflow), "--run-dir", str(run_dir)]) == 1
    events = [e for e in read_events(run_dir) if e["member"] == "m0"]
    assert [e["kind"] for e in events] == ["submitted", "failed"]  # one attempt, no retry
    assert events[1]["failure_kind"] == "permanent"
    assert main(["status", str(run_dir)]) == 1
    out, err = capfd.readouterr()
    assert "WorkloadError: workload 'wl_login_i26:train': importing wl_login_i26 raised ImportError" in out
    resume = f"warning: no runner holds this run (its runner ended); resilient-flows resume {run_dir} continues it"
    assert "Warning" not in out + err and " ".join(err.split()) == resume  # once the workload is fixed
    assert "│ m0     │ failed │" in out and "│        1 │        1 │" in out  # 1 attempt, 1 failure
