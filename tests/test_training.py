"""The training contract without Parsl: exact resume after errors and preemption, metrics, analytics."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from resilient_flows.checkpoint import CheckpointConfig
from resilient_flows.errors import ResilientFlowsError
from resilient_flows.rundir import request_preemption
from resilient_flows.rundir._metrics import MetricsLog
from resilient_flows.training import (
    FaultSpec,
    MemberSpec,
    Preempted,
    TrainContext,
    evaluate_members,
    read_events,
    run_member,
)
from resilient_flows.training._workloads import resolve_workload
from resilient_flows.workflow._status import loss_curve


def spec(name: str = "m", workload: str = "mlp-digits", steps: int = 60, **changes) -> MemberSpec:
    base = MemberSpec(
        name=name,
        workload=workload,
        params={"channels": 8} if workload == "cnn-digits" else {"hidden": 32},
        seed=3,
        steps=steps,
        checkpoint=CheckpointConfig(interval_steps=10),
    )
    return replace(base, **changes)


@pytest.mark.parametrize("workload", ["mlp-digits", "cnn-digits", "mlp-breast-cancer", "userworkload:train"])
def test_a_failed_member_rerun_ends_bit_for_bit_like_an_uninterrupted_one(tmp_path: Path, workload: str) -> None:
    reference = run_member(spec(workload=workload).to_dict(), str(tmp_path / "ref"))
    faulty = spec(workload=workload, faults=(FaultSpec("error", 34),)).to_dict()
    with pytest.raises(RuntimeError, match="injected error in member m at step 34"):
        run_member(faulty, str(tmp_path / "run"))
    resumed = run_member(faulty, str(tmp_path / "run"))  # what a Parsl retry does
    assert resumed["digest"] == reference["digest"]
    assert resumed["attempts"] == 2
    assert loss_curve(tmp_path / "run", "m") == loss_curve(tmp_path / "ref", "m")
    kinds = [(e["kind"], e.get("step")) for e in read_events(tmp_path / "run") if e["kind"] != "checkpointed"]
    assert kinds == [("started", None), ("started", None), ("resumed", 29), ("finished", 59)]


def test_preemption_commits_a_checkpoint_of_the_current_step_and_raises(tmp_path: Path) -> None:
    reference = run_member(spec().to_dict(), str(tmp_path / "ref"))
    preempted = spec(faults=(FaultSpec("preempt", 22),)).to_dict()  # SIGTERM to this process
    with pytest.raises(Preempted) as caught:
        run_member(preempted, str(tmp_path / "run"))
    assert (caught.value.step, caught.value.reason) == (22, "signal SIGTERM")
    assert (tmp_path / "run/members/m/checkpoints/latest").read_text().strip() == "22"
    again = pickle.loads(pickle.dumps(caught.value))  # Parsl ships it from the worker
    assert (again.member, again.step, str(again)) == ("m", 22, str(caught.value))
    assert run_member(preempted, str(tmp_path / "run"))["digest"] == reference["digest"]


def test_a_control_file_request_preempts_at_the_next_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    directory = run_dir / "members" / "m"
    request_preemption(run_dir, "m", "analytics job a1")
    with pytest.raises(Preempted, match=r"preempted \(analytics job a1\) after committing step 0"):
        run_member(spec().to_dict(), str(run_dir))
    assert not (directory / "control.json").exists()  # consumed: the retry runs on
    assert run_member(spec().to_dict(), str(run_dir))["step"] == 59


def test_time_interval_checkpoints_and_final_checkpoint(tmp_path: Path) -> None:
    timed = spec(checkpoint=CheckpointConfig(interval_steps=None, interval_s=3600.0))
    run_member(timed.to_dict(), str(tmp_path))
    saved = [e["step"] for e in read_events(tmp_path) if e["kind"] == "checkpointed"]
    assert saved == [59]  # nothing was due within the hour, the last step always is


def test_steps_before_track_is_a_clear_error(tmp_path: Path) -> None:
    ctx = TrainContext(spec(), tmp_path)
    try:
        with pytest.raises(ResilientFlowsError, match=r"call ctx.track\(model=..., optimizer=...\) before"):
            next(iter(ctx.steps(3)))
    finally:
        ctx.close()


def test_analytics_reads_latest_checkpoints_without_disturbing_members(tmp_path: Path) -> None:
    user = spec(name="u", workload="userworkload:train", evaluate="userworkload:evaluate")
    run_member(user.to_dict(), str(tmp_path))
    absent = spec(name="later")
    debris = tmp_path / "members/u/checkpoints/step-00000099.tmp"  # a write in progress
    debris.mkdir()
    report = evaluate_members([user.to_dict(), absent.to_dict()], str(tmp_path), "a1")
    assert report["u"]["step"] == 59 and isinstance(report["u"]["prediction_at_ones"], float)
    assert report["later"] == {"step": None, "note": "no committed checkpoint yet"}
    assert debris.exists()
    (event,) = [e for e in read_events(tmp_path) if e["kind"] == "analytics"]
    assert event["request"] == "a1" and event["members"]["u"]["step"] == 59


def test_unknown_workloads_name_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ResilientFlowsError, match=r"unknown workload 'resnet'.*mlp-digits.*module:function"):
        run_member(spec(workload="resnet").to_dict(), str(tmp_path))
    with pytest.raises(ResilientFlowsError, match=r"userworkload has no function 'trian'"):
        run_member(spec(workload="userworkload:trian").to_dict(), str(tmp_path))


def test_metrics_lines_are_what_json_writes_and_reach_disk_by_each_checkpoint(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.FLUSH_S = 3600.0
    records = [
        {"step": 0, "attempt": 1, "time": 1764745000.123456, "loss": 0.1 + 0.2},
        {"step": 1, "attempt": 1, "time": 1764745000.5, "loss": float("nan"), "acc": float("inf")},
        {"step": 2, "attempt": 2, "time": 1.0, 'odd "%r" key': 1e-300},
    ]
    for record in records:
        log.append(record)
    assert not (tmp_path / "metrics.jsonl").exists()  # held until a flush
    log.flush()
    assert (tmp_path / "metrics.jsonl").read_text() == "".join(json.dumps(r) + "\n" for r in records)
    log.close()

    on_disk: dict[int, int] = {}
    member = spec(steps=30)
    ctx = TrainContext(member, str(tmp_path / "run"))
    ctx.runtime.metrics.FLUSH_S = 3600.0
    save = ctx.runtime.saver.save

    def probe(step: int, **kwargs) -> None:
        save(step, **kwargs)
        on_disk[step] = (ctx.directory / "metrics.jsonl").read_text().count("\n")

    ctx.runtime.saver.save = probe
    try:
        run = resolve_workload(member.workload)
        run.train(ctx)
    finally:
        ctx.close()
    assert on_disk == {9: 10, 19: 20, 29: 30}  # steps 0..k are on disk when step k's checkpoint starts


def test_an_attempt_with_no_step_left_reports_the_restored_step(tmp_path: Path) -> None:
    first = run_member(spec(steps=20).to_dict(), str(tmp_path))
    again = run_member(spec(steps=20).to_dict(), str(tmp_path))  # restores step 19, runs nothing
    assert (first["step"], again["step"], again["attempts"]) == (19, 19, 2)
    assert again["digest"] == first["digest"] and "loss" not in again


@pytest.mark.parametrize("name", ["digits", "breast-cancer"])
def test_the_shipped_datasets_are_scikit_learns_tables(name: str) -> None:
    import numpy as np
    from sklearn import datasets

    from resilient_flows.training._workloads import DATASET_DIR

    table = {"digits": datasets.load_digits, "breast-cancer": datasets.load_breast_cancer}[name]()
    with np.load(DATASET_DIR / f"{name}.npz", allow_pickle=False) as shipped:
        assert np.array_equal(shipped["data"].astype(np.float32), table.data.astype(np.float32))
        assert np.array_equal(shipped["target"].astype(np.int64), table.target.astype(np.int64))


def test_a_builtin_member_trains_without_importing_scikit_learn(tmp_path: Path) -> None:
    """Every rank of every attempt would pay about a second of CPU for scikit-learn's import."""
    spec = MemberSpec(name="m", workload="mlp-breast-cancer", steps=2, seed=1, params={}).to_dict()
    code = (
        "import sys; from resilient_flows.training import run_member;"
        f"run_member({spec!r}, {str(tmp_path)!r});"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy', 'pandas')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]
