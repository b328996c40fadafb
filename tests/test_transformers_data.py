"""Hugging Face ``Trainer`` on a ResumableLoader: with two loader workers, random augmentation as
samples load and a collator that masks at random, a run resumed mid-epoch (after a stop, or
killed between checkpoints) trains the uninterrupted run's samples with its losses, to its weights
bit for bit, without reading the batches it skips; the settings it cannot serve keep Trainer's loader."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from requires import require_module

transformers = require_module(
    "transformers", "transformers is not installed: pip install 'resilient-flows[transformers]'"
)

import hf_ids  # noqa: E402
from conftest import python_env  # noqa: E402

from resilient_flows.checkpoint import CheckpointConfig  # noqa: E402
from resilient_flows.errors import CheckpointError, ResilientFlowsError  # noqa: E402
from resilient_flows.integrations.transformers import resilient_trainer  # noqa: E402
from resilient_flows.training import MemberSpec, ResumableLoader, RunContract, read_events, state_digest  # noqa: E402
from resilient_flows.training._members import register_member  # noqa: E402
from resilient_flows.training._spec import FaultSpec  # noqa: E402

STEPS_PER_EPOCH = hf_ids.EXAMPLES // 4


class SignalAt(transformers.TrainerCallback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            signal.raise_signal(signal.SIGUSR1)


def kept(first: dict[int, list[int]], second: dict[int, list[int]], resumed_from: int) -> dict[int, list[int]]:
    """The steps that count: the first attempt's up to its checkpoint, then the second's."""
    before = {step: ids for step, ids in first.items() if step <= resumed_from}
    assert not before.keys() & second.keys(), "a step trained twice"
    return {**before, **second}


def assert_every_epoch_covers_the_dataset_once(steps: dict[int, list[int]]) -> None:
    for first in range(0, max(steps) + 1 - STEPS_PER_EPOCH, STEPS_PER_EPOCH):
        epoch = [i for step in range(first, first + STEPS_PER_EPOCH) for i in steps[step]]
        assert sorted(epoch) == list(range(hf_ids.EXAMPLES))


def test_a_run_stopped_mid_epoch_resumes_at_the_next_sample_with_the_same_losses_and_weights(tmp_path: Path) -> None:
    full = hf_ids.make_trainer(tmp_path / "full", steps=10, save_steps=4)
    resilient_trainer(full)
    full.train()
    assert_every_epoch_covers_the_dataset_once(full.ids)

    stopped = hf_ids.make_trainer(tmp_path / "run", steps=10, save_steps=4, callbacks=[SignalAt(6)])
    first = resilient_trainer(stopped)
    stopped.train(resume_from_checkpoint=first.last_checkpoint())
    assert (first.stopped, stopped.state.global_step) == ("signal SIGUSR1", 6)  # 2 batches into epoch 1

    resumed = hf_ids.make_trainer(tmp_path / "run", steps=10, save_steps=4)
    second = resilient_trainer(resumed)
    resumed.train(resume_from_checkpoint=second.last_checkpoint())
    loader = resumed.callback_handler.train_dataloader
    assert isinstance(loader, ResumableLoader) and loader.loader.num_workers == 2  # nothing skipped: no wrapper
    assert min(resumed.ids) == 6 and kept(stopped.ids, resumed.ids, 5) == full.ids
    assert resumed.losses == {step: full.losses[step] for step in range(6, 10)}  # augmentation and masks too
    assert state_digest(resumed.model) == state_digest(full.model)


def test_trainers_it_cannot_serve_keep_their_own_loader_or_are_refused(tmp_path: Path) -> None:
    grouped = hf_ids.make_trainer(tmp_path, steps=2, save_steps=1)
    grouped.args.train_sampling_strategy = "group_by_length"
    with pytest.raises(ResilientFlowsError, match=r"group_by_length.* has an order of its own"):
        resilient_trainer(grouped, resumable_data=True)

    class OwnLoader(hf_ids.IdsTrainer):
        def get_train_dataloader(self):
            return super().get_train_dataloader()

    own = hf_ids.make_trainer(tmp_path, steps=2, save_steps=1, cls=OwnLoader)
    resilient_trainer(own)  # kept, not refused: the default serves only what it can
    assert not isinstance(own.get_train_dataloader(), ResumableLoader)
    declined = hf_ids.make_trainer(tmp_path, steps=2, save_steps=1)
    resilient_trainer(declined, resumable_data=False)
    assert not isinstance(declined.get_train_dataloader(), ResumableLoader)


# ---------------------------------------------------------------------- as a workflow member


def start(run_dir: Path, name: str, attempt: int, faults: tuple[FaultSpec, ...] = ()) -> int:
    spec = MemberSpec(
        name=name,
        workload="",
        params={},
        seed=hf_ids.SEED,
        steps=10,
        checkpoint=CheckpointConfig(interval_steps=3, keep=2),
        faults=faults,
        command=[sys.executable, hf_ids.__file__],
    )
    if attempt == 1:
        register_member(run_dir, spec)
    (run_dir / "members" / name / "attempts").write_text(str(attempt))
    env = {**python_env(), **RunContract.for_member(spec, run_dir, attempt).to_env(), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, hf_ids.__file__, str(run_dir / name / "record.jsonl")]
    (run_dir / name).mkdir(parents=True, exist_ok=True)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, -9), done.stderr[-3000:]
    return done.returncode


def by_attempt(run_dir: Path, name: str, attempt: int) -> dict[int, list[int]]:
    lines = [json.loads(line) for line in (run_dir / name / "record.jsonl").read_text().splitlines()]
    return {line["step"]: line["ids"] for line in lines if line["attempt"] == attempt}


@pytest.mark.slow
def test_a_member_killed_between_checkpoints_mid_epoch_ends_at_the_uninterrupted_weights(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert start(run_dir, "plain", 1) == 0
    assert start(run_dir, "killed", 1, faults=(FaultSpec("kill", 6),)) == -9  # SIGKILLed after step 6
    assert start(run_dir, "killed", 2) == 0
    (resumed,) = [e for e in read_events(run_dir) if e["kind"] == "resumed" and e["member"] == "killed"]
    assert resumed["step"] in (2, 5)  # 5 (global step 6, mid-epoch 1) unless its write was in flight
    uninterrupted = by_attempt(run_dir, "plain", 1)
    assert_every_epoch_covers_the_dataset_once(uninterrupted)
    first, second = by_attempt(run_dir, "killed", 1), by_attempt(run_dir, "killed", 2)
    assert min(second) == resumed["step"] + 1 and kept(first, second, resumed["step"]) == uninterrupted
    digests = [
        json.loads((run_dir / "members" / n / "command-result.json").read_text())["digest"] for n in ("killed", "plain")
    ]
    assert digests[0] == digests[1]


def test_ignore_data_skip_starts_the_resumed_epoch_again_from_its_first_batch(tmp_path: Path) -> None:
    full = hf_ids.make_trainer(tmp_path / "full", steps=8, save_steps=100)
    resilient_trainer(full)
    full.train()
    stopped = hf_ids.make_trainer(tmp_path / "run", steps=8, save_steps=100, callbacks=[SignalAt(6)])
    stopped.train(resume_from_checkpoint=resilient_trainer(stopped).last_checkpoint())
    resumed = hf_ids.make_trainer(tmp_path / "run", steps=8, save_steps=100)
    resumed.args.ignore_data_skip = True
    resumed.train(resume_from_checkpoint=resilient_trainer(resumed).last_checkpoint())
    assert resumed.ids == {6: full.ids[4], 7: full.ids[5]}  # epoch 1 again from its first batch


def stopped_at_6(directory: Path, **kwargs) -> None:
    stopped = hf_ids.make_trainer(directory, steps=8, save_steps=100, callbacks=[SignalAt(6)])
    stopped.train(resume_from_checkpoint=resilient_trainer(stopped, **kwargs).last_checkpoint())
    assert stopped.state.global_step == 6


def test_a_resume_whose_batches_are_not_the_checkpoints_is_refused(tmp_path: Path) -> None:
    stopped_at_6(tmp_path)
    resumed = hf_ids.make_trainer(tmp_path, steps=8, save_steps=100, batch=2)  # step 6: 12 samples into epoch 0
    with pytest.raises(CheckpointError, match=r"data position \(sample 8 of epoch 1\) is not Trainer's"):
        resumed.train(resume_from_checkpoint=resilient_trainer(resumed).last_checkpoint())


def test_a_checkpoint_without_a_data_position_goes_on_at_trainers_count(tmp_path: Path) -> None:
    stopped_at_6(tmp_path, resumable_data=False)  # saved by Trainer's own loader
    resumed = hf_ids.make_trainer(tmp_path, steps=8, save_steps=100)
    resumed.train(resume_from_checkpoint=resilient_trainer(resumed).last_checkpoint())
    order = ResumableLoader(
        resumed.train_dataset, 4, shuffle=True, seed=hf_ids.SEED, collate_fn=hf_ids.masking_collator
    )
    order.set_epoch(1)
    batches = [batch["index"].tolist() for batch in order]
    assert resumed.ids == {6: batches[2], 7: batches[3]}
