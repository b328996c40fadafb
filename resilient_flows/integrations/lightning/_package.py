"""The Lightning package this integration derives from, and the run contract it is under."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from resilient_flows.training import ENV_NAMES, RunContract


def _import_lightning() -> ModuleType:
    """The Lightning package the script's Trainer comes from (see the module's docstring)."""
    names = ("pytorch_lightning", "lightning.pytorch")
    for name in names:
        if name in sys.modules:
            return sys.modules[name]
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(
        "resilient_flows.integrations.lightning needs PyTorch Lightning: "
        "pip install 'resilient-flows[lightning]' (or install lightning)"
    )


#: The Lightning package these classes derive from.
LIGHTNING = _import_lightning()
CheckpointIO = LIGHTNING.plugins.CheckpointIO
Callback = LIGHTNING.Callback
ModelCheckpoint = LIGHTNING.callbacks.ModelCheckpoint
ModelParallelStrategy = LIGHTNING.strategies.ModelParallelStrategy


#: Strategies whose ``load_checkpoint`` bypasses the CheckpointIO plugin (Lightning 2.6), and what to use.


def run_contract() -> RunContract | None:
    """This process's run contract, or None outside a workflow."""
    return RunContract.from_env() if os.environ.get(ENV_NAMES["run_dir"]) else None
