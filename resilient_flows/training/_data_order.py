"""The global sample order of a resumable loader, as pure functions of (seed, epoch, dataset length).

Nothing here depends on the number of ranks: the order of an epoch, where its global batches
start and end, and the seed of each sample's augmentation are the same on 1 rank or 64. Only
:func:`rank_share` knows the world size, and it cuts one global batch into contiguous pieces, so
that the union of the ranks' pieces is that batch exactly, whatever the rank count.
"""

from __future__ import annotations

import hashlib

import torch

_SEED_MASK = (1 << 63) - 1


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed that depends on ``parts`` only: not on the process, rank, worker or platform.

    A hash, not ``seed + epoch``: neighbouring seeds would otherwise give neighbouring (and
    correlated) streams, and two epochs of two seeds could collide.
    """
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _SEED_MASK


def epoch_order(length: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    """The dataset indices of ``epoch`` in the order they are trained (int64, on the CPU)."""
    if not shuffle:
        return torch.arange(length, dtype=torch.int64)
    generator = torch.Generator().manual_seed(derive_seed(seed, "order", epoch))
    return torch.randperm(length, generator=generator)


def epoch_end(length: int, batch_size: int, drop_last: bool) -> int:
    """How many samples of the global order an epoch trains: all, or whole global batches only."""
    return length - length % batch_size if drop_last else length


def batches_per_epoch(length: int, batch_size: int, drop_last: bool) -> int:
    """Global batches in one epoch (the same on every rank)."""
    return -(-epoch_end(length, batch_size, drop_last) // batch_size)


def rank_share(batch_len: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous piece of a global batch of ``batch_len`` samples.

    When ``world_size`` does not divide the batch, the first pieces are one sample shorter than
    the last ones (``batch_len * rank // world_size`` is where each starts).
    """
    return slice(batch_len * rank // world_size, batch_len * (rank + 1) // world_size)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of the generators while sample ``index`` of ``epoch`` is loaded (its augmentation)."""
    return derive_seed(seed, "sample", epoch, index)
