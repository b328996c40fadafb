"""A PyTorch Lightning script on scikit-learn's digits, as a workflow's command member (``lightning.yaml``).

Ordinary Lightning; the lines marked ``resilient-flows`` are what joins it to a workflow. Inside a
workflow the checkpoint tiers, the seed, the step count and the checkpoint interval come from the
member's run contract; run alone it needs ``--dir``::

    python workflows/lightning_digits.py --dir /tmp/ckpts --steps 200   # again: resumes, then stops at 200

Every batch is a function of the seed and the position in the epoch, and the data loader reports
its position to Lightning (``state_dict``), so that a run killed mid-epoch and resumed trains on
exactly the batches an uninterrupted run would, to the same weights bit for bit.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Sampler, TensorDataset

from resilient_flows.integrations.lightning import (
    ResilientCallback,
    ResilientCheckpointIO,
    ResilientModelParallelStrategy,
)
from resilient_flows.training import RunContract, load_dataset


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


class EpochSampler(Sampler[int]):
    """A permutation per epoch drawn from (seed, epoch): Lightning calls ``set_epoch`` before each epoch."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        return iter(torch.randperm(self.size, generator=generator).tolist())


class ResumableLoader(DataLoader):
    """Global batches in the sampler's order, each rank taking its share of the rows.

    It tells Lightning how many batches of the epoch it served (``state_dict``, saved in every
    checkpoint) and skips them when a resumed run hands that back (``load_state_dict``).
    """

    def __init__(self, dataset: TensorDataset, batch_size: int, seed: int) -> None:
        super().__init__(dataset, batch_size=batch_size, sampler=EpochSampler(len(dataset), seed))
        self.served, self._skip = 0, 0

    def __iter__(self) -> Iterator[Any]:
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        order = list(self.sampler)
        self.served, self._skip = self._skip, 0
        for start in range(self.served * self.batch_size, len(order), self.batch_size):
            self.served += 1
            yield self.dataset[torch.tensor(order[start : start + self.batch_size][rank::world])]

    def state_dict(self) -> dict[str, int]:
        return {"served": self.served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._skip = state["served"]


def main() -> Digits:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0, help="outside a workflow (a member's seed wins)")
    parser.add_argument("--steps", type=int, default=300, help="outside a workflow (a member's steps win)")
    parser.add_argument("--every", type=int, default=25, help="steps between checkpoints outside a workflow")
    parser.add_argument("--dir", help="checkpoint directory outside a workflow")
    parser.add_argument("--devices", type=int, default=1, help="CPU processes (gloo when more than one)")
    parser.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp", help="with more than one process")
    args = parser.parse_args()

    contract = RunContract.from_env() if "RESILIENT_FLOWS_RUN_DIR" in os.environ else None
    if contract is not None:
        args.seed, args.steps = contract.params["seed"], contract.params["steps"]
        args.every = contract.checkpoint_interval or args.every
    torch.set_num_threads(1)
    pl.seed_everything(args.seed, verbose=False)
    data = load_dataset("digits")
    loader = ResumableLoader(TensorDataset(data.x_train, data.y_train), batch_size=64, seed=args.seed)

    io = ResilientCheckpointIO(args.dir)  # resilient-flows (1/3): the member's tiers, or --dir
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
            ResilientCallback(),  # resilient-flows (2/3): stop signals, metrics, injected faults
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    model = Digits(args.lr)
    trainer.fit(model, loader, ckpt_path="last")  # resilient-flows (3/3): resume if there is a checkpoint
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
