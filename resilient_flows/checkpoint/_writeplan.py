"""What each rank writes: every distinct box of the state exactly once, balanced by bytes.

The write plan sees each array as the boxes its ranks hold (:mod:`resilient_flows.checkpoint._boxes`):
one box held by every rank for replicated state, one box per shard for a ``DTensor``. A box with a
single holder is written by that holder. A box held by several ranks (replicated state, or a
``Replicate`` placement of a mesh dimension) is cut along its first dimension into pieces, and
each piece goes to the least-loaded of its holders, largest first (LPT scheduling). That bounds
every rank's load by the average plus one piece where the holders allow it, and never writes a
byte twice. The plan depends only on names, dtypes, shapes and placements, so every rank computes
the same plan without talking to the others.

Contract: ``plan_writes(specs, n)[r]`` lists what rank ``r`` writes, in the order the pieces are
laid out in its shard file (widest dtype first, so that packing them back to back keeps every
piece aligned); the pieces of all ranks tile every array's global shape exactly once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from resilient_flows.checkpoint._boxes import Box, HeldBox
from resilient_flows.checkpoint._tree import Leaf, dtype_of

#: Boxes shared by several ranks are cut so that no piece exceeds this fraction of one rank's share.
PIECE_FRACTION = 0.25
#: ...but pieces smaller than this are not worth a separate entry.
MIN_PIECE_BYTES = 1 << 20


@dataclass(frozen=True)
class ArraySpec:
    """One array leaf of the state: its global shape and the boxes its ranks hold."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    held: tuple[HeldBox, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class WriteItem:
    """The box ``box`` of array ``name``, written by one rank under ``key`` in its shard file."""

    name: str
    dtype: torch.dtype
    box: Box
    whole: bool

    @property
    def key(self) -> str:
        return self.name if self.whole else f"{self.name}@{','.join(map(str, self.box.offsets))}"

    @property
    def nbytes(self) -> int:
        return self.box.numel * self.dtype.itemsize


def array_specs(arrays: Mapping[str, Leaf], held: Callable[[str, Leaf], Sequence[HeldBox]]) -> tuple[ArraySpec, ...]:
    """The write plan's view of ``arrays``; ``held(name, leaf)`` says who holds which box of each
    (:func:`~resilient_flows.checkpoint._boxes.held_boxes`, which a caller may cache)."""
    return tuple(
        ArraySpec(name, dtype_of(name, leaf), tuple(leaf.shape), tuple(held(name, leaf)))
        for name, leaf in arrays.items()
    )


def whole_items(arrays: Mapping[str, Leaf]) -> list[WriteItem]:
    """Arrays that one rank alone holds and writes whole (its per-rank values), as plan items."""
    return [WriteItem(name, dtype_of(name, leaf), Box.whole(tuple(leaf.shape)), True) for name, leaf in arrays.items()]


def plan_writes(specs: Sequence[ArraySpec], world_size: int) -> list[list[WriteItem]]:
    """What each rank writes, each list in the order the rank lays its pieces out."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    share = sum(sum(h.box.numel for h in s.held) * s.dtype.itemsize for s in specs) / world_size
    limit = max(share * PIECE_FRACTION, MIN_PIECE_BYTES)
    loads = [0] * world_size
    assigned: list[list[WriteItem]] = [[] for _ in range(world_size)]
    shared: list[tuple[WriteItem, tuple[int, ...]]] = []
    for spec in specs:
        for held in spec.held:
            for rank in held.holders:
                if not 0 <= rank < world_size:
                    raise ValueError(f"{spec.name!r} is held by rank {rank}, outside a group of {world_size}")
            whole = held.box == Box.whole(spec.shape)
            if len(held.holders) == 1:
                item = WriteItem(spec.name, spec.dtype, held.box, whole)
                assigned[held.holders[0]].append(item)
                loads[held.holders[0]] += item.nbytes
            else:
                shared += [(item, held.holders) for item in _cut(spec, held.box, whole, limit)]
    for item, holders in sorted(shared, key=lambda p: (-p[0].nbytes, p[0].name, p[0].box.offsets)):
        rank = min(holders, key=lambda r: (loads[r], r))
        assigned[rank].append(item)
        loads[rank] += item.nbytes
    return [shard_order(items) for items in assigned]


def shard_order(items: Sequence[WriteItem]) -> list[WriteItem]:
    """Widest dtypes first, so that packing pieces back to back keeps every one aligned."""
    return sorted(items, key=lambda p: (-p.dtype.itemsize, p.name, p.box.offsets))


def _cut(spec: ArraySpec, box: Box, whole: bool, limit: float) -> list[WriteItem]:
    """``box`` in row ranges of at most ``limit`` bytes (whole rows; a 0-d box stays one piece)."""
    nbytes = box.numel * spec.dtype.itemsize
    rows = box.lengths[0] if box.lengths else 1
    count = min(rows, max(1, math.ceil(nbytes / limit)))
    if count == 1:
        return [WriteItem(spec.name, spec.dtype, box, whole)]
    step = math.ceil(rows / count)
    return [WriteItem(spec.name, spec.dtype, box.rows(lo, min(lo + step, rows)), False) for lo in range(0, rows, step)]
