"""A member that trains on an iterable dataset through ``ctx.loader`` (torchdata's StatefulDataLoader).

``Stream(length, stateful)`` yields this rank's numbers of ``0 .. length-1``, dealt over ranks and
workers as a sharded stream deals them; with ``stateful`` its iterator keeps its position in a
``state_dict`` (an O(1) resume), without it the loader fast-forwards. Each rank logs the ids of
every batch it trains to ``ids-a<attempt>-r<rank>.jsonl``; ``params.preempt`` SIGTERMs the first
attempt after that step.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info


class _Position:
    """An iterator over ``items`` that says, and takes back, how far it got."""

    def __init__(self, items: range) -> None:
        self.items, self.next = items, 0

    def __iter__(self) -> _Position:
        return self

    def __next__(self) -> int:
        if self.next >= len(self.items):
            raise StopIteration
        self.next += 1
        return self.items[self.next - 1]

    def state_dict(self) -> dict[str, int]:
        return {"next": self.next}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next = state["next"]


class Stream(IterableDataset):
    def __init__(self, length: int, rank: int = 0, world_size: int = 1, stateful: bool = True) -> None:
        self.length, self.rank, self.world_size, self.stateful = length, rank, world_size, stateful

    def __iter__(self) -> Any:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        items = range(self.rank * workers + worker, self.length, self.world_size * workers)
        return _Position(items) if self.stateful else iter(items)


def train(ctx: Any) -> dict[str, Any]:
    p = ctx.params
    data = Stream(int(p["samples"]), ctx.rank, ctx.world_size, bool(p.get("stateful", True)))
    workers = int(p.get("workers", 2))
    loader = ctx.loader(data, batch_size=int(p["batch"]), num_workers=workers, persistent_workers=workers > 0)
    torch.manual_seed(ctx.seed)
    model = torch.nn.Linear(1, 1)
    net = ctx.wrap(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.001)
    ctx.track(model=model, optimizer=opt)
    preempt = p.get("preempt") if ctx.attempt == 1 else None
    with open(ctx.directory / f"ids-a{ctx.attempt}-r{ctx.rank}.jsonl", "a") as log:
        for step, ids in ctx.batches(loader, p["steps"]):
            x = ids.float().reshape(-1, 1) / p["samples"]
            loss = (net(x) - 2 * x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            log.write(json.dumps({"step": step, "epoch": loader.epoch, "ids": ids.tolist()}) + "\n")
            log.flush()
            if step == preempt:
                os.kill(os.getpid(), signal.SIGTERM)
    return ctx.result(model)
