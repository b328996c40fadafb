"""Hugging Face ``Trainer`` through resilient-flows: resume to the same losses, stop signals, snapshots.

The model is a two-layer GPT-2 built from a config (vocabulary 64, GPT-2's dropout, so that the
RNG states matter) trained on random token ids by ``examples/hf_finetune.py``: nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
from requires import require_module

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = require_module(
    "transformers", "transformers is not installed: pip install 'resilient-flows[transformers]'"
)

import torch  # noqa: E402
from conftest import REPO, python_env  # noqa: E402

from resilient_flows.checkpoint import CheckpointConfig, Checkpointer, TierSpec  # noqa: E402
from resilient_flows.checkpoint._tiers import Tier  # noqa: E402
from resilient_flows.errors import CheckpointError, ResilientFlowsError  # noqa: E402
from resilient_flows.integrations.transformers import resilient_trainer  # noqa: E402
from resilient_flows.training import RunContract, read_events, state_digest  # noqa: E402
from resilient_flows.training._contract import EXIT_PREEMPTED  # noqa: E402

EXAMPLE = REPO / "examples" / "hf_finetune.py"
SEED, LR, EXAMPLES = 3, 2e-3, 16  # 16 sequences in batches of 4: an epoch is 4 steps


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hf_finetune", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RecordingTrainer(transformers.Trainer):
    """Records each optimizer step's loss exactly (its last micro-step's), by its index from 0."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.losses: dict[int, float] = {}

    def training_step(self, *args, **kwargs) -> torch.Tensor:
        loss = super().training_step(*args, **kwargs)
        self.losses[self.state.global_step] = float(loss)
        return loss


class SignalAt(transformers.TrainerCallback):
    """Sends this process ``signum`` at the end of global step ``at``, as a batch system would."""

    def __init__(self, at: int, signum: int) -> None:
        self.at, self.signum = at, signum

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            os.kill(os.getpid(), self.signum)


class WeightsAtSave(transformers.TrainerCallback):
    """The weights right after each save call returned, by global step."""

    def __init__(self) -> None:
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_save(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}


def make_trainer(
    example: ModuleType, output_dir: Path, steps: int, save_steps: int, callbacks=(), accumulate: int = 1
) -> RecordingTrainer:
    args = example.training_args(str(output_dir), steps, save_steps, SEED, LR)
    args.gradient_accumulation_steps = accumulate
    return RecordingTrainer(
        model=example.tiny_gpt2(SEED),
        args=args,
        train_dataset=example.TokenIds(EXAMPLES, SEED),
        callbacks=list(callbacks),
    )


def newest_step(directory: Path) -> int | None:
    steps = Tier(directory, "shared").committed_steps()
    return steps[0] if steps else None


@pytest.mark.parametrize(
    ("accumulate", "at"),
    [(1, 6), (1, 4), (2, 3)],
    ids=["mid-epoch", "epoch-end", "accumulating-mid-epoch"],  # an epoch is 4 batches
)
def test_a_stopped_run_resumes_at_its_step_with_the_same_losses_and_weights(
    tmp_path: Path, example, accumulate: int, at: int
) -> None:
    """Stopped by SIGUSR1, then resumed: Trainer skips the batches seen, our RNG states continue
    the dropout masks, and every later loss and the final weights are bit for bit those of the
    uninterrupted run."""
    full = make_trainer(example, tmp_path / "full", steps=10, save_steps=4, accumulate=accumulate)
    resilient_trainer(full)
    full.train()

    signal_at = [SignalAt(at, signal.SIGUSR1)]
    stopped = make_trainer(
        example, tmp_path / "run", steps=10, save_steps=4, callbacks=signal_at, accumulate=accumulate
    )
    first = resilient_trainer(stopped)
    assert first.last_checkpoint() is None
    stopped.train(resume_from_checkpoint=first.last_checkpoint())
    assert (first.stopped, stopped.state.global_step) == ("signal SIGUSR1", at)
    assert newest_step(tmp_path / "run" / "checkpoints") == at - 1  # checkpoint s holds global step s + 1
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # our handler is gone with the run

    fresh = make_trainer(example, tmp_path / "run", steps=10, save_steps=4, accumulate=accumulate)
    resilient_trainer(fresh)
    with pytest.raises(CheckpointError, match=rf"hold step {at - 1} already .*resume_from_checkpoint=resilient"):
        fresh.train()

    resumed = make_trainer(example, tmp_path / "run", steps=10, save_steps=4, accumulate=accumulate)
    second = resilient_trainer(resumed)
    resumed.train(resume_from_checkpoint=second.last_checkpoint())
    assert min(resumed.losses) == at  # the first step run is the one after the checkpoint
    assert resumed.losses == {step: full.losses[step] for step in range(at, 10)}
    assert state_digest(resumed.model) == state_digest(full.model)
    assert resumed.state.global_step == 10 and second.stopped is None
    assert [e["step"] for e in resumed.state.log_history if "loss" in e] == list(range(1, 11))


def test_each_checkpoint_holds_the_weights_at_its_save_call(tmp_path: Path, example) -> None:
    """The save returns once the state is copied: training that goes on while the writer thread
    writes does not reach the files. TrainerState is JSON in the manifest."""
    seen = WeightsAtSave()
    trainer = make_trainer(example, tmp_path, steps=9, save_steps=2, callbacks=[seen])
    resilient_trainer(trainer, keep=10)
    trainer.train()
    assert sorted(seen.weights) == [2, 4, 6, 8, 9]  # every save_steps, and the last step (Trainer's rule)
    with Checkpointer(tmp_path / "checkpoints") as checkpointer:
        assert sorted(Tier(tmp_path / "checkpoints", "shared").committed_steps()) == [1, 3, 5, 7, 8]
        for global_step, weights in seen.weights.items():
            saved = checkpointer.load(global_step - 1)
            assert saved["model"].keys() == weights.keys()
            assert all(torch.equal(saved["model"][name], weights[name]) for name in weights)
            assert saved["extra"]["trainer_state"]["global_step"] == global_step
            assert saved["scheduler"]["last_epoch"] == global_step
    assert not list(tmp_path.glob("checkpoint-*"))  # Trainer wrote no checkpoint of its own


class RaiseAt(transformers.TrainerCallback):
    """Raises at the end of global step ``at``: a user's code failing mid-run."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise RuntimeError(f"failed at step {self.at}")


def test_a_train_that_raises_gives_the_stop_signals_back(tmp_path: Path, example) -> None:
    """``train()`` raising skips ``on_train_end``: SIGTERM and SIGUSR1 must end the process again,
    not wait for a step boundary that never comes; a new run in the same process then works."""
    failing = make_trainer(example, tmp_path / "run", steps=6, save_steps=2, callbacks=[RaiseAt(3)])
    resilient = resilient_trainer(failing)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    with pytest.raises(RuntimeError, match="failed at step 3"):
        failing.train(resume_from_checkpoint=resilient.last_checkpoint())
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)) == before
    resumed = make_trainer(example, tmp_path / "run", steps=6, save_steps=2, callbacks=[SignalAt(5, signal.SIGUSR1)])
    again = resilient_trainer(resumed)
    resumed.train(resume_from_checkpoint=again.last_checkpoint())
    assert (again.stopped, resumed.state.global_step) == ("signal SIGUSR1", 5)
    assert signal.getsignal(signal.SIGUSR1) == before[1]


def test_settings_it_cannot_honour_are_refused(tmp_path: Path, example) -> None:
    trainer = make_trainer(example, tmp_path, steps=2, save_steps=1)
    resilient_trainer(trainer)
    with pytest.raises(ResilientFlowsError, match="checkpoints through resilient-flows already"):
        resilient_trainer(trainer)
    best = make_trainer(example, tmp_path, steps=2, save_steps=1)
    best.args.load_best_model_at_end = True
    with pytest.raises(ResilientFlowsError, match="load_best_model_at_end needs Trainer's own checkpoint"):
        resilient_trainer(best)


# ---------------------------------------------------------------------- as a workflow member


def member_env(run_dir: Path, attempt: int, steps: int, interval: int) -> dict[str, str]:
    shared = run_dir / "members" / "hf" / "checkpoints"
    contract = RunContract(
        run_dir=run_dir,
        member="hf",
        checkpoint_dir=shared,
        attempt=attempt,
        params={"seed": SEED, "steps": steps},
        checkpoint=CheckpointConfig(tiers=(TierSpec(str(shared), name="shared"),), interval_steps=interval),
    )
    return {**python_env(), **contract.to_env(), "HF_HUB_OFFLINE": "1"}


def start_member(tmp_path: Path, attempt: int, steps: int, interval: int, step_s: float) -> subprocess.Popen:
    argv = [sys.executable, str(EXAMPLE), "--output-dir", str(tmp_path / "out"), "--lr", str(LR)]
    argv += ["--examples", str(EXAMPLES), "--step-s", str(step_s)]
    log = (tmp_path / f"attempt-{attempt}.log").open("w")
    return subprocess.Popen(argv, env=member_env(tmp_path, attempt, steps, interval), stdout=log, stderr=log)


def wait_for(condition, process: subprocess.Popen, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"{what}: never happened (exit status {process.poll()})")
        time.sleep(0.02)


def metrics(tmp_path: Path) -> list[dict]:
    path = tmp_path / "members" / "hf" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_a_member_killed_mid_run_resumes_at_its_checkpoint_with_the_same_losses(tmp_path: Path, example) -> None:
    """SIGKILL after a committed checkpoint, then the next attempt: it starts at the step after the
    checkpoint, logs the uninterrupted run's losses exactly, and ends with its weights."""
    checkpoints = tmp_path / "members" / "hf" / "checkpoints"
    first = start_member(tmp_path, attempt=1, steps=12, interval=3, step_s=0.15)
    wait_for(lambda: (newest_step(checkpoints) or -1) >= 5, first, "a committed checkpoint of step 5")
    first.kill()
    first.wait()
    committed = newest_step(checkpoints)
    assert committed in (5, 8)

    second = start_member(tmp_path, attempt=2, steps=12, interval=3, step_s=0.0)
    assert second.wait(timeout=120) == 0, (tmp_path / "attempt-2.log").read_text()[-3000:]

    reference = make_trainer(example, tmp_path / "reference", steps=12, save_steps=100)
    resilient_trainer(reference)
    reference.train()
    lines = metrics(tmp_path)
    assert all(line.keys() == {"step", "attempt", "time", "loss"} for line in lines)
    resumed = [line for line in lines if line["attempt"] == 2]
    assert [line["step"] for line in resumed] == list(range(committed + 1, 12))
    assert {line["step"]: line["loss"] for line in lines} == reference.losses
    result = json.loads((tmp_path / "members" / "hf" / "command-result.json").read_text())
    assert result["digest"] == state_digest(reference.model)


@pytest.mark.slow
def test_sigterm_commits_the_step_and_exits_75_inside_a_workflow(tmp_path: Path) -> None:
    member = start_member(tmp_path, attempt=1, steps=200, interval=100, step_s=0.1)
    wait_for(lambda: any(line["step"] >= 2 for line in metrics(tmp_path)), member, "step 2 logged")
    member.send_signal(signal.SIGTERM)
    assert member.wait(timeout=60) == EXIT_PREEMPTED, (tmp_path / "attempt-1.log").read_text()[-3000:]
    last = metrics(tmp_path)[-1]["step"]
    assert newest_step(tmp_path / "members" / "hf" / "checkpoints") == last
    (preempted,) = [e for e in read_events(tmp_path) if e["kind"] == "preempted"]
    assert (preempted["step"], preempted["reason"]) == (last, "signal SIGTERM")
