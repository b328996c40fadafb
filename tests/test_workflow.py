"""Workflow files, the CLI, and runs on a real local Parsl executor (HTEX workers, real SIGKILL)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from resilient_flows.cli import main
from resilient_flows.rundir import run_layout
from resilient_flows.training import read_events, run_member
from resilient_flows.workflow import load_workflow, read_plan
from resilient_flows.workflow._status import loss_curve

REPO = Path(__file__).resolve().parents[1]

GOOD = """\
name: demo
checkpoint:
  interval: 10
members:
  - name: mlp
    workload: mlp-digits
    steps: 40
    params: {hidden: 16}
    grid: {lr: [0.01, 0.1]}
    seeds: [0, 1]
  - name: solo
    workload: userworkload:train
    steps: 20
faults:
  - kill: mlp-1
    at_step: 25
"""


def write(tmp_path: Path, text: str, name: str = "wf.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_members_expand_grid_times_seeds_in_file_order(tmp_path: Path) -> None:
    workflow = load_workflow(write(tmp_path, GOOD))
    specs = workflow.member_specs(local_root="/scratch/run")
    assert [(s.name, s.seed, s.params.get("lr")) for s in specs] == [
        ("mlp-0", 0, 0.01),
        ("mlp-1", 1, 0.01),
        ("mlp-2", 0, 0.1),
        ("mlp-3", 1, 0.1),
        ("solo", 0, None),
    ]
    assert specs[1].faults[0].kind == "kill" and specs[1].faults[0].at_step == 25
    assert not specs[0].faults
    local = specs[4].checkpoint.tier("local")
    assert local is not None and local.path == "/scratch/run/solo" and specs[4].checkpoint.interval_steps == 10


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("    steps: 40\n", "    stepz: 40\n"),
            r"wf.yaml:7: members\[0\].stepz: unknown key \(did you mean 'steps'\?\); allowed",
        ),
        (("    steps: 40\n", "    steps: forty\n"), r"wf.yaml:7: members\[0\].steps: Input should be a valid integer"),
        (("    workload: mlp-digits\n", ""), r"wf.yaml:5: members\[0\].workload: required key is missing"),
        (("    workload: mlp-digits\n", "    workload: resnet\n"), r"wf.yaml:6: .*unknown workload 'resnet'"),
        (("  interval: 10\n", "  interval: 10 parsecs\n"), r"wf.yaml:3: checkpoint.interval: interval '10 parsecs'"),
        (
            ("name: demo\n", "name: demo\nreport: {plot: ../../outside.png}\n"),
            r"wf.yaml:2: report.plot: path '../../outside.png' must be relative and stay inside the run directory",
        ),
        (("  - name: solo\n", "  - name: ../solo\n"), r"members\[1\].name: String should match pattern"),
        (
            ("  - kill: mlp-1\n", "  - kill: mlp-9\n"),
            r"fault names 'mlp-9', which is not one of the members or stages mlp-0",
        ),
        (("name: demo\n", "name: demo\nsite: thetta\n"), r"unknown site 'thetta'; known sites: .*local"),
        (("members:\n", "members: [\n"), r"wf.yaml:\d+: not valid YAML"),
        (
            ("    steps: 40\n", "    steps: 40\n    ranks: 0\n"),
            r"wf.yaml:8: members\[0\].ranks: member 'mlp' needs at least one rank, got ranks: 0",
        ),
        (
            ("    steps: 40\n", "    steps: 40\n    parallel: zero\n"),
            r"wf.yaml:8: members\[0\].parallel: Input should be 'ddp' or 'fsdp'",
        ),
        (
            (
                "faults:\n",
                "explore:\n  - {name: e, strategy: random, workload: mlp-digits, steps: 5, "
                "hyperparameters: {lr: {low: 1}}}\nfaults:\n",
            ),
            r"explore\[0\].hyperparameters.lr.low: unknown key \(did you mean 'log'\?\); allowed: values, range, log",
        ),
        (("    steps: 40\n", "    steps: 40\n    stall_timeout: -5s\n"), r"members\[0\].stall_timeout: .*"),
    ],
)
def test_bad_workflows_give_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture, change, message) -> None:
    old, new = change
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert __import__("re").search(message, err), err


@pytest.fixture
def workers_import_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """``userworkload`` is imported as a worker imports it: from ``tests/`` on ``PYTHONPATH``."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))


def test_validate_names_the_members_and_site(
    tmp_path: Path, capsys: pytest.CaptureFixture, workers_import_tests: None
) -> None:
    assert main(["validate", str(write(tmp_path, GOOD))]) == 0
    out = capsys.readouterr().out
    assert "valid; 5 member(s) on site local\n  mlp: 4 members (mlp-0 .. mlp-3)\n  solo: 1 member\n" in out


def test_status_and_resume_of_a_directory_that_is_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["status", str(tmp_path)]) == 2
    assert "is not a run directory (no plan.json)" in capsys.readouterr().err


def test_preempt_writes_the_control_request_of_a_known_member(
    tmp_path: Path, capsys: pytest.CaptureFixture, workers_import_tests: None
) -> None:
    from resilient_flows.workflow import plan_workflow
    from resilient_flows.workflow._recorded_plan import create_run_dir

    workflow = load_workflow(write(tmp_path, GOOD))
    run_dir = create_run_dir(tmp_path / "run", plan_workflow(workflow), GOOD)
    assert main(["preempt", str(run_dir), "mlp-2", "--reason", "analytics a1"]) == 0
    request = json.loads((run_dir / "members/mlp-2/control.json").read_text())
    assert request == {"action": "preempt", "reason": "analytics a1"}
    assert main(["preempt", str(run_dir), "mlp-9"]) == 2
    assert "has no member 'mlp-9'; its members: mlp-0, mlp-1, mlp-2, mlp-3, solo" in capsys.readouterr().err


def test_python_tags_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, "name: !!python/object/apply:os.system ['true']\nmembers: []\n")
    assert main(["validate", str(path)]) == 2
    assert "not valid YAML" in capsys.readouterr().err


@pytest.mark.slow
def test_a_killed_worker_is_retried_and_ends_like_an_uninterrupted_run(tmp_path: Path, capsys, monkeypatch) -> None:
    """SIGKILL of the real HTEX worker process running mlp-1; Parsl retries; the member resumes."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))
    workflow = (
        "name: kill\ncheckpoint: {interval: 10}\nmembers:\n"
        "  - {name: mlp, workload: mlp-digits, steps: 300, params: {hidden: 16}, seeds: [0, 1]}\n"
        "  - {name: solo, workload: 'userworkload:train', steps: 200}\n"
        "faults:\n  - {kill: mlp-1, at_step: 175}\n"
    )
    path = write(tmp_path, workflow)
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "mlp-1" in out and (run_dir / "report/loss.png").stat().st_size > 10_000
    page = (run_dir / "report/index.html").read_text()  # the dashboard as a page, with the run in it
    assert '"name":"mlp-1"' in page and (run_dir / "report/assets/plotly.min.js").is_file()

    events = list(read_events(run_dir))
    mine = [e for e in events if e["member"] == "mlp-1"]
    first_pid = next(e["pid"] for e in mine if e["kind"] == "started")
    with pytest.raises(ProcessLookupError):
        os.kill(first_pid, 0)  # the first attempt's worker is really gone
    (failed,) = [e for e in mine if e["kind"] == "failed"]
    assert failed["error"].startswith("WorkerLost") and failed["cost"] == 0.0
    # save(169) returns once 159's shards are written, not committed: the writer commits one
    # checkpoint at a time, so 149 is committed for sure and 159, 169 may still be in flight
    assert failed["checkpoint"] in (149, 159, 169)
    assert [e["step"] for e in mine if e["kind"] == "resumed"] == [failed["checkpoint"]]
    assert [e["kind"] for e in events if e["member"] == "mlp-0"].count("started") == 1

    plan = read_plan(run_dir)
    for spec in plan.members:
        reference = run_member(replace(spec, faults=()).to_dict(), str(tmp_path / "ref"))
        result = json.loads((run_dir / "members" / spec.name / "result.json").read_text())
        assert result["digest"] == reference["digest"], spec.name
        assert loss_curve(run_dir, spec.name) == loss_curve(tmp_path / "ref", spec.name)
    assert main(["status", str(run_dir)]) == 0


@pytest.mark.slow
def test_resume_skips_finished_members_and_continues_failed_ones(tmp_path: Path, capsys) -> None:
    workflow = (
        "name: r\nretries: 0\ncheckpoint: {interval: 5}\n"
        "members:\n  - {name: a, workload: mlp-breast-cancer, steps: 30}\n"
        "  - {name: b, workload: mlp-breast-cancer, steps: 30, seed: 4}\n"
        "faults:\n  - {error: b, at_step: 12}\n"
    )
    path = write(tmp_path, workflow)
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 1  # b failed, no retries left
    assert "member b failed: RuntimeError: injected error in member b at step 12" in capsys.readouterr().out
    assert main(["status", str(run_dir)]) == 1
    finished_a = (run_dir / "members/a/result.json").read_text()

    assert main(["resume", str(run_dir)]) == 0
    assert "1 member(s) already finished; resuming 1" in capsys.readouterr().out
    assert (run_dir / "members/a/result.json").read_text() == finished_a
    b_events = [e for e in read_events(run_dir) if e["member"] == "b"]
    assert [e["step"] for e in b_events if e["kind"] == "resumed"] == [9]
    reference = run_member(replace(read_plan(run_dir).members[1], faults=()).to_dict(), str(tmp_path / "ref"))
    assert json.loads((run_dir / "members/b/result.json").read_text())["digest"] == reference["digest"]
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 2  # a run directory is not reused
    assert not run_layout(run_dir).monitoring_db.exists()  # only a workflow with monitoring: true has one


@pytest.mark.slow
def test_clones_from_a_workflow_branch_off_and_the_unchanged_one_matches(tmp_path: Path, capsys) -> None:
    workflow = (
        "name: c\ncheckpoint: {interval: 50}\n"
        "members:\n  - {name: m, workload: cnn-digits, steps: 400, seed: 2}\n"
        "clones:\n  - {member: m, at_step: 150, n: 2, overrides: [{}, {lr: 0.01, steps: 300}]}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["run", str(write(tmp_path, workflow)), "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "m.c1" in out and "m.c2" in out
    results = {n: json.loads((run_dir / f"members/{n}/result.json").read_text()) for n in ("m", "m.c1", "m.c2")}
    assert results["m.c1"]["digest"] == results["m"]["digest"]
    assert results["m.c2"]["step"] == 299 and results["m.c2"]["digest"] != results["m"]["digest"]
    assert min(loss_curve(run_dir, "m.c1")) == 151 and loss_curve(run_dir, "m.c1")[151] == loss_curve(run_dir, "m")[151]
    cloned = {e["member"]: e for e in read_events(run_dir) if e["kind"] == "cloned"}
    assert set(cloned) == {"m.c1", "m.c2"} and all(e["step"] == 150 for e in cloned.values())
    assert main(["lineage", str(run_dir)]) == 0
    tree = capsys.readouterr().out
    assert "m.c2" in tree and "from step 150 via shared tier (hard link); lr=0.01, steps=300" in tree


@pytest.mark.parametrize("path", sorted((REPO / "workflows").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_workflow_validates(path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err


def test_the_status_tracker_reads_only_new_events_and_agrees_with_a_fresh_read(tmp_path: Path) -> None:
    from resilient_flows.training import EventLog
    from resilient_flows.workflow._status import StatusTracker, member_statuses

    log, tracker = EventLog(tmp_path), StatusTracker(tmp_path)
    members = [("a", 10)]
    batches = [
        [("submitted", "a", {}), ("started", "a", {"attempt": 1}), ("stage_started", "heat", {"attempt": 1})],
        [("checkpointed", "a", {"step": 4}), ("failed", "a", {"error": "WorkerLost: gone", "cause": "error"})],
        [("submitted", "b", {}), ("started", "b", {"attempt": 1}), ("started", "a", {"attempt": 2})],
        [("resumed", "a", {"step": 4}), ("preempted", "b", {"step": 2, "attempt": 1, "reason": "x"})],
    ]
    for i, batch in enumerate(batches):
        for kind, name, fields in batch:
            log.emit(kind, name, **fields)
        if i == 2:
            members = [("a", 10), ("b", 5)]  # a clone registered after its first events
        with (tmp_path / "events.jsonl").open("ab") as f:
            f.write(b'{"kind": "checkpointed", "member": "a", "st')  # a line being written
        fresh = member_statuses(tmp_path, members)
        mine = tracker.update(members)
        strip = lambda s: (s.state, s.attempts, s.checkpoint, s.failures, s.preemptions, s.errors)  # noqa: E731
        assert {n: strip(s) for n, s in mine.items()} == {n: strip(s) for n, s in fresh.items()}, i
        with (tmp_path / "events.jsonl").open("ab") as f:
            f.write(b'ep": 9}\n')  # the line completes: the next update sees it
    assert tracker.update(members)["a"].checkpoint == 9
    assert [e["kind"] for e in tracker.events_of(["heat"])] == ["stage_started"]
