"""The corpus and its byte windows as a map-style dataset, for a shuffled loader whose place in
the epoch is part of every checkpoint (``ctx.loader``).

**The corpus** is the Python language reference that every CPython installation ships for
``help()``: the module ``pydoc_data.topics`` (about 460 KB of English prose and code in 3.11;
PSF License, as Python itself). It needs no download and no file in this package, on a laptop
or a compute node without network. It changes between Python versions, so losses are
comparable between runs on the same Python only; :func:`corpus_digest` names the text a run
trained on. The last tenth is held out for evaluation.

**Exact resume** is the library's: ``ctx.loader`` draws each epoch's order from (seed, epoch)
and keeps the position in the epoch in every checkpoint, so a resumed member sees exactly the
batches an uninterrupted one would, without loading the ones it skips.
"""

from __future__ import annotations

import functools
import hashlib
import multiprocessing

import torch
from torch.utils.data import Dataset

__all__ = ["START_METHOD", "ByteWindows", "corpus", "corpus_digest", "split"]

HELD_OUT = 0.1
#: How the loader starts its workers (``multiprocessing_context``). A worker of a warm pool is a
#: fork server's child, whose default would start a fork server of its own, a fresh interpreter
#: importing torch, at each attempt: 16-22 s before the first step on a loaded 2-core machine,
#: against milliseconds for a fork. The workers only slice a tensor, which is safe in a forked
#: child of a threaded process.
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
