"""A user's mistakes cost one clear line, never a retry: an unwritable run directory, params left
to their declared defaults, a loop that trains without ever checkpointing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from requires import require

from resilient_flows.cli import main
from resilient_flows.rundir import NO_CHECKPOINT, read_events
from resilient_flows.training import MemberSpec, run_member
from resilient_flows.training._run import evaluate_members
from resilient_flows.training.boundary._unsaved import UNSAVED_INTERVALS
from resilient_flows.workflow._plan import plan_workflow
from resilient_flows.workflow._recorded_plan import create_run_dir
from resilient_flows.workflow.schema import load_workflow

WORKFLOW = "name: w\nmembers:\n  - {name: m, workload: mlp-digits, steps: 20}\n"


def read_only(directory: Path, *command: str) -> subprocess.CompletedProcess:
    """``command`` run with ``directory`` mounted read-only, in a mount namespace of its own (root
    writes through permission bits; a read-only mount stops it too), which ends with the command."""
    require(os.geteuid() == 0 and shutil.which("unshare") is not None, "a read-only mount needs root and unshare")
    script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    argv = ["unshare", "--mount", "sh", "-c", script, str(directory), sys.executable, "-m", "resilient_flows.cli"]
    return subprocess.run([*argv, *command], capture_output=True, text=True, timeout=120, cwd=directory.parent)


def test_an_unwritable_run_directory_is_one_line_and_exit_2(tmp_path: Path) -> None:
    source = tmp_path / "wf.yaml"
    source.write_text(WORKFLOW)
    runs = tmp_path / "runs"
    runs.mkdir()
    started = read_only(runs, "run", str(source), "--run-dir", str(runs / "x"))
    assert started.returncode == 2, started.stderr
    assert started.stderr.strip().splitlines() == [
        f"error: cannot create the run directory {runs / 'x'}: Read-only file system; choose another with --run-dir"
    ]
    assert not (runs / "x").exists()

    run_dir = create_run_dir(tmp_path / "run", plan_workflow(load_workflow(source), build_site=False), WORKFLOW)
    resumed = read_only(run_dir, "resume", str(run_dir))
    assert resumed.returncode == 2, resumed.stderr
    assert resumed.stderr.strip().splitlines() == [
        f"error: cannot write to the run directory {run_dir}: Read-only file system"
    ]
    assert "Traceback" not in started.stderr + resumed.stderr


@pytest.mark.parametrize(
    ("workload", "defaults"),
    [("with_model", {"batch": 64, "widths": [4, 8]}), ("with_dataclass", {"batch": 32, "tags": ["a"]})],
)
def test_declared_param_defaults_reach_ctx_params_and_evaluate(
    tmp_path: Path, workload: str, defaults: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    spec = MemberSpec(
        name="m",
        workload=f"declared_workloads:{workload}",
        params={"lr": 0.1},
        seed=0,
        steps=1,
        evaluate="declared_workloads:evaluate",
    )
    result = run_member(spec.to_dict(), str(tmp_path))
    assert result["params"] == {"lr": 0.1, **defaults}
    assert evaluate_members([spec.to_dict()], str(tmp_path / "none")) == {
        "m": {"step": None, "note": "no committed checkpoint yet"}
    }
    given = replace(spec, params={"lr": 0.1, "batch": 8})
    assert run_member(given.to_dict(), str(tmp_path / "given"))["params"]["batch"] == 8  # what the workflow wrote wins


def test_a_loop_that_never_checkpoints_is_warned_once_and_status_notes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    tests = str(Path(__file__).parent)
    monkeypatch.syspath_prepend(tests)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))  # the preflight's
    every = 10
    source = tmp_path / "wf.yaml"
    source.write_text(
        f"name: w\ncheckpoint: {{interval: {every}}}\n"
        "members:\n  - {name: m, workload: 'declared_workloads:own_loop', steps: 100}\n"
    )
    plan = plan_workflow(load_workflow(source), build_site=False)
    run_dir = create_run_dir(tmp_path / "run", plan, source.read_text())
    (spec,) = plan.members
    run_member(spec.to_dict(), str(run_dir))
    warned = [e for e in read_events(run_dir) if e["kind"] == "warning"]
    assert [(e["warning"], e["step"], e["attempt"]) for e in warned] == [
        (NO_CHECKPOINT, UNSAVED_INTERVALS * every - 1, 1)
    ]
    assert main(["status", str(run_dir)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert (
        f"m: trained {UNSAVED_INTERVALS * every} steps ({UNSAVED_INTERVALS} checkpoint intervals of {every} steps)"
        in err
    )
    assert "a retry would restart it from step 0" in err
    assert main(["status", "--json", str(run_dir)]) == 0
    (member,) = json.loads(capsys.readouterr().out)["members"]
    assert member["notes"] == [warned[0]["reason"]]

    through_steps = replace(spec, workload="declared_workloads:boundary_loop")
    run_member(through_steps.to_dict(), str(tmp_path / "boundary"))
    assert not [e for e in read_events(tmp_path / "boundary") if e["kind"] == "warning"]
