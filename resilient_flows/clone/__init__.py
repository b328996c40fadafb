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

_SOURCES = {
    "resilient_flows.clone._lineage": (
        "clone_seed",
        "lineage_document",
        "lineage_tree",
    ),
    "resilient_flows.clone._mpi": (
        "CloneSend",
        "CloneTransferStats",
        "StagingBuffer",
        "recv_state",
        "send_state",
        "start_send_state",
    ),
    "resilient_flows.clone._request": (
        "allowed_overrides",
        "check_overrides",
        "request_clone",
    ),
}

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.clone._lineage import (
        clone_seed as clone_seed,
    )
    from resilient_flows.clone._lineage import (
        lineage_document as lineage_document,
    )
    from resilient_flows.clone._lineage import (
        lineage_tree as lineage_tree,
    )
    from resilient_flows.clone._mpi import (
        CloneSend as CloneSend,
    )
    from resilient_flows.clone._mpi import (
        CloneTransferStats as CloneTransferStats,
    )
    from resilient_flows.clone._mpi import (
        StagingBuffer as StagingBuffer,
    )
    from resilient_flows.clone._mpi import (
        recv_state as recv_state,
    )
    from resilient_flows.clone._mpi import (
        send_state as send_state,
    )
    from resilient_flows.clone._mpi import (
        start_send_state as start_send_state,
    )
    from resilient_flows.clone._request import (
        allowed_overrides as allowed_overrides,
    )
    from resilient_flows.clone._request import (
        check_overrides as check_overrides,
    )
    from resilient_flows.clone._request import (
        request_clone as request_clone,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
