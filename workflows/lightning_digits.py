"""A PyTorch Lightning script on the digits the package ships, as a workflow's command member (``lightning.yaml``).

Ordinary Lightning; the lines marked ``resilient-flows`` are what joins it to a workflow. Inside a
workflow the checkpoint tiers, the seed, the step count and the checkpoint interval come from the
member's run contract; run alone it needs ``--dir``::

    python workflows/lightning_digits.py --dir /tmp/ckpts --steps 200   # again: resumes, then stops at 200

The data come through a :class:`~resilient_flows.training.ResumableLoader` with two worker
processes: each epoch's order is a function of the seed and the epoch, Lightning saves the
loader's position in every checkpoint, and ``ResilientCallback`` gives each rank its share of the
global batch, so that a run killed mid-epoch and resumed trains on exactly the batches an
uninterrupted run would, to the same weights bit for bit.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import TensorDataset

from resilient_flows.integrations.lightning import (
    ResilientCallback,
    ResilientCheckpointIO,
    ResilientModelParallelStrategy,
)
from resilient_flows.training import ResumableLoader, RunContract, load_dataset


class Digits(pl.LightningModule):
    def __init__(self, lr: float, hidden: int = 64) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_model(self) -> None:
        """Under ``--strategy fsdp``: shard each layer, then the rest, over the data-parallel ranks (FSDP2)."""
        if not isinstance(self.trainer.strategy, ResilientModelParallelStrategy):
            return
        mesh = self.trainer.strategy.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main() -> Digits:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0, help="outside a workflow (a member's seed wins)")
    parser.add_argument("--steps", type=int, default=300, help="outside a workflow (a member's steps win)")
    parser.add_argument("--every", type=int, default=25, help="steps between checkpoints outside a workflow")
    parser.add_argument("--dir", help="checkpoint directory outside a workflow")
    parser.add_argument("--devices", type=int, default=1, help="CPU processes (gloo when more than one)")
    parser.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp", help="with more than one process")
    parser.add_argument("--workers", type=int, default=2, help="data loader worker processes")
    args = parser.parse_args()

    contract = RunContract.from_env() if "RESILIENT_FLOWS_RUN_DIR" in os.environ else None
    if contract is not None:
        args.seed, args.steps = contract.params["seed"], contract.params["steps"]
        args.every = contract.checkpoint_config().interval_steps or args.every
    torch.set_num_threads(1)
    pl.seed_everything(args.seed, verbose=False)
    data = load_dataset("digits")
    train = TensorDataset(data.x_train, data.y_train)
    # resilient-flows (1/4): batch_size is the global batch; ResilientCallback gives each rank its share
    loader = ResumableLoader(train, batch_size=64, shuffle=True, seed=args.seed, num_workers=args.workers)

    io = ResilientCheckpointIO(args.dir)  # resilient-flows (2/4): the member's tiers, or --dir
    if io.directory is None:
        parser.error("--dir is needed outside a workflow")
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy(args.strategy, args.devices),
        plugins=[io],
        callbacks=[
            ModelCheckpoint(
                io.directory, every_n_train_steps=args.every, save_top_k=2, monitor="train_loss", save_last=True
            ),
            ResilientCallback(),  # resilient-flows (3/4): stop signals, metrics, injected faults
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Digits(args.lr)
    trainer.fit(model, loader, ckpt_path="last")  # resilient-flows (4/4): resume if there is a checkpoint
    return model


def strategy(name: str, devices: int) -> Any:
    """DDP, or FSDP2 through the strategy that resumes from resilient-flows checkpoints.

    Lightning's default for ``ModelParallelStrategy`` is one data-parallel group per node and tensor
    parallelism within it: every process here is data-parallel instead.
    """
    if name == "fsdp":
        return ResilientModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1)
    return "ddp" if devices > 1 else "auto"


if __name__ == "__main__":
    main()
