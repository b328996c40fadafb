"""A Lightning workflow member that records the sample ids of every step it trains (tests/test_lightning_data.py).

Each sample is ``(x + noise, y, index)``, the noise drawn in a ``DataLoader`` worker while the
sample loads; a ``ResumableLoader`` with two workers serves them. Every rank appends
``{"attempt", "step", "rank", "ids"}`` per optimizer step to ``RECORD`` (flushed: a SIGKILL
loses nothing written). Usage: ``python lightning_ids.py RECORD [--devices N]`` under a run contract.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from resilient_flows.integrations.lightning import ResilientCallback, ResilientCheckpointIO
from resilient_flows.training import ResumableLoader, RunContract

SAMPLES, BATCH = 60, 8  # 8 global batches an epoch, the last of 4


class Noisy(torch.utils.data.Dataset):
    """Fixed inputs, plus noise drawn from torch's generator as each sample loads (an augmentation)."""

    def __init__(self) -> None:
        self.x = torch.randn(SAMPLES, 4, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[index] + 0.1 * torch.randn(4), self.x[index].sum(0, keepdim=True), index


class Recorded(pl.LightningModule):
    def __init__(self, record: str, attempt: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)
        self.record, self.attempt = record, attempt

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, ids = batch
        line = {"attempt": self.attempt, "step": self.global_step, "rank": self.global_rank, "ids": ids.tolist()}
        with open(self.record, "a") as out:
            out.write(json.dumps(line) + "\n")
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("record")
    parser.add_argument("--devices", type=int, default=1)
    args = parser.parse_args()
    contract = RunContract.from_env()
    torch.set_num_threads(1)
    io = ResilientCheckpointIO()
    every = contract.checkpoint_config().interval_steps
    loader = ResumableLoader(Noisy(), BATCH, shuffle=True, seed=contract.params["seed"], num_workers=2)
    trainer = pl.Trainer(
        max_steps=contract.params["steps"],
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        plugins=[io],
        callbacks=[
            ModelCheckpoint(io.directory, every_n_train_steps=every, save_last=True),
            ResilientCallback(),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Recorded(args.record, contract.attempt), loader, ckpt_path="last")


if __name__ == "__main__":
    main()
