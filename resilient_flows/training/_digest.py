"""One fingerprint of a model's weights, to compare runs bit for bit."""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def state_digest(module: Any) -> str:
    """SHA-256 over a ``state_dict``'s tensors in key order: equal digests mean equal weights, bit for bit.

    Sharded (DTensor) values are gathered first, so that the digest is of the whole model and the
    same on every rank; every rank of the model's group must call it.
    """
    from torch.distributed.tensor import DTensor

    digest = hashlib.sha256()
    for key, value in module.state_dict().items():
        digest.update(key.encode())
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if isinstance(value, torch.Tensor):
            digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()
