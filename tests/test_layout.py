"""The state skeleton round trip and the balanced shard plan."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from resilient_flows.checkpoint import CheckpointError
from resilient_flows.checkpoint._boxes import Box, HeldBox
from resilient_flows.checkpoint._tree import flatten, unflatten
from resilient_flows.checkpoint._writeplan import MIN_PIECE_BYTES, WriteItem, plan_writes
from resilient_flows.checkpoint._writeplan import ArraySpec as WriteSpec


def test_skeleton_round_trips_types_json_would_lose() -> None:
    state = {
        "state": {0: {"step": torch.tensor(3.0)}, "0": 1},
        "groups": [{"params": [0, 1], "betas": (0.9, 0.999), "lr": 0.1, "amsgrad": False, "name": None}],
        "np": np.float32(1.5),
        "specials": [float("inf"), float("-inf"), float("nan")],
        "arr": np.arange(3),
    }
    skeleton, arrays = flatten(state)
    back = unflatten(json.loads(json.dumps(skeleton, allow_nan=False)), arrays)
    assert list(back["state"]) == [0, "0"]
    assert back["groups"][0]["betas"] == (0.9, 0.999) and isinstance(back["groups"][0]["betas"], tuple)
    assert isinstance(back["np"], np.float32) and back["np"] == np.float32(1.5)
    assert back["specials"][:2] == [math.inf, -math.inf] and math.isnan(back["specials"][2])
    assert back["arr"] is state["arr"] and back["state"][0]["step"] is state["state"][0]["step"]


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"x": {1.5: 2}}, "keys must be str or int"),
        ({"x": object()}, "cannot checkpoint x of type object"),
        ({"x": np.array([object()])}, "object arrays would need pickle"),
        ({"x": torch.zeros(2).to_sparse()}, "only dense tensors"),
        ({1: torch.zeros(1), "1": torch.zeros(1)}, "same name '1'"),
    ],
)
def test_unsupported_leaves_name_their_key(state: dict, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        flatten(state)


def specs_of(sizes: list[int], world: int) -> list[WriteSpec]:
    """Replicated 1-D arrays, held whole by every rank."""
    return [replicated(f"t{i}", torch.float32, (n,), world) for i, n in enumerate(sizes)]


def replicated(name: str, dtype: torch.dtype, shape: tuple[int, ...], world: int) -> WriteSpec:
    return WriteSpec(name, dtype, shape, (HeldBox(Box.whole(shape), tuple(range(world))),))


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_plan_covers_every_element_once_and_balances_bytes(world: int) -> None:
    rng = np.random.default_rng(world)
    # one huge embedding plus many small layers: balancing by count would fail here
    sizes = [50000000, *rng.integers(1, 2000000, size=40).tolist()]
    specs = specs_of(sizes, world)
    plan = plan_writes(specs, world)
    covered: dict[str, list[tuple[int, int]]] = {}
    loads = []
    for items in plan:
        loads.append(sum(item.nbytes for item in items))
        for item in items:
            covered.setdefault(item.name, []).append((item.box.offsets[0], item.box.offsets[0] + item.box.lengths[0]))
    for spec in specs:
        ranges = sorted(covered[spec.name])
        assert ranges[0][0] == 0 and ranges[-1][1] == spec.shape[0]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    average = sum(loads) / world
    assert max(loads) <= average * 1.25 + MIN_PIECE_BYTES


def test_plan_is_deterministic_and_keys_are_unique_per_shard() -> None:
    specs = specs_of([10_000_000, 3, 7_000_000], 3)
    assert plan_writes(specs, 3) == plan_writes(list(reversed(specs)), 3)
    for items in plan_writes(specs, 3):
        assert len({item.key for item in items}) == len(items)


def test_plan_orders_wide_dtypes_first_for_alignment() -> None:
    specs = [
        replicated("b", torch.uint8, (3,), 1),
        replicated("d", torch.float64, (2,), 1),
        replicated("h", torch.float16, (5,), 1),
    ]
    (items,) = plan_writes(specs, 1)
    assert [item.name for item in items] == ["d", "h", "b"]


def _tiles_once(spec: WriteSpec, items: list[WriteItem]) -> bool:
    covered = torch.zeros(spec.shape, dtype=torch.int32)
    for item in items:
        covered[tuple(slice(o, o + n) for o, n in zip(item.box.offsets, item.box.lengths, strict=True))] += 1
    return bool((covered == 1).all())


def test_write_plan_tiles_sharded_and_replicated_boxes_once_and_shares_replicas() -> None:
    """HSDP-like layout on 4 ranks: rows sharded over 2 groups, each shard replicated on 2 ranks."""
    whole = WriteSpec("embed", torch.float32, (4096, 512), (HeldBox(Box.whole((4096, 512)), (0, 1, 2, 3)),))
    top, bottom = Box((0, 0), (1500, 700)), Box((1500, 0), (1499, 700))  # uneven
    sharded = WriteSpec("w", torch.bfloat16, (2999, 700), (HeldBox(top, (0, 2)), HeldBox(bottom, (1, 3))))
    scalar = WriteSpec("step", torch.float32, (), (HeldBox(Box.whole(()), (0, 1, 2, 3)),))
    plan = plan_writes([whole, sharded, scalar], 4)
    items = [item for rank in plan for item in rank]
    for spec in (whole, sharded, scalar):
        assert _tiles_once(spec, [i for i in items if i.name == spec.name])
    for rank, rank_items in enumerate(plan):  # a piece goes only to a rank that holds it
        for item in rank_items:
            if item.name == "w":
                assert rank in ((0, 2) if item.box.offsets[0] < 1500 else (1, 3))
    loads = [sum(i.nbytes for i in rank_items) for rank_items in plan]
    assert sum(loads) == whole.nbytes + sharded.nbytes + scalar.nbytes  # nothing written twice
    assert max(loads) <= sum(loads) / 4 * 1.25 + MIN_PIECE_BYTES
    assert plan == plan_writes([scalar, sharded, whole], 4)  # every rank computes the same plan
    assert len({i.key for i in items}) == len(items)
