"""A tiny training problem, deterministic on CPU, used by the tests and their child processes.

Every step draws its batch from the step number, and the model uses dropout, so that a resumed run
only matches an uninterrupted one if parameters, optimizer moments, scheduler position and the
torch generator were all restored exactly.
"""

from __future__ import annotations

import numpy as np
import torch
import xxhash

from resilient_flows.checkpoint import TrainState


class Problem:
    def __init__(self, seed: int = 0, width: int = 32, depth: int = 2) -> None:
        torch.manual_seed(seed)
        np.random.seed(seed)
        layers: list[torch.nn.Module] = [torch.nn.Linear(16, width), torch.nn.BatchNorm1d(width), torch.nn.ReLU()]
        for _ in range(depth - 1):
            layers += [torch.nn.Dropout(0.1), torch.nn.Linear(width, width), torch.nn.ReLU()]
        layers.append(torch.nn.Linear(width, 4))
        self.model = torch.nn.Sequential(*layers)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=7, gamma=0.7)
        self.state = TrainState(self.model, self.optimizer, self.scheduler, extra={"step": 0, "seen": 0})

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(32, 16, generator=g)
        return x, (x[:, :4].sum(1) > 0).long() + (x[:, 4] > 0).long()

    def step(self, step: int) -> float:
        x, y = self.batch(step)
        self.model.train()
        self.optimizer.zero_grad()
        noise = torch.rand(()) * 1e-3  # draws from the global generator: RNG state matters
        loss = torch.nn.functional.cross_entropy(self.model(x), y) + noise
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.state.extra["step"] = step
        self.state.extra["seen"] += len(x)
        return loss.item()


def digest(state_dict: dict) -> str:
    """A digest of every tensor and scalar of a (nested) state dict, for exact comparisons."""
    h = xxhash.xxh3_64()

    def walk(node: object, path: str) -> None:
        if isinstance(node, torch.Tensor):
            h.update(path.encode())
            h.update(node.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(node, np.ndarray):
            h.update(path.encode())
            h.update(np.ascontiguousarray(node).tobytes())
        elif isinstance(node, dict):
            for k in sorted(node, key=str):
                walk(node[k], f"{path}/{k}")
        elif isinstance(node, list | tuple):
            for i, v in enumerate(node):
                walk(v, f"{path}/{i}")
        else:
            h.update(f"{path}={node!r}".encode())

    walk(state_dict, "")
    return h.hexdigest()


def replicated_digest(state: TrainState) -> str:
    """Digest of what all ranks share (model, optimizer, scheduler, extra): not the RNG states."""
    sd = state.state_dict()
    sd.pop("rank_local")
    return digest(sd)
