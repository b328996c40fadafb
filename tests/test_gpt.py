"""The flagship workload (``resilient_flows.examples.gpt``, ``workflows/gpt.yaml``): its sizes' exact
parameter counts, its learning-rate curve and the scheduler's resume on it, its corpus, and members
that end with an uninterrupted run's weights (their loader resumed mid-epoch) after an error and
after a SIGKILL in a workflow."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from resilient_flows.checkpoint import CheckpointConfig, read_checkpoint
from resilient_flows.examples.gpt import GPT, SIZES, Params, evaluate, parameter_count
from resilient_flows.examples.gpt.data import corpus, split
from resilient_flows.examples.gpt.schedule import lr_factor, warmup_cosine
from resilient_flows.examples.gpt.train import build_model, held_out_loss
from resilient_flows.training import FaultSpec, MemberSpec, run_member

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = "resilient_flows.examples.gpt:train"


# ---------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    ("size", "count"),
    [("tiny", 437_760), ("small", 3_257_856), ("medium", 25_482_240), ("large", 85_645_824)],
)
def test_each_size_has_its_parameter_count(size: str, count: int) -> None:
    with torch.device("meta"):  # the large one without 340 MB of weights
        model = GPT(SIZES[size])
    assert parameter_count(SIZES[size]) == sum(p.numel() for p in model.parameters()) == count


def test_the_output_layer_is_the_embedding_so_a_state_dict_has_no_alias() -> None:
    model = GPT(SIZES["tiny"])
    keys = list(model.state_dict())
    assert "wte.weight" in keys and not any("head" in key for key in keys)
    assert model(torch.zeros(2, 64, dtype=torch.long)).shape == (2, 64, 256)


# ---------------------------------------------------------------------- schedule


def test_the_rate_warms_up_linearly_then_decays_on_a_cosine_to_its_floor() -> None:
    factors = [lr_factor(step, warmup=4, total=13, floor=0.1) for step in range(13)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert factors[4] == 1.0  # the cosine starts at the peak
    assert factors[8] == pytest.approx(0.55)  # half way: (1 + floor) / 2
    assert factors[12] == pytest.approx(0.1)  # the last step
    assert all(a >= b for a, b in itertools.pairwise(factors[3:]))
    assert lr_factor(20, warmup=4, total=13, floor=0.1) == pytest.approx(0.1)  # past the end: the floor
    assert lr_factor(0, warmup=0, total=1, floor=0.0) == 1.0


def test_a_scheduler_restored_from_its_json_state_continues_on_the_same_curve() -> None:
    def fresh() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        return optimizer, warmup_cosine(optimizer, warmup=3, total=10, floor=0.0)

    optimizer, scheduler = fresh()
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    optimizer, scheduler = fresh()
    for _ in range(6):
        optimizer.step()
        scheduler.step()
    saved = json.loads(json.dumps(scheduler.state_dict()))  # a manifest holds it as JSON
    saved_groups = json.loads(json.dumps(optimizer.state_dict()["param_groups"]))
    optimizer, scheduler = fresh()
    scheduler.load_state_dict(saved)
    for group, saved_group in zip(optimizer.param_groups, saved_groups, strict=True):
        group["lr"] = saved_group["lr"]
    resumed = [optimizer.param_groups[0]["lr"]]
    for _ in range(3):
        optimizer.step()
        scheduler.step()
        resumed.append(optimizer.param_groups[0]["lr"])
    assert resumed == rates[6:]
    assert rates[:3] == [1 / 3, 2 / 3, 1.0] and rates[9] == pytest.approx(0.0, abs=1e-12)


# ---------------------------------------------------------------------- data


def test_the_corpus_is_the_python_reference_with_a_held_out_tenth() -> None:
    train_bytes, held_out = split()
    assert len(train_bytes) + len(held_out) == len(corpus()) > 100_000
    assert len(held_out) == len(corpus()) - int(len(corpus()) * 0.9)
    assert b"while" in corpus()


# ---------------------------------------------------------------------- members


def _spec(name: str, steps: int, faults: tuple[FaultSpec, ...] = ()) -> MemberSpec:
    return MemberSpec(
        name=name,
        workload=WORKLOAD,
        evaluate="resilient_flows.examples.gpt:evaluate",
        params={"eval_windows": 8},
        steps=steps,
        seed=5,
        checkpoint=CheckpointConfig(interval_steps=10),
        faults=faults,
    )


def test_a_fresh_model_predicts_about_uniformly_and_evaluate_reads_a_checkpoint(tmp_path: Path) -> None:
    params = {**Params().model_dump(), "eval_windows": 8}
    torch.manual_seed(0)
    fresh = held_out_loss(build_model(params), 8)
    assert fresh["eval_loss"] == pytest.approx(math.log(256), abs=0.3)  # small logits: near a uniform guess
    assert fresh["eval_bits_per_byte"] == pytest.approx(fresh["eval_loss"] / math.log(2))
    result = run_member(_spec("m", 12).to_dict(), str(tmp_path))
    step, state = read_checkpoint(tmp_path / "members" / "m" / "checkpoints")
    assert step == 11
    assert evaluate({**params, "steps": 12}, state)["eval_loss"] == result["eval_loss"] < fresh["eval_loss"]


@pytest.mark.slow  # two members' runs with their loader workers: 23-40 s on the loaded 2-core machine
def test_a_member_that_failed_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    reference = run_member(_spec("m", 20).to_dict(), str(tmp_path / "reference"))
    spec = _spec("m", 20, faults=(FaultSpec("error", 13),))
    with pytest.raises(RuntimeError, match="injected error"):
        run_member(spec.to_dict(), str(tmp_path / "faulted"))
    resumed = run_member(spec.to_dict(), str(tmp_path / "faulted"))
    assert resumed["attempts"] == 2
    assert (resumed["epoch"], resumed["sample"]) == (0, 20 * 16)
    assert resumed["digest"] == reference["digest"]
    assert resumed["eval_loss"] == reference["eval_loss"]


@pytest.mark.slow
@pytest.mark.timeout(480)  # a runner start and a retry take minutes on a loaded 2-core machine
def test_the_workflow_with_a_member_killed_mid_epoch_ends_with_uninterrupted_weights(tmp_path: Path) -> None:
    """``workflows/gpt.yaml`` shortened: its default size, two members, gpt-1 SIGKILLed after step
    70 of 120 (between checkpoints, in its first epoch of 409 batches)."""
    from resilient_flows.cli import main
    from resilient_flows.workflow import load_workflow

    document = yaml.safe_load((REPO / "workflows" / "gpt.yaml").read_text())
    document["checkpoint"]["interval"] = 25
    document["members"][0]["steps"] = 120
    document["faults"] = [{"kill": "gpt-1", "at_step": 70}]
    document["analytics"] = [{"when": {"member": "gpt-0", "step": 60}}]
    (tmp_path / "gpt.yaml").write_text(yaml.safe_dump(document))
    assert main(["run", str(tmp_path / "gpt.yaml"), "--run-dir", str(tmp_path / "run")]) == 0

    members = tmp_path / "run" / "members"
    results = {m: json.loads((members / m / "result.json").read_text()) for m in ("gpt-0", "gpt-1")}
    killed = next(s for s in load_workflow(tmp_path / "gpt.yaml").member_specs(None) if s.name == "gpt-1")
    reference = run_member(replace(killed, faults=()).to_dict(), str(tmp_path / "reference"))
    assert results["gpt-1"]["attempts"] == 2
    assert results["gpt-1"]["digest"] == reference["digest"]
    assert results["gpt-1"]["eval_loss"] == reference["eval_loss"] < math.log(256)
    assert results["gpt-0"]["attempts"] == 1 and results["gpt-0"]["digest"] != reference["digest"]
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    resumed = [e for e in events if e["kind"] == "resumed" and e["member"] == "gpt-1"]
    assert len(resumed) == 1 and resumed[0]["step"] in (24, 49)  # 49 unless its write lagged 21 steps
    analytics = [e for e in events if e["kind"] == "analytics"]
    assert len(analytics) == 1 and set(analytics[0]["members"]) == {"gpt-0", "gpt-1"}
    assert analytics[0]["members"]["gpt-0"]["eval_loss"] < math.log(256)
    assert analytics[0]["members"]["gpt-1"].get("eval_loss", 0.0) < math.log(256)  # or none committed yet
