"""Cloning: fork a running member into variants without stopping it (the DeepClone idea).

:func:`request_clone` registers the clones and orders the fork; the source's ``TrainContext``
serves the order at its next step boundary with one asynchronous checkpoint that is hard-linked
into each clone's tiers as it commits; a clone restores it, applies its overrides and continues.
Inside one MPI job, :func:`send_state` / :func:`recv_state` move the state from source ranks to
clone ranks point to point instead, each source rank sending about 1/N of the bytes.

Names are imported on first use (PEP 562): importing one light submodule does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilient_flows.lazy import lazy_exports

if TYPE_CHECKING:
    from resilient_flows.clone.lineage import lineage_tree
    from resilient_flows.clone.mpi import (
        CloneSend,
        CloneTransferStats,
        StagingBuffer,
        recv_state,
        send_state,
        start_send_state,
    )
    from resilient_flows.clone.request import allowed_overrides, check_overrides, request_clone

__all__ = [
    "CloneSend",
    "CloneTransferStats",
    "StagingBuffer",
    "allowed_overrides",
    "check_overrides",
    "lineage_tree",
    "recv_state",
    "request_clone",
    "send_state",
    "start_send_state",
]


_SOURCES = {
    "resilient_flows.clone.lineage": ("lineage_tree",),
    "resilient_flows.clone.mpi": (
        "CloneSend",
        "CloneTransferStats",
        "StagingBuffer",
        "recv_state",
        "send_state",
        "start_send_state",
    ),
    "resilient_flows.clone.request": ("allowed_overrides", "check_overrides", "request_clone"),
}

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES)
