"""Balanced assignment of replicated arrays to data-parallel ranks.

Every rank holds the same replicated state, so any rank can write any array. We want each rank to
write about ``1/N`` of the *bytes*: a model with one huge embedding and many small layers would be
badly balanced by count. Arrays larger than a fraction of the per-rank share are cut into element
ranges ("pieces"), then pieces go to the least-loaded rank, largest first (LPT scheduling), which
bounds every rank's load by the average plus one piece. The plan depends only on names, dtypes and
shapes, so every rank computes the same plan without talking to the others.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["ArraySpec", "Piece", "plan_shards", "shard_order"]

#: Arrays are cut so that no piece exceeds this fraction of one rank's share.
PIECE_FRACTION = 0.25
#: ...but pieces smaller than this are not worth a separate entry.
MIN_PIECE_BYTES = 1 << 20


@dataclass(frozen=True)
class ArraySpec:
    """What the planner needs to know of one array leaf."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class Piece:
    """Elements ``[start, stop)`` of the flattened array ``name``; the key it has in a shard file."""

    name: str
    start: int
    stop: int
    whole: bool

    @property
    def key(self) -> str:
        return self.name if self.whole else f"{self.name}@{self.start}"


def plan_shards(specs: Sequence[ArraySpec], world_size: int) -> list[list[Piece]]:
    """Pieces per rank, each list in the order the rank lays them out in its shard."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    pieces = _cut(specs, world_size)
    itemsizes = {s.name: s.itemsize for s in specs}
    size = {p: (p.stop - p.start) * itemsizes[p.name] for p in pieces}
    loads = [(0, rank) for rank in range(world_size)]
    assigned: list[list[Piece]] = [[] for _ in range(world_size)]
    for piece in sorted(pieces, key=lambda p: (-size[p], p.name, p.start)):
        load, rank = heapq.heappop(loads)
        assigned[rank].append(piece)
        heapq.heappush(loads, (load + size[piece], rank))
    return [shard_order(rank_pieces, itemsizes) for rank_pieces in assigned]


def shard_order(pieces: Sequence[Piece], itemsizes: dict[str, int]) -> list[Piece]:
    """Widest dtypes first, so that packing pieces back to back keeps every one aligned."""
    return sorted(pieces, key=lambda p: (-itemsizes[p.name], p.name, p.start))


def _cut(specs: Sequence[ArraySpec], world_size: int) -> list[Piece]:
    if world_size == 1:
        return [Piece(s.name, 0, s.numel, True) for s in specs]
    share = sum(s.nbytes for s in specs) / world_size
    limit = max(share * PIECE_FRACTION, MIN_PIECE_BYTES)
    pieces = []
    for s in specs:
        count = max(1, math.ceil(s.nbytes / limit))
        if count == 1:
            pieces.append(Piece(s.name, 0, s.numel, True))
            continue
        step = math.ceil(s.numel / count)
        pieces += [Piece(s.name, lo, min(lo + step, s.numel), False) for lo in range(0, s.numel, step)]
    return pieces
