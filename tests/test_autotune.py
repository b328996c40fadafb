"""``interval: auto``: the member measures its checkpoints, asks the recommender, and trains the same."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from resilient_flows.checkpoint import CheckpointConfig, TierSpec
from resilient_flows.mlc import MLCParams, Recommender
from resilient_flows.training import MemberSpec, read_events, run_member
from resilient_flows.training._autotune import WARMUP_CHECKPOINTS
from resilient_flows.workflow import load_workflow

AUTO = CheckpointConfig(interval_steps=10, auto=True, process_mtbf_s=600.0, node_mtbf_s=7200.0)


def member(tmp_path: Path, checkpoint: CheckpointConfig) -> MemberSpec:
    local = replace(checkpoint, tiers=(TierSpec(str(tmp_path / "local")), TierSpec("checkpoints")))
    return MemberSpec(name="m", workload="mlp-digits", params={"hidden": 32}, seed=3, steps=300, checkpoint=local)


def test_auto_tunes_after_the_warm_up_and_trains_like_a_fixed_interval(tmp_path: Path) -> None:
    tuned_run = run_member(member(tmp_path / "a", AUTO).to_dict(), str(tmp_path / "a"))
    fixed = CheckpointConfig(interval_steps=10)
    fixed_run = run_member(member(tmp_path / "b", fixed).to_dict(), str(tmp_path / "b"))
    assert tuned_run["digest"] == fixed_run["digest"]  # when it checkpoints never changes what it learns

    events = list(read_events(tmp_path / "a"))
    (tuned,) = [e for e in events if e["kind"] == "tuned"]
    saves = [e["step"] for e in events if e["kind"] == "checkpointed"]
    warmup = [s for s in saves if s < tuned["step"]]
    assert len(warmup) >= WARMUP_CHECKPOINTS and warmup[:3] == [9, 19, 29]  # every 10 steps until tuned
    params = MLCParams(**tuned["params"])
    assert (params.l1_mtbf, params.l2_mtbf) == (600.0, 7200.0)
    assert 0 < params.l1_cost < params.l2_latency + 1e-9 and params.solve_time > 0
    replayed = Recommender.default().recommend(params)
    assert (tuned["interval_s"], tuned["shared_every"]) == (replayed.interval, replayed.l2_every)
    after = [s for s in saves if s > tuned["step"]]
    assert all(s % 10 != 9 for s in after[:-1]) or tuned["interval_s"] < 0.05  # the step interval is gone
    assert after[-1] == 299  # the final checkpoint


def test_auto_in_yaml_takes_the_mtbfs_from_the_workflow_or_the_site(tmp_path: Path) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text(
        "name: a\ncheckpoint: {interval: auto, process_mtbf: 2h}\n"
        "members:\n  - {name: m, workload: mlp-digits, steps: 10}\n"
        "  - {name: n, workload: mlp-digits, steps: 10, checkpoint: {interval: auto, node_mtbf: 3d}}\n"
    )
    m, n = load_workflow(path).member_specs(None, node_mtbf_s=86400.0)
    assert (m.checkpoint.auto, m.checkpoint.interval_steps) == (True, 10)
    assert (m.checkpoint.process_mtbf_s, m.checkpoint.node_mtbf_s) == (7200.0, 86400.0)
    assert (n.checkpoint.process_mtbf_s, n.checkpoint.node_mtbf_s) == (7 * 86400.0, 3 * 86400.0)
    path.write_text(path.read_text().replace("process_mtbf: 2h", "process_mtbf: 0s"))
    with pytest.raises(Exception, match="process_mtbf must be longer than 0 s"):
        load_workflow(path)
