"""Hugging Face ``Trainer`` under DDP on two CPU ranks (gloo, started by ``torchrun`` as users start it),
trained from the resumable loader: every process SIGKILLed mid-epoch after a committed checkpoint, as
a node failure would, the resumed run starts at the committed data position, trains every sample
of each epoch once across the ranks, and ends at an uninterrupted two-rank run's weights bit for bit;
resumed on one process with the same global batch, it trains the same samples.
In one process, a Trainer that believes it is one of two ranks: its share of the global batch, the
layouts it cannot serve, and the resume step the ranks agree on."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from requires import require_module

transformers = require_module(
    "transformers", "transformers is not installed: pip install 'resilient-flows[transformers]'"
)

import hf_ddp_worker  # noqa: E402
import hf_ids  # noqa: E402
from conftest import python_env  # noqa: E402

from resilient_flows.checkpoint import Checkpointer, read_manifest, unflatten  # noqa: E402
from resilient_flows.errors import CheckpointError, ResilientFlowsError  # noqa: E402
from resilient_flows.integrations.transformers import _agreed_trainer_state, resilient_trainer  # noqa: E402
from resilient_flows.training import ResumableLoader  # noqa: E402

RANKS = 2
STEPS = hf_ddp_worker.STEPS
TORCHRUN = Path(sys.executable).with_name("torchrun")
HOLD_AT = 7  # global steps: checkpoints at 3 and 6 (save_steps=3); 7 is 3 batches into epoch 1
COMMITTED = 5  # our step of global step 6: 2 global batches of 4 into epoch 1
STEPS_PER_EPOCH = hf_ids.EXAMPLES // (RANKS * hf_ddp_worker.PER_RANK)


def torchrun(directory: Path, name: str, *hold_at: int) -> subprocess.Popen:
    """``torchrun`` of the worker in a session of its own (its ranks start sessions of their own)."""
    directory.mkdir(parents=True, exist_ok=True)
    argv = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(RANKS), hf_ddp_worker.__file__]
    env = {**python_env(), "HF_HUB_OFFLINE": "1"}
    with open(directory / f"{name}.log", "w") as log:
        return subprocess.Popen(
            [*argv, str(directory), name, *map(str, hold_at)], env=env, stdout=log, stderr=log, start_new_session=True
        )


def finished(launch: subprocess.Popen, directory: Path, name: str) -> None:
    assert launch.wait(timeout=240) == 0, (directory / f"{name}.log").read_text()[-4000:]


def held(launch: subprocess.Popen, directory: Path, name: str) -> list[dict]:
    """Each rank's report once every rank holds at ``HOLD_AT`` with its checkpoints committed."""
    paths = [directory / f"{name}-{rank}.held.json" for rank in range(RANKS)]
    deadline = time.monotonic() + 240
    while not all(path.exists() for path in paths):
        assert launch.poll() is None, (directory / f"{name}.log").read_text()[-4000:]
        assert time.monotonic() < deadline, "the ranks never reached the step to be killed at"
        time.sleep(0.1)
    time.sleep(0.1)  # the reports are small and written in one call: complete once present
    return [json.loads(path.read_text()) for path in paths]


def kill_every_process(launch: subprocess.Popen, ranks: list[dict]) -> None:
    """SIGKILL the launcher and each rank with its loader workers (a rank leads its own session)."""
    os.killpg(launch.pid, signal.SIGKILL)
    for rank in ranks:
        os.killpg(rank["pid"], signal.SIGKILL)
    launch.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{rank['pid']}").exists() for rank in ranks):
        assert time.monotonic() < deadline, "a killed rank is still there"
        time.sleep(0.05)


def steps_of(directory: Path, name: str, rank: int) -> dict[int, list[int]]:
    lines = (directory / f"{name}-{rank}.jsonl").read_text().splitlines()
    return {line["step"]: line["ids"] for line in map(json.loads, lines)}


def report(directory: Path, name: str, rank: int, suffix: str = "json") -> dict:
    return json.loads((directory / f"{name}-{rank}.{suffix}").read_text())


@pytest.mark.slow
def test_every_rank_killed_mid_epoch_resumes_at_the_committed_position_to_the_uninterrupted_weights(
    tmp_path: Path,
) -> None:
    full_dir, run_dir = tmp_path / "full", tmp_path / "run"
    full = torchrun(full_dir, "full")
    first = torchrun(run_dir, "first", HOLD_AT)  # side by side: the machine has cores to share
    ranks = held(first, run_dir, "first")
    assert [rank["committed"] for rank in ranks] == [COMMITTED] * RANKS
    kill_every_process(first, ranks)
    shutil.copytree(run_dir / "out", tmp_path / "one" / "out")  # for a resume on one rank, below
    finished(full, full_dir, "full")
    second = torchrun(run_dir, "second")
    finished(second, run_dir, "second")

    saved = read_manifest(run_dir / "out" / "checkpoints" / f"step-{COMMITTED:08d}").skeleton
    position = unflatten(dict(saved["dict"])["data"], {})["train"]
    assert (position["epoch"], position["position"]) == (1, 8)
    for rank in range(RANKS):
        start = report(run_dir, "second", rank, "start.json")
        assert start == {"global_step": COMMITTED + 1, **position}

    trained: list[dict[int, list[int]]] = []
    for rank in range(RANKS):
        uninterrupted = steps_of(full_dir, "full", rank)
        killed, resumed = steps_of(run_dir, "first", rank), steps_of(run_dir, "second", rank)
        assert sorted(killed) == list(range(HOLD_AT)) and sorted(resumed) == list(range(COMMITTED + 1, STEPS))
        kept = {step: ids for step, ids in killed.items() if step <= COMMITTED} | resumed
        assert kept == uninterrupted, f"rank {rank}"
        trained.append(kept)
    for epoch_start in range(0, STEPS - STEPS_PER_EPOCH + 1, STEPS_PER_EPOCH):
        epoch = [
            i for kept in trained for step in range(epoch_start, epoch_start + STEPS_PER_EPOCH) for i in kept[step]
        ]
        assert sorted(epoch) == list(range(hf_ids.EXAMPLES)), f"epoch from step {epoch_start}"

    digests = {
        report(directory, name, rank)["digest"]
        for directory, name in ((full_dir, "full"), (run_dir, "second"))
        for rank in range(RANKS)
    }
    assert len(digests) == 1

    # The same checkpoint resumed on one process, with the same global batch: the same samples.
    one = hf_ids.make_trainer(tmp_path / "one" / "out", STEPS, hf_ddp_worker.SAVE_STEPS, batch=2 * RANKS)
    one.train(resume_from_checkpoint=resilient_trainer(one).last_checkpoint())
    per_rank = [steps_of(full_dir, "full", rank) for rank in range(RANKS)]
    assert one.ids == {step: [i for ids in per_rank for i in ids[step]] for step in range(COMMITTED + 1, STEPS)}


# ---------------------------------------------------------------------- one process, as rank 1 of 2


@pytest.fixture
def rank_1_of_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transformers.TrainingArguments, "world_size", property(lambda self: 2))
    monkeypatch.setattr(transformers.TrainingArguments, "process_index", property(lambda self: 1))


@pytest.mark.parametrize(("split_batches", "global_batch"), [(False, 4), (True, 2)])
def test_each_rank_takes_its_share_of_the_global_batch(
    tmp_path: Path, rank_1_of_2: None, split_batches: bool, global_batch: int
) -> None:
    trainer = hf_ids.make_trainer(tmp_path, steps=2, save_steps=1, batch=2)
    trainer.args.accelerator_config.split_batches = split_batches
    trainer.args.dataloader_num_workers = 0
    resilient_trainer(trainer, resumable_data=True)
    loader = trainer.get_train_dataloader()
    assert isinstance(loader, ResumableLoader)
    assert (loader.batch_size, loader.rank, loader.world_size) == (global_batch, 1, 2)
    whole = ResumableLoader(
        trainer.train_dataset, global_batch, shuffle=True, seed=hf_ids.SEED, collate_fn=hf_ids.masking_collator
    )
    batch = next(iter(whole))["index"].tolist()
    assert next(iter(loader))["index"].tolist() == batch[global_batch // 2 :]


def test_layouts_whose_ranks_cannot_share_each_batch_keep_trainers_loader_or_are_refused(
    tmp_path: Path, rank_1_of_2: None
) -> None:
    odd = hf_ids.make_trainer(tmp_path, steps=2, save_steps=1, batch=2)
    odd.train_dataset = hf_ids.NoisyTokenIds(17, hf_ids.SEED)  # the epoch ends on a global batch of 1
    with pytest.raises(ResilientFlowsError, match=r"a global batch of 1 sample\(s\) cannot give each of 2 ranks"):
        resilient_trainer(odd, resumable_data=True)
    resilient_trainer(odd)  # the default keeps Trainer's loader
    assert not isinstance(odd.get_train_dataloader(), ResumableLoader)
    dropped = hf_ids.make_trainer(tmp_path, steps=2, save_steps=1, batch=2)
    dropped.train_dataset, dropped.args.dataloader_drop_last = odd.train_dataset, True
    resilient_trainer(dropped, resumable_data=True)
    assert len(dropped.get_train_dataloader()) == 4  # the 17th sample is dropped, as Trainer would

    tensor_parallel = hf_ids.make_trainer(tmp_path, steps=2, save_steps=1, batch=2)
    tensor_parallel.model._tp_size = 2
    with pytest.raises(ResilientFlowsError, match=r"tensor parallelism \(2 ranks\) feeds several ranks the same batch"):
        resilient_trainer(tensor_parallel, resumable_data=True)


class TwoRanks:
    """Rank 0 of two, the other rank's contribution to each gather given."""

    rank, size = 0, 2

    def __init__(self, other: object) -> None:
        self.other = other

    def allgather(self, obj: object) -> list[object]:
        return [obj, self.other]


def test_the_ranks_resume_from_the_newest_step_any_of_them_can_read(tmp_path: Path) -> None:
    with Checkpointer(tmp_path / "here") as here:
        here.save(2, {"extra": {"trainer_state": {"global_step": 3}}})
    other = (5, {"global_step": 6})
    here.comm = TwoRanks(other)
    assert _agreed_trainer_state(here) == other  # the other rank's node kept a newer one
    here.comm = TwoRanks((1, {"global_step": 2}))
    assert _agreed_trainer_state(here) == (2, {"global_step": 3})
    with Checkpointer(tmp_path / "empty") as empty:
        pass
    empty.comm = TwoRanks(other)
    assert _agreed_trainer_state(empty) == other  # this rank's node lost its tier
    empty.comm = TwoRanks("no readable checkpoint there")
    with pytest.raises(CheckpointError, match=r"no readable checkpoint in .*empty"):
        _agreed_trainer_state(empty)


def test_a_rank_that_sees_no_checkpoint_resumes_when_another_rank_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = hf_ids.make_trainer(tmp_path, steps=2, save_steps=1)
    resilient = resilient_trainer(trainer)
    monkeypatch.setattr(resilient.checkpointer, "comm", TwoRanks(None))
    assert resilient.last_checkpoint() is None  # no rank sees one: a first start everywhere
    monkeypatch.setattr(resilient.checkpointer, "comm", TwoRanks(5))
    assert resilient.last_checkpoint() is not None  # the other rank's node-local tier holds step 5
