"""Chunk boxes: where a piece of an array lies in the global array, and who holds which piece.

A box is an N-dimensional slice ``[offset, offset + length)`` per dimension of the *global* array.
A plain tensor held by every rank is one box covering all of it; a ``DTensor`` is one box per
distinct local shard, held by the ranks whose mesh coordinates differ only in replicated mesh
dimensions. Saving records the boxes written; restoring intersects them with the boxes the target
ranks hold, so that any layout can be read into any other (DCP's chunk metadata, the same idea).

The boxes of a DTensor are computed on every rank from its global shape, mesh and placements
alone, without talking to the other ranks, so that planning stays collective-free.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np
import torch

from resilient_flows.checkpoint._tree import Leaf

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class Box:
    """``offsets[d] <= i < offsets[d] + lengths[d]`` for every dimension ``d``."""

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]

    @classmethod
    def whole(cls, shape: tuple[int, ...]) -> Box:
        return cls((0,) * len(shape), tuple(shape))

    @property
    def numel(self) -> int:
        return math.prod(self.lengths)

    def intersect(self, other: Box) -> Box | None:
        """The common part, or None when it is empty."""
        lo = tuple(max(a, b) for a, b in zip(self.offsets, other.offsets, strict=True))
        hi = tuple(
            min(a + n, b + m)
            for a, n, b, m in zip(self.offsets, self.lengths, other.offsets, other.lengths, strict=True)
        )
        if any(h <= low for low, h in zip(lo, hi, strict=True)):
            return None
        return Box(lo, tuple(h - low for low, h in zip(lo, hi, strict=True)))

    def within(self, outer: Box) -> tuple[slice, ...]:
        """Index of this box inside a tensor that holds exactly ``outer``."""
        return tuple(slice(o - p, o - p + n) for o, n, p in zip(self.offsets, self.lengths, outer.offsets, strict=True))

    def rows(self, start: int, stop: int) -> Box:
        """Rows ``[start, stop)`` of this box along its first dimension (0-d boxes have one)."""
        if not self.lengths:
            return self
        return Box((self.offsets[0] + start, *self.offsets[1:]), (stop - start, *self.lengths[1:]))


@dataclass(frozen=True)
class HeldBox:
    """A box and the ranks (of the checkpoint's communicator) that hold identical copies of it."""

    box: Box
    holders: tuple[int, ...]


def is_dtensor(leaf: Any) -> TypeGuard[DTensor]:
    """True for a ``torch.distributed.tensor.DTensor`` (without importing it where unavailable)."""
    cls = type(leaf)
    return isinstance(leaf, torch.Tensor) and cls.__name__ == "DTensor" and hasattr(leaf, "placements")


def dtensor_local(leaf: DTensor) -> torch.Tensor:
    """The local shard of a DTensor, as a plain tensor that aliases it.

    ``to_local()`` goes through an autograd function on every call (tens of microseconds per
    leaf, on the stall's critical path); the attribute it returns is read directly where present.
    """
    local = getattr(leaf, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else leaf.to_local()


def local_box(leaf: Leaf) -> Box:
    """The part of the global array this rank's ``leaf`` holds."""
    if not is_dtensor(leaf):
        return Box.whole(tuple(leaf.shape))
    mesh = leaf.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError("this rank is not part of the DTensor's device mesh")
    return _box_at(tuple(leaf.shape), tuple(mesh.shape), coordinate, leaf.placements)


def piece_of(leaf: Leaf, box: Box, held: Box | None = None) -> torch.Tensor:
    """The part ``box`` of the global array as a view of this rank's ``leaf``, which holds ``held``
    (default: its :func:`local_box`); a copy only for numpy arrays with negative strides, which
    torch cannot view. Writing a checkpoint and sending a state both copy pieces out of these views.
    """
    if isinstance(leaf, np.ndarray):
        local = torch.from_numpy(leaf if all(stride >= 0 for stride in leaf.strides) else leaf.copy())
        held = Box.whole(tuple(leaf.shape)) if held is None else held
    else:
        local = (dtensor_local(leaf) if is_dtensor(leaf) else leaf).detach()
        held = local_box(leaf) if held is None else held
    return local if box == held else local[box.within(held)]


def held_boxes(leaf: Leaf, group_ranks: list[int]) -> list[HeldBox]:
    """Every distinct non-empty box of ``leaf`` and its holders, as ranks of the checkpoint group.

    ``group_ranks[i]`` is the global (default-group) rank of the group's rank ``i``; a plain
    tensor is held whole by every rank of the group.
    """
    shape = tuple(leaf.shape)
    if not is_dtensor(leaf):
        whole = Box.whole(shape)
        return [HeldBox(whole, tuple(range(len(group_ranks))))] if whole.numel else []
    mesh = leaf.device_mesh
    layout = mesh.mesh  # global ranks, shaped like the mesh
    position = {g: i for i, g in enumerate(group_ranks)}
    holders: dict[Box, list[int]] = {}
    for coordinate in itertools.product(*(range(n) for n in layout.shape)):
        global_rank = int(layout[coordinate])
        if global_rank not in position:
            raise ValueError(
                f"rank {global_rank} of the DTensor's device mesh is not in the checkpoint's group {group_ranks}"
            )
        box = _box_at(shape, tuple(layout.shape), list(coordinate), leaf.placements)
        if box.numel:
            holders.setdefault(box, []).append(position[global_rank])
    return [HeldBox(box, tuple(sorted(ranks))) for box, ranks in holders.items()]


def _box_at(shape: tuple[int, ...], mesh_shape: tuple[int, ...], coordinate: Sequence[int], placements: Any) -> Box:
    # The one private helper we rely on: PyTorch's own rule for where a mesh coordinate's shard
    # lies (uneven chunks and strided sharding included), the same one DCP's metadata uses.
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    lengths, offsets = _compute_local_shape_and_global_offset(shape, mesh_shape, list(coordinate), placements)
    return Box(tuple(int(o) for o in offsets), tuple(int(n) for n in lengths))
