"""Fine-tune a tiny GPT-2 with Hugging Face ``Trainer``, checkpointed and resumed by resilient-flows.

The model is built from a config and the data are random token ids, so nothing is downloaded.
Two lines belong to resilient-flows (marked); the rest is an ordinary ``Trainer`` script.

Standalone::

    python examples/hf_finetune.py --output-dir runs/hf --steps 200 --save-steps 20

SIGTERM or SIGUSR1 stops it after committing a checkpoint; running the same command again
resumes from the newest committed checkpoint. As a workflow's command member::

    members:
      - name: gpt
        command: [python, examples/hf_finetune.py, --lr, "{lr}"]
        steps: 200
        params: {lr: 0.001}

there the tiers and the interval come from the run contract, ``steps`` and ``seed`` from the
member, and a stop signal exits with status 75 (requeued without spending a retry).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is built locally: never reach the Hub

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from resilient_flows.integrations.transformers import resilient_trainer

VOCAB = 64
LENGTH = 16


class TokenIds(torch.utils.data.Dataset):
    """Random token sequences of a fixed length; a language model learns their unigram statistics."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        weights = torch.rand(VOCAB, generator=generator) ** 4  # a skewed distribution, something to learn
        self.ids = torch.multinomial(weights, size * LENGTH, replacement=True, generator=generator).view(size, LENGTH)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def tiny_gpt2(seed: int) -> GPT2LMHeadModel:
    """Two layers, 32 wide, with GPT-2's dropout: the RNG matters for the losses that follow."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config)


def training_args(output_dir: str, steps: int, save_steps: int, seed: int, lr: float) -> TrainingArguments:
    return TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=lr,
        lr_scheduler_type="linear",
        warmup_steps=2,
        save_strategy="steps",
        save_steps=save_steps,
        logging_steps=1,
        seed=seed,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


class Pace(TrainerCallback):
    """Sleeps after each step, so that a demonstration (or a test) can interrupt the run mid-way."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="hf-finetune", help="Trainer's output_dir (standalone tiers below it)")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps (a member's own steps win)")
    parser.add_argument("--save-steps", type=int, default=10, help="checkpoint interval (a member's interval wins)")
    parser.add_argument("--seed", type=int, default=0, help="seed (a member's own seed wins)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--examples", type=int, default=16, help="training sequences (an epoch is examples/4 steps)")
    parser.add_argument("--step-s", type=float, default=0.0, help="sleep per step, to be caught mid-run")
    args = parser.parse_args(argv)

    params = json.loads(os.environ.get("RESILIENT_FLOWS_PARAMS") or "{}")
    steps, seed = int(params.get("steps", args.steps)), int(params.get("seed", args.seed))
    trainer = Trainer(
        model=tiny_gpt2(seed),
        args=training_args(args.output_dir, steps, args.save_steps, seed, args.lr),
        train_dataset=TokenIds(args.examples, seed),
        callbacks=[Pace(args.step_s)] if args.step_s > 0 else None,
    )
    resilient = resilient_trainer(trainer)  # resilient-flows (1/2): async tiered checkpoints, stop signals
    trainer.train(resume_from_checkpoint=resilient.last_checkpoint())  # resilient-flows (2/2): resume
    if resilient.stopped is not None:
        print(f"stopped at global step {trainer.state.global_step} ({resilient.stopped}); run again to resume")
    else:
        print(f"finished at global step {trainer.state.global_step}")


if __name__ == "__main__":
    main()
