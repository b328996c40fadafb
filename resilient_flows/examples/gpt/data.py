"""The corpus, its byte windows as a map-style dataset, and a shuffled ``DataLoader`` whose place
in the epoch is part of the checkpoint.

**The corpus** is the Python language reference that every CPython installation ships for
``help()``: the module ``pydoc_data.topics`` (about 460 KB of English prose and code in 3.11;
PSF License, as Python itself). It needs no download and no file in this package, on a laptop
or a compute node without network. It changes between Python versions, so losses are
comparable between runs on the same Python only; :func:`corpus_digest` names the text a run
trained on. The last tenth is held out for evaluation.

**Exact resume.** A ``DataLoader(shuffle=True)`` draws a new permutation at every ``iter()``
and restarts its epoch on resume. :class:`EpochSampler` draws the epoch's permutation from
(seed, epoch) and starts at a given place in it, so a resumed member sees exactly the batches
an uninterrupted one would, in O(1) and without loading the batches it skips; the loader's
worker seeds come from a generator seeded the same way. The position is a dict of two ints
(``epoch``, ``sample``: samples of the epoch consumed) that ``ctx.track(extra=...)`` checkpoints.
"""

from __future__ import annotations

import functools
import hashlib
import multiprocessing
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

__all__ = ["ByteWindows", "EpochSampler", "ResumableBatches", "corpus", "corpus_digest", "split"]

HELD_OUT = 0.1
#: How the loader starts its workers. A worker of a warm pool is a fork server's child, whose
#: default would start a fork server of its own, a fresh interpreter importing torch, at each
#: attempt: 16-22 s before the first step on a loaded 2-core machine, against milliseconds for a
#: fork. The workers only slice a tensor, which is safe in a forked child of a threaded process.
START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else None


@functools.cache
def corpus() -> bytes:
    """The Python reference's topics, in the order of their names, as UTF-8."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics)).encode("utf-8")


def corpus_digest() -> str:
    return hashlib.sha256(corpus()).hexdigest()[:16]


def split() -> tuple[torch.Tensor, torch.Tensor]:
    """(training bytes, held-out bytes): the first nine tenths and the last tenth."""
    data = torch.frombuffer(bytearray(corpus()), dtype=torch.uint8)
    cut = int(len(data) * (1 - HELD_OUT))
    return data[:cut], data[cut:]


class ByteWindows(Dataset):
    """Sample ``i``: the ``block`` bytes from ``i * block`` and the same shifted by one (the targets)."""

    def __init__(self, data: torch.Tensor, block: int) -> None:
        self.data, self.block = data, block

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.block
        window = self.data[start : start + self.block + 1].long()
        return window[:-1], window[1:]


def _epoch_seed(seed: int, epoch: int, stream: int) -> int:
    return (seed * 1_000_003 + epoch) * 2 + stream


class EpochSampler(Sampler[int]):
    """A shuffle of ``n`` samples whose order is a function of (seed, epoch), from ``start`` on."""

    def __init__(self, n: int, seed: int, epoch: int = 0, start: int = 0) -> None:
        self.n, self.seed, self.epoch, self.start = n, seed, epoch, start

    def __len__(self) -> int:
        return self.n - self.start

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(_epoch_seed(self.seed, self.epoch, 0))
        return iter(torch.randperm(self.n, generator=generator)[self.start :].tolist())


class ResumableBatches:
    """Batches of a shuffled ``DataLoader``, epoch after epoch, that keep ``position`` up to date.

    ``position`` (``{"epoch": 0, "sample": 0}``, restored in place by ``ctx.track``) counts the
    samples the caller consumed, not those the workers prefetched, so a checkpoint taken between
    two steps holds exactly where the next batch starts. Incomplete last batches are dropped.
    """

    def __init__(
        self, dataset: Dataset, batch_size: int, seed: int, position: dict[str, Any], num_workers: int = 2
    ) -> None:
        if len(dataset) < batch_size:
            raise ValueError(f"batch_size {batch_size} is more than the {len(dataset)} samples of an epoch")
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.position, self.num_workers = position, num_workers
        self._batches: Iterator[Any] | None = None

    def __iter__(self) -> ResumableBatches:
        return self

    def __next__(self) -> Any:
        if self._batches is None:
            self._batches = iter(self._loader())
        batch = next(self._batches)
        self.position["sample"] += self.batch_size
        if self.position["sample"] + self.batch_size > len(self.dataset):  # the epoch's last full batch
            self.position["epoch"] += 1
            self.position["sample"] = 0
            self._batches = None
        return batch

    def _loader(self) -> DataLoader:
        epoch, start = self.position["epoch"], self.position["sample"]
        return DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=EpochSampler(len(self.dataset), self.seed, epoch, start),
            num_workers=self.num_workers,
            drop_last=True,
            multiprocessing_context=START_METHOD if self.num_workers else None,
            generator=torch.Generator().manual_seed(_epoch_seed(self.seed, epoch, 1)),
        )
