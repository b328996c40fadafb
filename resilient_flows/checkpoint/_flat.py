"""A state dict as its skeleton and arrays, with the per-rank part kept apart.

Every rank's state holds values that only that rank has (RNG states, a data position) under
:data:`~resilient_flows.checkpoint._state.RANK_LOCAL`. Whoever moves a state, to a shard file or
to another rank, plans the shared arrays across the ranks and handles the per-rank ones on their
own; this module makes that split, and joins the two again, in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resilient_flows.checkpoint._state import RANK_LOCAL
from resilient_flows.checkpoint._tree import Leaf, flatten, unflatten


@dataclass(frozen=True)
class FlatState:
    """``skeleton`` and ``arrays`` of the state but its per-rank part, and those of that part
    (``local_skeleton`` is empty when the state has none)."""

    skeleton: dict
    arrays: dict[str, Leaf]
    local_skeleton: dict
    local_arrays: dict[str, Leaf]


def flatten_state(state: Mapping[str, Any], local_prefix: str = RANK_LOCAL) -> FlatState:
    """Flatten ``state``; the arrays of its per-rank part are named under ``local_prefix``."""
    full = dict(state)
    local_state = full.pop(RANK_LOCAL, None)
    skeleton, arrays = flatten(full)
    local_skeleton, local_arrays = ({}, {}) if local_state is None else flatten(local_state, local_prefix)
    return FlatState(skeleton, arrays, local_skeleton, local_arrays)


def unflatten_state(skeleton: dict, local_skeleton: dict | None, arrays: Mapping[str, Leaf]) -> dict[str, Any]:
    """The nested state again, with the per-rank part under ``RANK_LOCAL`` when there is one;
    ``arrays`` holds the arrays of both skeletons."""
    state = unflatten(skeleton, arrays)
    if local_skeleton:
        state[RANK_LOCAL] = unflatten(local_skeleton, arrays)
    return state
