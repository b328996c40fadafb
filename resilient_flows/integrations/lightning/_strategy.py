"""Lightning's FSDP2 strategy, resuming through the resilient-flows plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from resilient_flows.errors import ResilientFlowsError
from resilient_flows.integrations.lightning._checkpoint_io import ResilientCheckpointIO
from resilient_flows.integrations.lightning._package import LIGHTNING, ModelParallelStrategy


class ResilientModelParallelStrategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2 and tensor parallelism) resuming from our checkpoints.

    Lightning's strategy reads a checkpoint with ``torch.load`` or DCP, never through the Trainer's
    ``CheckpointIO``; this one reads it through :class:`ResilientCheckpointIO`. Saving gathers the
    full model and optimizer state onto global rank 0, which hands it to the plugin (a copy into
    host buffers, then background writes). Every rank reads the checkpoint whole and keeps its
    shards, so a run may resume on another number of ranks. The arguments are
    ``ModelParallelStrategy``'s, less ``save_distributed_checkpoint``: Lightning's per-rank
    checkpoints are DCP directories that the plugin never sees.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.pop("save_distributed_checkpoint", False):
            raise ValueError(
                "ResilientModelParallelStrategy saves through ResilientCheckpointIO, which gets the full state on "
                "rank 0: save_distributed_checkpoint=True (a DCP directory per checkpoint) cannot go through it"
            )
        super().__init__(*args, save_distributed_checkpoint=False, **kwargs)

    def teardown(self) -> None:
        """Lightning's ``ModelParallelStrategy`` skips its base class's teardown, which closes the
        checkpoint plugin: without this the engine would be closed only from an ``atexit`` hook."""
        super().teardown()
        self.checkpoint_io.teardown()

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Read ``checkpoint_path`` through the plugin and load its shards into the model and optimizers."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        if not isinstance(self.checkpoint_io, ResilientCheckpointIO):
            raise ResilientFlowsError(
                "ResilientModelParallelStrategy reads checkpoints through ResilientCheckpointIO: "
                "Trainer(strategy=ResilientModelParallelStrategy(), plugins=[ResilientCheckpointIO()])"
            )
        checkpoint = self.checkpoint_io.load_checkpoint(Path(self.broadcast(checkpoint_path)))
        full = StateDictOptions(full_state_dict=True, strict=self.lightning_module.strict_loading)
        set_model_state_dict(self.model, checkpoint.pop("state_dict"), options=full)
        if self.lightning_module.trainer.state.fn == LIGHTNING.trainer.states.TrainerFn.FITTING:
            for optimizer, state in zip(self.optimizers, checkpoint.get("optimizer_states", ()), strict=True):
                state = _keyed_by_name(state, self.model)
                set_optimizer_state_dict(self.model, optimizer, optim_state_dict=state, options=full)
        return checkpoint


def _keyed_by_name(state: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """Optimizer state as ``set_optimizer_state_dict`` takes it: Lightning saved it keyed by parameter index."""
    from torch.distributed.fsdp import FullyShardedDataParallel, OptimStateKeyType

    keys = [*state.get("state", {}), *(p for group in state.get("param_groups", ()) for p in group["params"])]
    if not any(isinstance(key, int) for key in keys):
        return state
    return FullyShardedDataParallel.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_NAME, model)
