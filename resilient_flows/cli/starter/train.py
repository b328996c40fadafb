"""A starter training function: a small network on scikit-learn's bundled digits, seconds on a CPU.

``workflow.yaml`` beside this file names it as ``workload: train:train``; modules are imported from
the workflow file's directory first, so this one needs no install. Replace the data, the model and
the loss with yours, and keep the calls on ``ctx``:

- ``ctx.track(...)`` declares what a checkpoint holds, and restores the latest one (after a
  failure, a preemption, or ``resilient-flows resume``);
- ``ctx.steps(n)`` yields the steps still to run, checkpoints on the workflow's interval, and stops
  cleanly when the batch system or the runner asks;
- ``ctx.log(step, ...)`` records metrics; ``ctx.result(model, ...)`` is the member's result.

Every batch is a function of the seed and the step only, so a resumed member draws the batches an
uninterrupted one would, and ends with the same weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from sklearn.datasets import load_digits
from torch import nn

if TYPE_CHECKING:
    from resilient_flows.training import TrainContext


def train(ctx: TrainContext) -> dict[str, Any]:
    """One member: ``ctx.params`` holds the workflow's ``params`` and ``steps``."""
    x, y = digits()
    split = int(0.8 * len(x))  # the rest is held out for the test accuracy
    torch.manual_seed(ctx.seed)
    hidden = int(ctx.params["hidden"])
    model = nn.Sequential(nn.Linear(x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=ctx.params["lr"], momentum=0.9)
    ctx.track(model=model, optimizer=optimizer)
    for step in ctx.steps(ctx.params["steps"]):
        batch = torch.randint(split, (int(ctx.params["batch_size"]),), generator=_rng(ctx.seed, step))
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ctx.log(step, loss=loss.item())
    with torch.no_grad():
        accuracy = (model(x[split:]).argmax(1) == y[split:]).float().mean().item()
    return ctx.result(model, test_accuracy=accuracy)


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1797 8x8 images (scaled to [0, 1]) and their labels, in one fixed shuffled order."""
    images, labels = load_digits(return_X_y=True)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    return torch.tensor(images, dtype=torch.float32)[order] / 16.0, torch.tensor(labels)[order]


def _rng(seed: int, step: int) -> torch.Generator:
    """The random numbers of one member's step."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)
