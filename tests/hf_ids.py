"""A Hugging Face ``Trainer`` whose data draw random numbers, recording the sample ids of every step
(tests/test_transformers_data.py); run as a script, a workflow member.

The tiny GPT-2 and token ids are ``examples/hf_finetune.py``'s. Each sample replaces one token at
random as it loads (in a ``DataLoader`` worker: ``dataloader_num_workers=2``), and the collator
masks labels at random, as MLM masking does: both draw from the generators of the process that
loads them. Usage: ``python hf_ids.py RECORD`` under a run contract; every step appends
``{"attempt", "step", "ids", "loss"}`` to ``RECORD`` (flushed: a SIGKILL loses nothing written).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import transformers

from resilient_flows.integrations.transformers import resilient_trainer
from resilient_flows.training import RunContract

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "hf_finetune.py"
_spec = importlib.util.spec_from_file_location("hf_finetune", EXAMPLE)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

SEED, LR, EXAMPLES = 3, 2e-3, 16  # 16 sequences in batches of 4: an epoch is 4 steps


class NoisyTokenIds(example.TokenIds):
    """The example's sequences, one token replaced at random as each loads; with the sample's index."""

    def __getitem__(self, index: int) -> dict[str, Any]:
        ids = self.ids[index].clone()
        ids[torch.randint(example.LENGTH, ())] = torch.randint(example.VOCAB, ())
        return {"input_ids": ids, "labels": ids, "index": index}


def masking_collator(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack the rows and hide 15% of the labels at random, drawing as it collates."""
    batch = {key: torch.stack([row[key] for row in rows]) for key in ("input_ids", "labels")}
    batch["labels"] = batch["labels"].masked_fill(torch.rand(batch["labels"].shape) < 0.15, -100)
    batch["index"] = torch.tensor([row["index"] for row in rows])
    return batch


class IdsTrainer(transformers.Trainer):
    """Records each optimizer step's sample ids and loss, by global step from 0 (and in ``record``)."""

    def __init__(self, *args: Any, record: str | None = None, attempt: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ids: dict[int, list[int]] = {}
        self.losses: dict[int, float] = {}
        self.record, self.attempt = record, attempt

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        ids = inputs.pop("index").tolist()
        loss = super().training_step(model, inputs, num_items_in_batch)
        step = self.state.global_step
        self.ids.setdefault(step, []).extend(ids)
        self.losses[step] = float(loss)
        if self.record is not None:
            with open(self.record, "a") as out:
                out.write(json.dumps({"attempt": self.attempt, "step": step, "ids": ids, "loss": float(loss)}) + "\n")
        return loss


def make_trainer(
    output_dir: Path, steps: int, save_steps: int, cls: type = IdsTrainer, batch: int = 4, **kwargs: Any
) -> IdsTrainer:
    args = example.training_args(str(output_dir), steps, save_steps, SEED, LR)
    args.per_device_train_batch_size = batch
    args.dataloader_num_workers = 2
    args.remove_unused_columns = False  # the index reaches training_step, which takes it out
    return cls(
        model=example.tiny_gpt2(SEED),
        args=args,
        train_dataset=NoisyTokenIds(EXAMPLES, SEED),
        data_collator=masking_collator,
        **kwargs,
    )


def main() -> None:
    torch.set_num_threads(1)
    contract, record = RunContract.from_env(), sys.argv[1]
    steps = int(contract.params["steps"])
    trainer = make_trainer(Path(record).parent / "out", steps, 100, record=record, attempt=contract.attempt)
    resilient = resilient_trainer(trainer)
    trainer.train(resume_from_checkpoint=resilient.last_checkpoint())


if __name__ == "__main__":
    main()
