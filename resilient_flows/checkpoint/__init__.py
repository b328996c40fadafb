"""Asynchronous, sharded, multi-level checkpoints of PyTorch training state.

Nothing here imports Parsl: the engine is useful, and tested, on its own. A transport that moves a
state between ranks without files (the MPI clone transport) uses the names of
:mod:`~resilient_flows.checkpoint._transfer` and nothing else of the engine. Names are imported on
first use (PEP 562), so that the runner can read a tier's committed steps without torch.
"""

from __future__ import annotations

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.checkpoint._catalog": (
        "CheckpointInfo",
        "scan",
    ),
    "resilient_flows.checkpoint._engine": (
        "CheckpointStats",
        "Checkpointer",
        "SkippedCheckpoint",
        "TierSpec",
    ),
    "resilient_flows.checkpoint._export": (
        "ExportResult",
        "export",
    ),
    "resilient_flows.checkpoint._flat": ("unflatten_state",),
    "resilient_flows.checkpoint._heartbeat": (
        "COMMENT_PREFIX",
        "CheckpointHeartbeat",
        "HeartbeatReader",
        "heartbeat_path",
        "read_heartbeat",
    ),
    "resilient_flows.checkpoint._manifest": ("read_manifest",),
    "resilient_flows.checkpoint._reader": ("read_checkpoint",),
    "resilient_flows.checkpoint._state": (
        "RANK_LOCAL",
        "Stateful",
        "TrainState",
        "capture_rng",
        "restore_rng",
    ),
    "resilient_flows.checkpoint._tiers": (
        "MANIFEST",
        "Tier",
    ),
    "resilient_flows.checkpoint._transfer": (
        "Box",
        "Destination",
        "SendPlan",
        "check_pieces",
        "discard_target",
        "plan_send",
    ),
    "resilient_flows.checkpoint._tree": (
        "flatten",
        "unflatten",
    ),
    "resilient_flows.errors": (
        "CheckpointError",
        "CorruptCheckpointError",
        "StateMismatchError",
    ),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
