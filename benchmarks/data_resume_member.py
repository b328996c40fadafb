"""The member ``data_resume.py`` (and its test) runs, alone in its module, and the ledger of its samples.

``data_resume_member:train`` trains a linear model on numbered samples through ``ctx.loader`` (or,
with ``params.plain``, the usual ``DataLoader`` with a ``DistributedSampler``, which restarts its
epoch on resume). Each rank appends the id and the augmented features of every sample it trains
to ``ids-a<attempt>-r<rank>.jsonl``, and each loaded sample's id to ``calls-a<attempt>-r<rank>-<pid>``;
``params.faults`` kills (SIGKILL) or preempts (SIGTERM) every rank of an attempt after a step.
:func:`ledger` then says, per epoch, which samples the surviving steps trained twice or never.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

DIM = 4


class Numbered(Dataset):
    """Sample ``i``: its id, fixed features from ``i`` plus a random augmentation, and a target."""

    def __init__(self, length: int, calls: Path | None = None) -> None:
        self.length, self.calls = length, calls

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        if self.calls is not None:
            with open(f"{self.calls}-{os.getpid()}", "a") as out:
                out.write(f"{index}\n")
        base = torch.randn(DIM, generator=torch.Generator().manual_seed(index))
        x = base + 0.1 * torch.randn(DIM)  # the augmentation: the global RNG, seeded per sample by ctx.loader
        return index, x, base.sum().reshape(1)


def _plain_batches(ctx: Any, data: Dataset, batch: int, workers: int, start: int, per_epoch: int) -> Any:
    """The usual loop: the epoch is the step's, and a resumed epoch starts at its first batch again."""
    sampler = DistributedSampler(data, ctx.world_size, ctx.rank, shuffle=True, seed=ctx.seed)
    share = batch // ctx.world_size
    loader = DataLoader(data, share, sampler=sampler, num_workers=workers, persistent_workers=workers > 0)
    step, epoch, batches = start, None, iter(())
    while True:
        if step // per_epoch != epoch:
            epoch = step // per_epoch
            sampler.set_epoch(epoch)
            batches = iter(loader)
        got = next(batches, None)
        if got is None:  # a sampler's padded epoch of other length: go round again
            batches = iter(loader)
            got = next(batches)
        yield epoch, got
        step += 1


def train(ctx: Any) -> dict[str, Any]:
    p = ctx.params
    batch, workers = int(p["batch"]), int(p.get("workers", 2))
    data = Numbered(int(p["samples"]), ctx.directory / f"calls-a{ctx.attempt}-r{ctx.rank}")
    torch.manual_seed(ctx.seed)
    model = torch.nn.Linear(DIM, 1)
    net = ctx.wrap(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    if p.get("plain"):
        ctx.track(model=model, optimizer=opt)
        start = 0 if ctx.restored_step is None else ctx.restored_step + 1
        per_epoch = -(-int(p["samples"]) // batch)
        plain = _plain_batches(ctx, data, batch, workers, start, per_epoch)
        stream, weight = zip(ctx.steps(ctx.params["steps"]), plain, strict=False), lambda: 1.0
    else:
        loader = ctx.loader(data, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
        ctx.track(model=model, optimizer=opt)
        stream = ((step, (loader.epoch, got)) for step, got in ctx.batches(loader, ctx.params["steps"]))
        weight = lambda: loader.rank_weight  # noqa: E731
    fault = p.get("faults", {}).get(str(ctx.attempt))
    began, first = time.perf_counter(), True
    with open(ctx.directory / f"ids-a{ctx.attempt}-r{ctx.rank}.jsonl", "a") as log:
        for step, (epoch, (ids, x, y)) in stream:
            if first and ctx.rank == 0:  # from the restored state to this rank's first batch: the data's resume
                resumed = {"step": step, "first_batch_s": time.perf_counter() - began}
                (ctx.directory / f"resume-a{ctx.attempt}.json").write_text(json.dumps(resumed))
            first = False
            loss = (net(x) - y).square().mean() * weight()
            opt.zero_grad()
            loss.backward()
            opt.step()
            row = {"step": step, "epoch": epoch, "ids": ids.tolist(), "x": x.tolist()}
            log.write(json.dumps(row) + "\n")
            log.flush()
            ctx.log(step, loss=loss)
            if fault is not None and fault[1] == step:
                os.kill(os.getpid(), signal.SIGKILL if fault[0] == "kill" else signal.SIGTERM)
    return ctx.result(model)


def rows(member_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Every trained step's rows (one per rank) from the last attempt that trained it: the steps an
    attempt trained after its newest checkpoint are trained again by the next, from that checkpoint."""
    by_step: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    for path in member_dir.glob("ids-a*-r*.jsonl"):
        attempt = int(path.name.split("-")[1][1:])
        for line in path.read_text().splitlines():
            row = json.loads(line)
            held = by_step.get(row["step"])
            if held is None or held[0] < attempt:
                by_step[row["step"]] = (attempt, [row])
            elif held[0] == attempt:
                held[1].append(row)
    return {step: got for step, (_, got) in sorted(by_step.items())}


def ledger(member_dir: Path, samples: int, epochs: int) -> list[dict[str, int]]:
    """Per epoch: samples trained, duplicated (trained more than once) and skipped (never trained)."""
    counts = [Counter() for _ in range(epochs)]
    for got in rows(member_dir).values():
        for row in got:
            if row["epoch"] < epochs:
                counts[row["epoch"]].update(row["ids"])
    return [
        {
            "epoch": epoch,
            "trained": sum(count.values()),
            "duplicated": sum(n - 1 for n in count.values() if n > 1),
            "skipped": samples - len(count),
        }
        for epoch, count in enumerate(counts)
    ]


def augmentations_agree(member_dir: Path) -> bool:
    """Whether every (epoch, sample) trained in several attempts (a step redone after a kill, on
    another rank count) had the same augmented features each time."""
    seen: dict[tuple[int, int], list[float]] = {}
    for path in member_dir.glob("ids-a*-r*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            for index, x in zip(row["ids"], row["x"], strict=True):
                if seen.setdefault((row["epoch"], index), x) != x:
                    return False
    return True


def resumes(member_dir: Path) -> list[dict[str, Any]]:
    """Each attempt's first step and the seconds from its restored state to its first batch."""
    found = sorted(member_dir.glob("resume-a*.json"), key=lambda path: int(path.stem.split("-a")[1]))
    return [{"attempt": int(path.stem.split("-a")[1]), **json.loads(path.read_text())} for path in found]


def loaded(member_dir: Path, attempt: int) -> list[int]:
    """The ids of the samples attempt ``attempt`` loaded, over its ranks and workers."""
    ids: list[int] = []
    for path in member_dir.glob(f"calls-a{attempt}-r*"):
        ids += [int(line) for line in path.read_text().split()]
    return ids
