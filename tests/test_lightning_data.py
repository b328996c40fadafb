"""A ResumableLoader under Lightning: a fit that fails or is killed between checkpoints, mid-epoch,
with two loader workers, resumes to the uninterrupted run's batches and weights bit for bit; on
two DDP ranks each rank trains its share of the same global batches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from requires import require_module

require_module("pytorch_lightning", "pytorch-lightning is not installed: pip install 'resilient-flows[lightning]'")

import lightning_ids  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
from conftest import python_env  # noqa: E402
from pytorch_lightning.callbacks import ModelCheckpoint  # noqa: E402

from resilient_flows.checkpoint import CheckpointConfig  # noqa: E402
from resilient_flows.errors import ResilientFlowsError  # noqa: E402
from resilient_flows.integrations.lightning import ResilientCallback, ResilientCheckpointIO  # noqa: E402
from resilient_flows.training import MemberSpec, ResumableLoader, RunContract, read_events  # noqa: E402
from resilient_flows.training._members import register_member  # noqa: E402
from resilient_flows.training._spec import FaultSpec  # noqa: E402

SCRIPT = Path(lightning_ids.__file__)
STEPS_PER_EPOCH = -(-lightning_ids.SAMPLES // lightning_ids.BATCH)


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def steps_of(lines: list[dict[str, Any]]) -> dict[int, list[int]]:
    """Each step's global batch: the ranks' shares in rank order."""
    shares: dict[int, dict[int, list[int]]] = {}
    for line in lines:
        shares.setdefault(line["step"], {})[line["rank"]] = line["ids"]
    return {step: [i for rank in sorted(by_rank) for i in by_rank[rank]] for step, by_rank in shares.items()}


def kept(lines: list[dict[str, Any]], resumed_from: int) -> dict[int, list[int]]:
    """What counts of two attempts: the first's steps up to the checkpoint the second resumed from,
    then the second's; a step trained by both would be a sample trained twice."""
    first = steps_of([line for line in lines if line["attempt"] == 1 and line["step"] <= resumed_from])
    second = steps_of([line for line in lines if line["attempt"] == 2])
    assert not first.keys() & second.keys(), "a step trained twice"
    return {**first, **second}


def assert_every_epoch_covers_the_dataset_once(steps: dict[int, list[int]]) -> None:
    for first in range(0, max(steps) + 1 - STEPS_PER_EPOCH, STEPS_PER_EPOCH):
        epoch = [i for step in range(first, first + STEPS_PER_EPOCH) for i in steps[step]]
        assert sorted(epoch) == list(range(lightning_ids.SAMPLES))


# ------------------------------------------------------------------------------- in this process


class Failing(lightning_ids.Recorded):
    """Raises before training global step ``fail_at``: an error between checkpoints."""

    def __init__(self, record: str, attempt: int, fail_at: int | None) -> None:
        super().__init__(record, attempt)
        self.fail_at = fail_at

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.fail_at:
            raise RuntimeError("injected between checkpoints")
        return super().training_step(batch, batch_idx)


def fit(directory: Path, record: Path, attempt: int, fail_at: int | None = None) -> Failing:
    model = Failing(str(record), attempt, fail_at)
    trainer = pl.Trainer(
        max_steps=20,
        accelerator="cpu",
        plugins=[ResilientCheckpointIO(directory)],
        callbacks=[ModelCheckpoint(directory, every_n_train_steps=5, save_last=True), ResilientCallback()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = ResumableLoader(lightning_ids.Noisy(), lightning_ids.BATCH, shuffle=True, seed=3, num_workers=2)
    try:
        trainer.fit(model, loader, ckpt_path="last")
    except RuntimeError as exc:
        assert str(exc) == "injected between checkpoints"
    return model


def test_a_fit_that_fails_mid_epoch_resumes_to_the_batches_and_weights_of_an_uninterrupted_one(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plain = fit(tmp_path / "plain", tmp_path / "plain.jsonl", 1)
        fit(tmp_path / "run", tmp_path / "run.jsonl", 1, fail_at=13)  # checkpoints after global steps 5 and 10
        resumed = fit(tmp_path / "run", tmp_path / "run.jsonl", 2)
    finally:
        torch.set_num_threads(threads)
    uninterrupted = steps_of(records(tmp_path / "plain.jsonl"))
    assert sorted(uninterrupted) == list(range(20))
    assert_every_epoch_covers_the_dataset_once(uninterrupted)
    lines = records(tmp_path / "run.jsonl")
    assert sorted({line["step"] for line in lines if line["attempt"] == 2}) == list(range(10, 20))  # mid-epoch 1
    assert kept(lines, resumed_from=9) == uninterrupted  # no sample trained twice, none skipped
    for mine, theirs in zip(resumed.parameters(), plain.parameters(), strict=True):
        assert torch.equal(mine, theirs)


def test_each_epoch_starts_at_its_first_batch_when_lightning_ends_epochs_early(tmp_path: Path) -> None:
    record = tmp_path / "ids.jsonl"
    trainer = pl.Trainer(
        max_steps=9,
        limit_train_batches=3,  # 3 of each epoch's 8 batches
        accelerator="cpu",
        plugins=[ResilientCheckpointIO(tmp_path)],
        callbacks=[ResilientCallback()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(lightning_ids.Recorded(str(record), 1), ResumableLoader(lightning_ids.Noisy(), 8, shuffle=True, seed=3))
    whole = ResumableLoader(lightning_ids.Noisy(), 8, shuffle=True, seed=3)
    epochs = []
    for epoch in range(3):
        whole.set_epoch(epoch)
        epochs.append([batch[2].tolist() for batch in whole])
    assert steps_of(records(record)) == {3 * e + b: epochs[e][b] for e in range(3) for b in range(3)}


def test_a_loader_whose_global_batch_cannot_feed_every_rank_is_refused() -> None:
    loader = ResumableLoader(list(range(10)), 2)
    with pytest.raises(ResilientFlowsError, match="a global batch of 2 sample"):
        loader.set_ranks(0, 3)
    with pytest.raises(ResilientFlowsError, match="rank 2 is not one of 2 ranks"):
        loader.set_ranks(2, 2)


# ------------------------------------------------------------------------------- as workflow members


def start(run_dir: Path, name: str, attempt: int, faults: tuple[FaultSpec, ...] = (), devices: int = 1) -> int:
    spec = MemberSpec(
        name=name,
        workload="",
        params={},
        seed=3,
        steps=20,
        checkpoint=CheckpointConfig(interval_steps=5, keep=2),
        faults=faults,
        command=[sys.executable, str(SCRIPT)],
    )
    if attempt == 1:
        register_member(run_dir, spec)
    (run_dir / "members" / name / "attempts").write_text(str(attempt))
    env = {**python_env(), **RunContract.for_member(spec, run_dir, attempt).to_env()}
    argv = [sys.executable, str(SCRIPT), str(run_dir / f"{name}.jsonl"), "--devices", str(devices)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=SCRIPT.parent)
    assert done.returncode in (0, -9), done.stderr[-3000:]
    return done.returncode


def digest(run_dir: Path, name: str) -> str:
    return json.loads((run_dir / "members" / name / "command-result.json").read_text())["digest"]


def resumed_from(run_dir: Path, name: str) -> int:
    (event,) = [e for e in read_events(run_dir) if e["kind"] == "resumed" and e["member"] == name]
    return event["step"]


@pytest.mark.slow
def test_a_member_killed_mid_epoch_resumes_to_the_uninterrupted_weights_and_on_two_ddp_ranks_to_its_batches(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    assert start(run_dir, "plain", 1) == 0
    uninterrupted = steps_of(records(run_dir / "plain.jsonl"))
    assert_every_epoch_covers_the_dataset_once(uninterrupted)
    for name in ("killed", "grown"):
        assert start(run_dir, name, 1, faults=(FaultSpec("kill", 13),)) == -9  # SIGKILLed after step 13
    assert start(run_dir, "killed", 2) == 0
    step = resumed_from(run_dir, "killed")
    assert step in (4, 9)  # 9 (global step 10, mid-epoch 1) unless its write was still in flight at the kill
    assert kept(records(run_dir / "killed.jsonl"), step) == uninterrupted
    assert digest(run_dir, "killed") == digest(run_dir, "plain")

    assert start(run_dir, "grown", 2, devices=2) == 0  # the same checkpoint on two ranks: the same global batches
    lines = records(run_dir / "grown.jsonl")
    second = [line for line in lines if line["attempt"] == 2]
    for step in {line["step"] for line in second}:  # each rank half of the global batch, none shared
        halves = [set(line["ids"]) for line in second if line["step"] == step]
        assert len(halves) == 2 and not halves[0] & halves[1]
    assert kept(lines, resumed_from(run_dir, "grown")) == uninterrupted
    result = json.loads((run_dir / "members" / "grown" / "command-result.json").read_text())
    assert result["ranks_agree"] is True and result["step"] == 19
