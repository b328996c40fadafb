"""Asynchronous, sharded, multi-level checkpoints of PyTorch training state.

Nothing here imports Parsl: the engine is useful, and tested, on its own. A transport that moves a
state between ranks without files (the MPI clone transport) uses the names of
:mod:`~resilient_flows.checkpoint.transfer` and nothing else of the engine. Names are imported on
first use (PEP 562), so that the runner can read a tier's committed steps without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilient_flows.errors import CheckpointError, CorruptCheckpointError, StateMismatchError
from resilient_flows.lazy import lazy_exports

if TYPE_CHECKING:
    from resilient_flows.checkpoint.catalog import CheckpointInfo, scan
    from resilient_flows.checkpoint.engine import Checkpointer, CheckpointStats, SkippedCheckpoint, TierSpec
    from resilient_flows.checkpoint.export import ExportResult, export
    from resilient_flows.checkpoint.reader import read_checkpoint
    from resilient_flows.checkpoint.state import Stateful, TrainState
    from resilient_flows.checkpoint.transfer import (
        Box,
        Destination,
        SendPlan,
        check_pieces,
        discard_target,
        plan_send,
        unflatten_state,
    )

__all__ = [
    "Box",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointStats",
    "Checkpointer",
    "CorruptCheckpointError",
    "Destination",
    "ExportResult",
    "SendPlan",
    "SkippedCheckpoint",
    "StateMismatchError",
    "Stateful",
    "TierSpec",
    "TrainState",
    "check_pieces",
    "discard_target",
    "export",
    "plan_send",
    "read_checkpoint",
    "scan",
    "unflatten_state",
]

_SOURCES = {
    "resilient_flows.checkpoint.catalog": ("CheckpointInfo", "scan"),
    "resilient_flows.checkpoint.engine": ("Checkpointer", "CheckpointStats", "SkippedCheckpoint", "TierSpec"),
    "resilient_flows.checkpoint.export": ("ExportResult", "export"),
    "resilient_flows.checkpoint.reader": ("read_checkpoint",),
    "resilient_flows.checkpoint.state": ("Stateful", "TrainState"),
    "resilient_flows.checkpoint.transfer": (
        "Box",
        "Destination",
        "SendPlan",
        "check_pieces",
        "discard_target",
        "plan_send",
        "unflatten_state",
    ),
}

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES)
