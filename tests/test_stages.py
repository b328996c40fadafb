"""Workflow stages: checkpointed array loops that members read (schema, resume, a real run)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from resilient_flows.cli import main
from resilient_flows.examples.heat import digest, load_snapshots
from resilient_flows.training import FaultSpec, StageSpec, read_events, run_member, run_stage, stage_dir
from resilient_flows.workflow import load_workflow, read_plan

HEAT = StageSpec(
    "heat",
    "resilient_flows.examples.heat:simulate",
    {"size": 16, "iterations": 600, "episode": 100, "snapshot_every": 5},
    every_n=40,
)

WORKFLOW = """\
name: pipeline
stages:
  - name: heat
    loop: resilient_flows.examples.heat:simulate
    params: {size: 16, iterations: 600, episode: 100, snapshot_every: 5}
    every: 40
  - name: again
    loop: resilient_flows.examples.heat:simulate
    after: [heat]
checkpoint: {interval: 20}
members:
  - name: sur
    workload: resilient_flows.examples.heat:train_surrogate
    after: [heat]
    steps: 60
    seeds: [0, 1]
faults:
  - {kill: heat, at_step: 333}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "wf.yaml"
    path.write_text(text)
    return path


def test_stages_and_after_become_specs_with_run_relative_inputs(tmp_path: Path) -> None:
    workflow = load_workflow(write(tmp_path, WORKFLOW))
    heat, again = workflow.stage_specs()
    assert (heat.every_n, heat.faults, heat.inputs) == (40, (FaultSpec("kill", 333),), {})
    assert again.inputs == {"heat": "stages/heat/output"} and again.every_n == 10
    assert [m.inputs for m in workflow.member_specs(None)] == [{"heat": "stages/heat/output"}] * 2
    assert StageSpec.from_dict(json.loads(json.dumps(heat.to_dict()))) == heat


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("    after: [heat]\n    steps", "    after: [hot]\n    steps"),
            r"member 'sur' runs after 'hot', which is not a stage",
        ),
        (("  - name: again\n", "  - name: sur-1\n"), r"names must be unique; repeated: sur-1"),
        (("    every: 40\n", "    every: 0\n"), r"stages\[0\].every: an iteration interval must be at least 1"),
        (("    every: 40\n", "    every: soon\n"), r"stages\[0\].every: every 'soon'"),
        (
            ("loop: resilient_flows.examples.heat:simulate\n    params", "loop: simulate\n    params"),
            r"loop must be 'module:function'",
        ),
        (
            ("    params: {size: 16,", "    params: {output: x, size: 16,"),
            r"output are passed by the runner, not params",
        ),
        (
            ("  - name: heat\n", "  - name: heat\n    after: [again]\n"),
            r"stage 'heat' runs after 'again', which must be a stage listed before it",
        ),
        (("  - {kill: heat,", "  - {kill: hea,"), r"fault names 'hea', which is not one of the members or stages"),
    ],
)
def test_bad_stages_give_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture, change, message) -> None:
    old, new = change
    assert old in WORKFLOW
    assert main(["validate", str(write(tmp_path, WORKFLOW.replace(old, new)))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and __import__("re").search(message, err), err


def test_a_failed_stage_reruns_from_its_checkpoint_to_the_same_output(tmp_path: Path) -> None:
    reference = run_stage(HEAT.to_dict(), str(tmp_path / "ref"))
    faulty = replace(HEAT, faults=(FaultSpec("error", 333),)).to_dict()
    with pytest.raises(RuntimeError, match="injected error in stage heat at iteration 333"):
        run_stage(faulty, str(tmp_path / "run"))
    assert not (stage_dir(tmp_path / "run", "heat") / "result.json").exists()
    assert run_stage(faulty, str(tmp_path / "run")) == reference  # what a Parsl retry does
    snapshots = load_snapshots(stage_dir(tmp_path / "run", "heat") / "output")
    assert np.array_equal(snapshots, load_snapshots(stage_dir(tmp_path / "ref", "heat") / "output"))
    assert snapshots.shape == (6, 20, 16, 16) and digest(snapshots) == reference["digest"]
    started = [e for e in read_events(tmp_path / "run") if e["kind"] == "stage_started"]
    assert [(e["attempt"], e["iteration"]) for e in started] == [(1, None), (2, 319)]  # every 40: 39, ..., 319
    result = json.loads((stage_dir(tmp_path / "run", "heat") / "result.json").read_text())
    assert result == {"stage": "heat", "attempts": 2, "value": reference}


def test_a_member_without_its_stage_output_gets_a_clear_error(tmp_path: Path) -> None:
    plan = load_workflow(write(tmp_path, WORKFLOW)).member_specs(None)
    with pytest.raises(Exception, match=r"no simulation output at .*stages/heat/output/heat.npz: did the stage finish"):
        run_member(plan[0].to_dict(), str(tmp_path / "run"))


@pytest.mark.slow
def test_a_pipeline_survives_a_killed_stage_worker_and_members_read_its_output(tmp_path: Path, capsys) -> None:
    """SIGKILL of the real HTEX worker running the stage; Parsl retries it; the members start after it."""
    run_dir = tmp_path / "run"
    assert main(["run", str(write(tmp_path, WORKFLOW)), "--run-dir", str(run_dir)]) == 0
    assert "stages" in capsys.readouterr().out

    events = list(read_events(run_dir))
    heat = [e for e in events if e["member"] == "heat"]
    (failed,) = [e for e in heat if e["kind"] == "failed"]
    assert failed["error"].startswith("WorkerLost") and failed["cost"] == 0.0  # lost after progress: free
    restarts = [e["iteration"] for e in heat if e["kind"] == "stage_started"]
    # save(319) returns once 279's shards are written: 239 is committed for sure, 279 and 319 may be in flight
    assert restarts[0] is None and restarts[1] in (239, 279, 319) and len(restarts) == 2

    reference = run_stage(HEAT.to_dict(), str(tmp_path / "ref"))
    output = load_snapshots(stage_dir(run_dir, "heat") / "output")
    assert digest(output) == reference["digest"]
    assert np.array_equal(output, load_snapshots(stage_dir(tmp_path / "ref", "heat") / "output"))

    finished = {e["member"]: e["time"] for e in events if e["kind"] == "stage_finished"}
    first_start = {e["member"]: e["time"] for e in reversed(events) if e["kind"] in ("started", "stage_started")}
    assert first_start["again"] > finished["heat"]
    for spec in read_plan(run_dir).members:
        assert first_start[spec.name] > finished["heat"]
        expected = run_member(spec.to_dict(), str(tmp_path / "ref"))
        result = json.loads((run_dir / "members" / spec.name / "result.json").read_text())
        assert result["digest"] == expected["digest"] and result["test_mse"] == expected["test_mse"]

    assert main(["status", str(run_dir)]) == 0
    assert main(["resume", str(run_dir)]) == 0  # nothing left: no stage runs again
    assert [e["kind"] for e in read_events(run_dir)].count("stage_started") == 3
