"""What a transport that moves a training state between ranks, without files, needs from the engine.

A transport (the MPI clone transport) owns the wire: messages, their order, what it sends as
metadata. The engine owns the state, split as DCP splits a planner from its storage:

- the plan side: :func:`plan_send` flattens a holder's state and gives it its share by the plan a
  checkpoint is written by (each distinct box once, replicated bytes balanced over the holders,
  every rank its own shards), with the layout of every array to announce; on the other end
  :func:`check_pieces` checks that the pieces all holders announced tile every array exactly
  once, since they come from other processes;
- the target side: :class:`Destination` finds, for every array, the live tensor to receive into in
  the receiver's own layout (any rank count, any parallelism, resharding as a restore does), says
  which part of each piece this rank needs, and where raw bytes of that part may land.

So a transport never touches skeletons, boxes' holders or restore targets, and the engine's
writer and reader use the same planning and landing functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from resilient_flows.checkpoint._boxes import Box, held_boxes, piece_of
from resilient_flows.checkpoint._flat import FlatState, flatten_state
from resilient_flows.checkpoint._manifest import ArrayRecord, PieceRecord, check_cover
from resilient_flows.checkpoint._reader import Target, live_arrays
from resilient_flows.checkpoint._state import Stateful, TrainState
from resilient_flows.checkpoint._tree import Leaf
from resilient_flows.checkpoint._writeplan import ArraySpec, WriteItem, array_specs, plan_writes, whole_items


@dataclass(frozen=True)
class SendPlan:
    """What one holder of a state sends: ``items``, its share of the arrays (each a box of one
    array, in the order it sends them), and ``local_items``, its per-rank arrays whole; ``specs``
    (name, dtype, global shape of every array) and the skeletons in ``flat`` are what a receiver
    must be told to rebuild the state."""

    flat: FlatState
    specs: tuple[ArraySpec, ...]
    items: list[WriteItem]
    local_items: list[WriteItem]

    def views(self, local: bool) -> list[torch.Tensor]:
        """Live views of the items, then (with ``local``) of the per-rank arrays: no copies but
        for numpy arrays with negative strides, so the state must not change while they are read."""
        views = [piece_of(self.flat.arrays[item.name], item.box) for item in self.items]
        if local:
            views += [piece_of(self.flat.local_arrays[item.name], item.box) for item in self.local_items]
        return views


def plan_send(state: Mapping[str, Any], group_ranks: Sequence[int], index: int) -> SendPlan:
    """The share of ``state`` that holder ``index`` of ``group_ranks`` sends.

    ``group_ranks`` are the holders' global ranks in the same order on every holder; a
    ``DTensor``'s device mesh must consist of them. Every holder computes the whole plan from
    names, dtypes, shapes and placements alone, so the holders agree without talking.
    """
    flat = flatten_state(state)
    ranks = list(group_ranks)
    specs = array_specs(flat.arrays, lambda _name, leaf: held_boxes(leaf, ranks))
    return SendPlan(flat, specs, plan_writes(specs, len(ranks))[index], whole_items(flat.local_arrays))


def check_pieces(
    arrays: Mapping[str, tuple[torch.dtype, tuple[int, ...]]], pieces: Sequence[Sequence[tuple[str, Box]]]
) -> dict[str, ArrayRecord]:
    """Every array (name -> dtype, global shape) with the pieces announced by each holder
    (``pieces[i]``, in holder ``i``'s order); ValueError unless they tile every array exactly once."""
    records = {name: ArrayRecord(dtype, shape, []) for name, (dtype, shape) in arrays.items()}
    for i, held in enumerate(pieces):
        for j, (name, box) in enumerate(held):
            if name not in records:
                raise ValueError(f"holder {i} announces a piece of {name!r}, which the layout lacks")
            records[name].pieces.append(PieceRecord(i, str(j), box, ""))
    for name, record in records.items():
        check_cover(name, record, len(pieces))
    return records


class Destination:
    """Where a state that arrives piece by piece lands on this rank, in this rank's own layout.

    Each array goes into the live tensor of ``into`` where that can take it in place (model
    parameters, existing optimizer moments, this rank's shard of a ``DTensor``), into a fresh
    tensor otherwise. Building one raises :class:`~resilient_flows.errors.StateMismatchError`
    when the announced state (``records`` from :func:`check_pieces`, ``skeleton``) does not fit
    ``into``; ``where`` and ``ours`` name the two states in its message. Building one may create
    optimizer state in a ``TrainState``: :func:`discard_target` undoes that if nothing arrives.
    """

    def __init__(
        self, records: Mapping[str, ArrayRecord], skeleton: dict, into: Stateful | None, where: str, ours: str
    ) -> None:
        live = live_arrays(into, records, skeleton, where, ours)
        self._targets = {name: Target.of(record, live.get(name)) for name, record in records.items()}
        self._relays: list[tuple[torch.Tensor, torch.Tensor]] = []

    def needs(self, name: str, box: Box) -> Box | None:
        """The part of the piece ``box`` of array ``name`` that this rank holds; None if none."""
        return box.intersect(self._targets[name].box)

    def landing(self, name: str, part: Box) -> torch.Tensor:
        """Contiguous host memory for the raw bytes of ``part`` (as :meth:`needs` gave it): the
        destination itself where the part lies there whole, else a buffer that :meth:`arrays`
        copies into place (a device tensor, another sharding)."""
        region, buffer = self._targets[name].landing(part)
        if buffer is not region:
            self._relays.append((buffer, region))
        return buffer

    def arrays(self) -> dict[str, Leaf]:
        """Once every landing holds its bytes: buffered parts copied into place, the arrays by name."""
        with torch.no_grad():
            for buffer, region in self._relays:
                region.copy_(buffer)
        for target in self._targets.values():
            target.finish()
        return {name: target.result for name, target in self._targets.items()}


def discard_target(into: Stateful | None) -> None:
    """Undo what building a :class:`Destination` over ``into`` created, when nothing is received."""
    if isinstance(into, TrainState):
        into.discard_restore_target()
