"""resilient-flows: resilient machine-learning workflows on supercomputers, for Parsl."""

from resilient_flows.checkpoint import (
    Checkpointer,
    CheckpointError,
    CheckpointInfo,
    CheckpointStats,
    CorruptCheckpointError,
    Stateful,
    StateMismatchError,
    TrainState,
)
from resilient_flows.errors import ResilientFlowsError

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointStats",
    "Checkpointer",
    "CorruptCheckpointError",
    "ResilientFlowsError",
    "StateMismatchError",
    "Stateful",
    "TrainState",
    "__version__",
]
