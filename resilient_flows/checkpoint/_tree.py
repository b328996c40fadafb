"""Split a nested state into a JSON skeleton and a flat table of arrays.

A ``state_dict()`` is a tree of dicts, lists and tuples whose leaves are tensors, numpy arrays and
plain scalars. Tensors go to safetensors shards; everything else must survive a JSON round trip
exactly, including the difference between ``{0: ...}`` and ``{"0": ...}`` (optimizer state uses
integer keys) and between lists and tuples. The skeleton records that structure; each array leaf
is replaced by the name under which its data is stored.

Skeleton nodes are one-key JSON objects::

    {"dict": [[key, node], ...]}   key is a JSON string or integer
    {"list": [node, ...]}          {"tuple": [node, ...]}
    {"tensor": name}               {"ndarray": name}
    {"value": scalar}              {"npscalar": [dtype, scalar]}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from resilient_flows.errors import CheckpointError, StateMismatchError

Leaf = torch.Tensor | np.ndarray


def flatten(state: Any, prefix: str = "") -> tuple[dict, dict[str, Leaf]]:
    """Return ``(skeleton, arrays)``; ``arrays`` maps stable path names to the live leaves."""
    arrays: dict[str, Leaf] = {}
    skeleton = _flatten(state, prefix, arrays)
    return skeleton, arrays


def _flatten(node: Any, path: str, arrays: dict[str, Leaf]) -> dict:
    if isinstance(node, torch.Tensor):
        if node.layout != torch.strided or node.is_quantized:
            raise CheckpointError(f"cannot checkpoint {path or 'state'}: only dense tensors are supported")
        return {"tensor": _register(path, node, arrays)}
    if isinstance(node, np.ndarray):
        if node.dtype.hasobject:
            raise CheckpointError(f"cannot checkpoint {path or 'state'}: object arrays would need pickle")
        return {"ndarray": _register(path, node, arrays)}
    if isinstance(node, np.generic):
        return {"npscalar": [node.dtype.str, node.item()]}
    if node is None or isinstance(node, bool | int | str):
        return {"value": node}
    if isinstance(node, float):
        return {"value": node} if math.isfinite(node) else {"value": {"float": repr(node)}}
    if isinstance(node, Mapping):
        items = []
        for key, value in node.items():
            if not isinstance(key, str | int) or isinstance(key, bool):
                raise CheckpointError(f"cannot checkpoint key {key!r} under {path or 'state'}: keys must be str or int")
            items.append([key, _flatten(value, _join(path, key), arrays)])
        return {"dict": items}
    if isinstance(node, list | tuple):
        kind = "list" if isinstance(node, list) else "tuple"
        return {kind: [_flatten(v, _join(path, i), arrays) for i, v in enumerate(node)]}
    raise CheckpointError(
        f"cannot checkpoint {path or 'state'} of type {type(node).__name__}: "
        "leaves must be tensors, numpy arrays, or JSON scalars"
    )


def _join(path: str, key: str | int) -> str:
    return f"{path}/{key}" if path else str(key)


def _register(path: str, leaf: Leaf, arrays: dict[str, Leaf]) -> str:
    if path in arrays:
        raise CheckpointError(f"two leaves of the state map to the same name {path!r} (keys 1 and '1'?)")
    arrays[path] = leaf
    return path


def unflatten(skeleton: dict, arrays: Mapping[str, Leaf]) -> Any:
    """Rebuild the nested state from ``arrays``; leaves saved from numpy come back as numpy."""
    ((kind, body),) = skeleton.items()
    if kind == "tensor":
        return arrays[body]
    if kind == "ndarray":
        leaf = arrays[body]
        return leaf if isinstance(leaf, np.ndarray) else leaf.numpy()
    if kind == "npscalar":
        dtype, value = body
        return np.dtype(dtype).type(value)
    if kind == "value":
        return float(body["float"]) if isinstance(body, dict) else body
    if kind == "dict":
        return {key: unflatten(node, arrays) for key, node in body}
    if kind == "list":
        return [unflatten(node, arrays) for node in body]
    if kind == "tuple":
        return tuple(unflatten(node, arrays) for node in body)
    raise StateMismatchError(f"unknown skeleton node {kind!r}: the manifest was written by a newer version")


_NUMPY_DTYPES: dict[np.dtype, torch.dtype] = {}


def dtype_of(name: str, leaf: Leaf) -> torch.dtype:
    """The torch dtype a leaf is stored as; a numpy dtype torch lacks is an error naming the leaf."""
    if isinstance(leaf, torch.Tensor):
        return leaf.dtype
    if leaf.dtype not in _NUMPY_DTYPES:
        try:
            _NUMPY_DTYPES[leaf.dtype] = torch.from_numpy(np.empty(0, dtype=leaf.dtype)).dtype
        except TypeError:
            raise CheckpointError(f"{name!r} has numpy dtype {leaf.dtype}, which has no tensor equivalent") from None
    return _NUMPY_DTYPES[leaf.dtype]
