"""Asynchronous, sharded, two-level checkpoints of PyTorch training state.

Nothing here imports Parsl: the engine is useful, and tested, on its own.
"""

from resilient_flows.checkpoint.catalog import CheckpointInfo, scan
from resilient_flows.checkpoint.engine import Checkpointer, CheckpointStats, SkippedCheckpoint
from resilient_flows.checkpoint.export import ExportResult, export
from resilient_flows.checkpoint.reader import read_checkpoint
from resilient_flows.checkpoint.state import Stateful, TrainState
from resilient_flows.errors import CheckpointError, CorruptCheckpointError, StateMismatchError

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
    "TrainState",
    "export",
    "read_checkpoint",
    "scan",
]
