"""A two-stage pipeline: a heat-equation simulation generates data, a surrogate model learns from it.

``simulate`` is a workflow stage (a :class:`~resilient_flows.resilience.Context` loop): explicit
finite differences of the 2-D heat equation with fixed hot spots and cold edges, snapshots every
``snapshot_every`` iterations. The fields and the snapshot array are found in the loop body's
closure and checkpointed on the stage's schedule; a restarted stage resumes bit for bit.

``train_surrogate`` is a member's workload: a small convolutional network learns the map from
one snapshot to the next (a learned time stepper), on the stage's output, which it reads
without pickle.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from resilient_flows.errors import ResilientFlowsError
from resilient_flows.resilience import Context
from resilient_flows.training import TrainContext, batch_indices

__all__ = ["digest", "load_snapshots", "simulate", "train_surrogate"]

DATA_FILE = "heat.npz"


def simulate(
    ctx: Context,
    output: Path,
    inputs: dict[str, Path],
    size: int = 32,
    iterations: int = 2000,
    episode: int = 200,
    snapshot_every: int = 5,
    diffusivity: float = 0.2,
    blobs: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Run the simulation; write ``output/heat.npz``.

    Every ``episode`` iterations the field restarts from new random hot blobs (drawn from
    ``(seed, episode number)``, so a resumed run draws the same). ``snapshots`` (float32,
    episodes x snapshots per episode x size x size) holds the field every ``snapshot_every``
    iterations.
    """
    if not 0 < diffusivity <= 0.25:
        raise ValueError(f"diffusivity {diffusivity} must be in (0, 0.25] for the explicit scheme to be stable")
    if size < 4 or not 1 <= snapshot_every <= episode <= iterations or iterations % episode:
        raise ValueError(
            f"need size >= 4, 1 <= snapshot_every <= episode <= iterations and iterations a multiple of episode; "
            f"got size={size}, snapshot_every={snapshot_every}, episode={episode}, iterations={iterations}"
        )
    grid = np.arange(size)
    u = np.zeros((size, size))
    v = np.zeros((size, size))
    snapshots = np.zeros((iterations // episode, episode // snapshot_every, size, size), dtype=np.float32)

    def step(i: int) -> None:
        number, at = divmod(i, episode)
        if at == 0:
            rng = np.random.default_rng([seed, number])
            u[...] = 0.0
            for cy, cx, width, heat in rng.uniform((4, 4, 1.5, 50), (size - 4, size - 4, 4, 100), (blobs, 4)):
                u[...] += heat * np.exp(-((grid[:, None] - cy) ** 2 + (grid[None, :] - cx) ** 2) / (2 * width**2))
        v[1:-1, 1:-1] = u[1:-1, 1:-1] + diffusivity * (
            u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
        )
        v[0, :] = v[-1, :] = v[:, 0] = v[:, -1] = 0.0
        u[...] = v
        if (at + 1) % snapshot_every == 0:
            snapshots[number, (at + 1) // snapshot_every - 1] = u

    for i in range(max(ctx.latest_version("heat"), 0), iterations):
        ctx.checkpoint("heat", i, lambda i=i: step(i))
    ctx.wait()
    tmp = output / f".{DATA_FILE}.{os.getpid()}.tmp.npz"
    np.savez(tmp, snapshots=snapshots)
    os.replace(tmp, output / DATA_FILE)
    return {"snapshots": snapshots.shape[0] * snapshots.shape[1], "digest": digest(snapshots)}


def digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


def load_snapshots(directory: Path) -> np.ndarray:
    """The simulation's snapshots, read without pickle."""
    path = directory / DATA_FILE
    if not path.is_file():
        raise ResilientFlowsError(f"no simulation output at {path}: did the stage finish?")
    with np.load(path, allow_pickle=False) as data:
        return data["snapshots"]


def _surrogate(channels: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1),
        nn.Tanh(),
        nn.Conv2d(channels, channels, 3, padding=1),
        nn.Tanh(),
        nn.Conv2d(channels, 1, 3, padding=1),
    )


def train_surrogate(ctx: TrainContext) -> dict[str, Any]:
    """Learn snapshot t -> t+1 (as a correction to t) on the first 80 % of the pairs; test on the rest,
    beside persistence (predicting no change), the baseline any time stepper must beat."""
    if "heat" not in ctx.inputs:
        raise ResilientFlowsError(f"member {ctx.name} reads the 'heat' stage: add `after: [heat]` to it")
    p = {"lr": 0.003, "batch_size": 16, "channels": 8, **ctx.params}
    snapshots = torch.from_numpy(load_snapshots(ctx.inputs["heat"]))
    scale = float(snapshots.abs().max()) or 1.0
    fields = (snapshots / scale).unsqueeze(2)  # episode x time x 1 x size x size
    x, y = fields[:, :-1].flatten(0, 1), fields[:, 1:].flatten(0, 1)  # pairs within an episode
    cut = max(1, int(0.8 * len(x)))  # the last episodes are the test set
    torch.manual_seed(ctx.seed)
    model = _surrogate(int(p["channels"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=p["lr"])
    ctx.track(model=model, optimizer=optimizer)
    for step in ctx.steps(p["steps"]):
        index = batch_indices(ctx.seed, step, cut, int(p["batch_size"]))
        loss = nn.functional.mse_loss(x[index] + model(x[index]), y[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        ctx.log(step, loss=loss.item())
    test = persistence = float("nan")
    if cut < len(x):
        with torch.no_grad():
            test = nn.functional.mse_loss(x[cut:] + model(x[cut:]), y[cut:]).item()
            persistence = nn.functional.mse_loss(x[cut:], y[cut:]).item()
    return ctx.result(model, test_mse=test, persistence_mse=persistence)
