"""Asynchronous, sharded, multi-level checkpoints of PyTorch training state.

Nothing here imports Parsl: the engine is useful, and tested, on its own. A transport that moves a
state between ranks without files (the MPI clone transport) uses the names of
:mod:`~resilient_flows.checkpoint._transfer` and nothing else of the engine. Names are imported on
first use (PEP 562), so that the runner can read a tier's committed steps without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.checkpoint._catalog": (
        "CheckpointInfo",
        "scan",
    ),
    "resilient_flows.checkpoint._config": (
        "CheckpointConfig",
        "TierSpec",
    ),
    "resilient_flows.checkpoint._engine": (
        "CheckpointStats",
        "Checkpointer",
        "SkippedCheckpoint",
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
        "checkpoint_heartbeat_path",
        "read_checkpoint_heartbeat",
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
        "CheckpointConfigError",
        "CheckpointError",
        "CorruptCheckpointError",
        "StateMismatchError",
    ),
}

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.checkpoint._catalog import (
        CheckpointInfo as CheckpointInfo,
    )
    from resilient_flows.checkpoint._catalog import (
        scan as scan,
    )
    from resilient_flows.checkpoint._config import (
        CheckpointConfig as CheckpointConfig,
    )
    from resilient_flows.checkpoint._config import (
        TierSpec as TierSpec,
    )
    from resilient_flows.checkpoint._engine import (
        Checkpointer as Checkpointer,
    )
    from resilient_flows.checkpoint._engine import (
        CheckpointStats as CheckpointStats,
    )
    from resilient_flows.checkpoint._engine import (
        SkippedCheckpoint as SkippedCheckpoint,
    )
    from resilient_flows.checkpoint._export import (
        ExportResult as ExportResult,
    )
    from resilient_flows.checkpoint._export import (
        export as export,
    )
    from resilient_flows.checkpoint._flat import (
        unflatten_state as unflatten_state,
    )
    from resilient_flows.checkpoint._heartbeat import (
        COMMENT_PREFIX as COMMENT_PREFIX,
    )
    from resilient_flows.checkpoint._heartbeat import (
        CheckpointHeartbeat as CheckpointHeartbeat,
    )
    from resilient_flows.checkpoint._heartbeat import (
        HeartbeatReader as HeartbeatReader,
    )
    from resilient_flows.checkpoint._heartbeat import (
        checkpoint_heartbeat_path as checkpoint_heartbeat_path,
    )
    from resilient_flows.checkpoint._heartbeat import (
        read_checkpoint_heartbeat as read_checkpoint_heartbeat,
    )
    from resilient_flows.checkpoint._manifest import (
        read_manifest as read_manifest,
    )
    from resilient_flows.checkpoint._reader import (
        read_checkpoint as read_checkpoint,
    )
    from resilient_flows.checkpoint._state import (
        RANK_LOCAL as RANK_LOCAL,
    )
    from resilient_flows.checkpoint._state import (
        Stateful as Stateful,
    )
    from resilient_flows.checkpoint._state import (
        TrainState as TrainState,
    )
    from resilient_flows.checkpoint._state import (
        capture_rng as capture_rng,
    )
    from resilient_flows.checkpoint._state import (
        restore_rng as restore_rng,
    )
    from resilient_flows.checkpoint._tiers import (
        MANIFEST as MANIFEST,
    )
    from resilient_flows.checkpoint._tiers import (
        Tier as Tier,
    )
    from resilient_flows.checkpoint._transfer import (
        Box as Box,
    )
    from resilient_flows.checkpoint._transfer import (
        Destination as Destination,
    )
    from resilient_flows.checkpoint._transfer import (
        SendPlan as SendPlan,
    )
    from resilient_flows.checkpoint._transfer import (
        check_pieces as check_pieces,
    )
    from resilient_flows.checkpoint._transfer import (
        discard_target as discard_target,
    )
    from resilient_flows.checkpoint._transfer import (
        plan_send as plan_send,
    )
    from resilient_flows.checkpoint._tree import (
        flatten as flatten,
    )
    from resilient_flows.checkpoint._tree import (
        unflatten as unflatten,
    )
    from resilient_flows.errors import (
        CheckpointConfigError as CheckpointConfigError,
    )
    from resilient_flows.errors import (
        CheckpointError as CheckpointError,
    )
    from resilient_flows.errors import (
        CorruptCheckpointError as CorruptCheckpointError,
    )
    from resilient_flows.errors import (
        StateMismatchError as StateMismatchError,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
