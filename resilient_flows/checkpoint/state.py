"""TrainState: everything that makes a resumed training continue bit for bit.

A model's ``state_dict`` is not enough to continue *exactly*: the optimizer's moments, the LR
scheduler's position, and the random number generators (dropout masks, data shuffling) all decide
the next loss. RNG states differ per data-parallel rank, so they live under :data:`RANK_LOCAL`,
which the engine stores per rank instead of sharding as replicated state.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from resilient_flows.errors import StateMismatchError

__all__ = ["RANK_LOCAL", "Stateful", "TrainState", "capture_rng", "restore_rng"]

logger = logging.getLogger(__name__)

#: Top-level key of a state dict whose subtree is stored per rank, not sharded.
RANK_LOCAL = "rank_local"


@runtime_checkable
class Stateful(Protocol):
    """Anything checkpointable: the ``state_dict`` / ``load_state_dict`` convention of PyTorch."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


class TrainState:
    """Model, optimizer, optional LR scheduler, RNG states and user values, as one Stateful.

    Parameters
    ----------
    model:
        Any ``torch.nn.Module`` (or Stateful). Its parameters are copied behind the next step in
        overlap mode; its buffers (BatchNorm statistics) are always copied before ``save`` returns.
    optimizer:
        A ``torch.optim.Optimizer``. Overlap mode hooks its ``step`` to wait for the copy.
    scheduler:
        An LR scheduler, or None.
    extra:
        Replicated user values (epoch, data position, ...). Restored in place into this dict.
    rank_extra:
        Values that differ per rank (a rank's data-loader offset). Restored in place.
    rng:
        Capture the torch (CPU and CUDA), numpy and ``random`` generators. True by default.
    """

    def __init__(
        self,
        model: Any = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        extra: dict[str, Any] | None = None,
        rank_extra: dict[str, Any] | None = None,
        rng: bool = True,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.extra = {} if extra is None else extra
        self.rank_extra = {} if rank_extra is None else rank_extra
        self.rng = rng

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for key in ("model", "optimizer", "scheduler"):
            part = getattr(self, key)
            if part is not None:
                state[key] = part.state_dict()
        state["extra"] = dict(self.extra)
        local: dict[str, Any] = {"extra": dict(self.rank_extra)}
        if self.rng:
            local["rng"] = capture_rng()
        state[RANK_LOCAL] = local
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in ("model", "optimizer", "scheduler"):
            part = getattr(self, key)
            if part is not None:
                part.load_state_dict(state_dict[key])
        _replace(self.extra, state_dict.get("extra", {}))
        local = state_dict.get(RANK_LOCAL, {})
        _replace(self.rank_extra, local.get("extra", {}))
        if self.rng and "rng" in local:
            restore_rng(local["rng"])

    def check_loadable(self, saved: dict[str, Any]) -> None:
        """Raise StateMismatchError where ``load_state_dict`` would fail after tensors were copied.

        ``saved`` is the checkpoint's structure (tensor values need not be real). The engine calls
        this before touching the state, so a refused checkpoint leaves the state as it was.
        """
        for key in ("model", "optimizer", "scheduler"):
            if getattr(self, key) is not None and key not in saved:
                raise StateMismatchError(f"the checkpoint has no {key}, which this TrainState has")
        if self.optimizer is not None:
            live = [len(g["params"]) for g in self.optimizer.state_dict()["param_groups"]]
            stored = [len(g["params"]) for g in saved["optimizer"]["param_groups"]]
            if live != stored:
                raise StateMismatchError(
                    f"the checkpoint's optimizer has parameter groups of sizes {stored}, this one {live}"
                )

    def deferrable(self) -> Callable[[str], bool]:
        """Which leaves only ``optimizer.step()`` changes: safe to copy during the next pass."""
        params = set()
        if isinstance(self.model, torch.nn.Module):
            params = {f"model/{n}" for n, _ in self.model.named_parameters(remove_duplicate=False)}
        optimizer_state = "optimizer/state/" if self.optimizer is not None else None
        return lambda name: name in params or (optimizer_state is not None and name.startswith(optimizer_state))

    def lazy_prefixes(self) -> tuple[str, ...]:
        """Where a checkpoint may hold arrays the live state does not have yet.

        An optimizer creates its per-parameter state on its first step, and the number of CUDA
        generators depends on the machine.
        """
        return ("optimizer/state/", f"{RANK_LOCAL}/")


def _replace(target: dict, values: dict) -> None:
    target.clear()
    target.update(values)


def capture_rng() -> dict[str, Any]:
    """The state of every generator a training loop typically draws from."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(legacy=False),
        "random": {"version": version, "internal": np.array(internal, dtype=np.uint32), "gauss": gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    py = state["random"]
    random.setstate((py["version"], tuple(int(i) for i in py["internal"]), py["gauss"]))
    cuda = state.get("cuda")
    if cuda:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
            torch.cuda.set_rng_state_all(cuda)
        else:
            logger.warning(
                "checkpoint holds %d CUDA generator states; this process sees %d GPUs: not restored",
                len(cuda),
                torch.cuda.device_count() if torch.cuda.is_available() else 0,
            )
