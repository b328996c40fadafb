"""Asynchronous, sharded, multi-level checkpoints of PyTorch training state.

Nothing here imports Parsl: the engine is useful, and tested, on its own. Names are imported on
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

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointStats",
    "Checkpointer",
    "CorruptCheckpointError",
    "ExportResult",
    "SkippedCheckpoint",
    "StateMismatchError",
    "Stateful",
    "TierSpec",
    "TrainState",
    "export",
    "read_checkpoint",
    "scan",
]

_SOURCES = {
    "resilient_flows.checkpoint.catalog": ("CheckpointInfo", "scan"),
    "resilient_flows.checkpoint.engine": ("Checkpointer", "CheckpointStats", "SkippedCheckpoint", "TierSpec"),
    "resilient_flows.checkpoint.export": ("ExportResult", "export"),
    "resilient_flows.checkpoint.reader": ("read_checkpoint",),
    "resilient_flows.checkpoint.state": ("Stateful", "TrainState"),
}

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES)
