"""Exploration campaigns: expansion, Ray-style explore steps, and PBT decisions that exploit by cloning."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from resilient_flows.cli import main
from resilient_flows.rundir._metrics import MetricsReader
from resilient_flows.training import MemberSpec, read_events
from resilient_flows.training._members import read_spec, register_member
from resilient_flows.workflow._explore import PBTController, campaign_points
from resilient_flows.workflow._status import MemberStatus
from resilient_flows.workflow.schema import ExploreConfig, HyperparameterSpace

SPACE = {"lr": {"range": [0.001, 0.3], "log": True}, "momentum": {"values": [0.0, 0.5, 0.9]}}


def campaign(**changes) -> ExploreConfig:
    base = {"name": "p", "strategy": "pbt", "workload": "mlp-digits", "steps": 400, "hyperparameters": SPACE}
    return ExploreConfig.model_validate({**base, **changes})


def test_random_and_pbt_populations_are_deterministic_and_inside_the_space() -> None:
    points = campaign_points(campaign(population=5, seed=3))
    assert points == campaign_points(campaign(population=5, seed=3, strategy="random"))
    assert len(points) == 5 and all(0.001 <= p["lr"] <= 0.3 and p["momentum"] in (0.0, 0.5, 0.9) for p in points)
    grid = campaign(strategy="grid", hyperparameters={"lr": {"values": [0.1, 0.01]}, "momentum": {"values": [0, 0.9]}})
    assert campaign_points(grid) == [
        {"lr": 0.1, "momentum": 0},
        {"lr": 0.1, "momentum": 0.9},
        {"lr": 0.01, "momentum": 0},
        {"lr": 0.01, "momentum": 0.9},
    ]


def test_explore_steps_scale_and_clip_continuous_values_and_move_choices_to_a_neighbour() -> None:
    rng = random.Random(0)
    lr = HyperparameterSpace(range=(0.001, 0.3), log=True)
    assert {round(lr.perturb(0.1, rng, (0.8, 1.2)), 6) for _ in range(50)} == {0.08, 0.12}
    assert lr.perturb(0.29, random.Random(1), (1.2, 1.2)) == 0.3
    momentum = HyperparameterSpace(values=[0.0, 0.5, 0.9])
    assert {momentum.perturb(0.5, rng, (0.8, 1.2)) for _ in range(50)} == {0.0, 0.9}
    assert {momentum.perturb(0.9, rng, (0.8, 1.2)) for _ in range(50)} == {0.5, 0.9}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("strategy: grid\n", r"strategy grid needs 'values' for every hyperparameter"),
        ("interval: 500\n", r"pbt interval 500 must be shorter than steps 400"),
        ("hyperparameters: {lr: {values: [1], range: [0, 1]}}\n", r"give 'values' \(choices\) or 'range'"),
        ("fraction: 0.9\n", r"fraction: Input should be less than or equal to 0.5"),
    ],
)
def test_bad_campaigns_are_refused_with_the_key(tmp_path: Path, capsys, text: str, message: str) -> None:
    body = "name: p\nstrategy: pbt\nworkload: mlp-digits\nsteps: 400\nhyperparameters: {lr: {range: [0.001, 0.3]}}\n"
    fields = dict(line.split(": ", 1) for line in body.splitlines())
    fields.update(dict([text.strip().split(": ", 1)]))
    entry = "\n".join(f"    {k}: {v}" for k, v in fields.items()).replace("    name", "  - name", 1)
    path = tmp_path / "wf.yaml"
    path.write_text(f"name: w\nexplore:\n{entry}\n")
    assert main(["validate", str(path)]) == 2
    assert __import__("re").search(message, capsys.readouterr().err)


def status_with_curve(tmp_path: Path, name: str, losses: dict[int, float], state: str = "running") -> MemberStatus:
    path = tmp_path / "members" / name / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "attempt": 1, "loss": v}) + "\n" for s, v in losses.items()))
    reader = MetricsReader(path)
    reader.update()
    return MemberStatus(name, 400, state=state, metrics=reader)


def test_pbt_replaces_the_bottom_member_by_a_perturbed_clone_of_a_running_top_member(tmp_path: Path) -> None:
    config = campaign(population=3, interval=100, window=10, resample_probability=0.0)
    specs = [
        MemberSpec(name=f"p-{i}", workload="mlp-digits", params={"lr": 0.1, "momentum": 0.5}, steps=400, seed=i)
        for i in range(3)
    ]
    for spec in specs:
        register_member(tmp_path, spec)
    controller = PBTController(config, tmp_path, specs)
    statuses = {
        "p-0": status_with_curve(tmp_path, "p-0", {s: 0.5 for s in range(105)}),  # the best
        "p-1": status_with_curve(tmp_path, "p-1", {s: 1.0 for s in range(102)}),
        "p-2": status_with_curve(tmp_path, "p-2", {s: 2.0 for s in range(95)}),  # not at step 100 yet
    }
    controller.update(specs, statuses)  # at step 100 p-0 and p-1 are scored: p-1 is the bottom quarter
    statuses["p-2"] = status_with_curve(tmp_path, "p-2", {s: 2.0 for s in range(101)})
    controller.update(specs, statuses)  # p-2 reaches step 100, below p-0 (p-1 is retired, out of the ranking)
    exploited = [e for e in read_events(tmp_path) if e["kind"] == "exploited"]
    assert [(e["member"], e["donor"], e["step"]) for e in exploited] == [("p-1", "p-0", 100), ("p-2", "p-0", 100)]
    event = exploited[1]
    clone = read_spec(tmp_path, event["clone"])
    assert clone.parent.member == "p-0" and clone.params["lr"] in (pytest.approx(0.08), pytest.approx(0.12))
    assert clone.params["momentum"] in (0.0, 0.9)
    controller.update(specs, statuses)
    assert len([e for e in read_events(tmp_path) if e["kind"] == "exploited"]) == 2  # each boundary once
    control = json.loads((tmp_path / "members/p-2/control.json").read_text())
    assert control == {"action": "retire", "reason": f"pbt: replaced by {event['clone']}, a clone of p-0"}


@pytest.mark.slow
def test_a_pbt_campaign_retires_members_and_its_clones_finish(tmp_path: Path, capsys) -> None:
    path = tmp_path / "wf.yaml"
    # Two members that run side by side: seed 4 gives p-0 lr 1e-5 (hopeless) and p-1 lr 0.05.
    path.write_text(
        "name: e\ncheckpoint: {interval: 100}\nexplore:\n"
        "  - {name: p, strategy: pbt, workload: cnn-digits, steps: 1200, population: 2, interval: 200,"
        " resample_probability: 0, seed: 4, hyperparameters: {lr: {values: [0.00001, 0.05]}}}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "exploration campaigns" in out
    events = list(read_events(run_dir))
    exploited = [e for e in events if e["kind"] == "exploited"]
    assert exploited[0]["member"] == "p-0" and exploited[0]["donor"] == "p-1"
    assert exploited[0]["overrides"] == {"lr": 0.05} or exploited[0]["overrides"] == {"lr": 1e-05}
    for e in exploited:
        retired = json.loads((run_dir / "members" / e["member"] / "result.json").read_text())
        assert retired["retired"].startswith(f"pbt: replaced by {e['clone']}")
        clone = json.loads((run_dir / "members" / e["clone"] / "result.json").read_text())
        assert (clone["step"] == 1199 and "retired" not in clone) or clone["retired"].startswith("pbt")
        (cloned,) = [c for c in events if c["kind"] == "cloned" and c["member"] == e["clone"]]
        assert cloned["parent"] == e["donor"] and cloned["overrides"] == e["overrides"]
