"""TrainState: everything that makes a resumed training continue bit for bit.

A model's ``state_dict`` is not enough to continue *exactly*: the optimizer's moments, the LR
scheduler's position, and the random number generators (dropout masks, data shuffling) all decide
the next loss. RNG states differ per data-parallel rank, so they live under :data:`RANK_LOCAL`,
which the engine stores per rank instead of sharding as replicated state.

Model and optimizer state go through PyTorch's own ``torch.distributed.checkpoint.state_dict``
helpers: parameter names are the plain module's (no ``module.`` of DDP, no FSDP wrapping), and the
optimizer's state is keyed by those names rather than by integer ids. So a checkpoint of an FSDP2
model restores into a DDP or plain one and back, its optimizer moments included.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from resilient_flows.errors import StateMismatchError

logger = logging.getLogger(__name__)

#: Top-level key of a state dict whose subtree is stored per rank, not sharded.
RANK_LOCAL = "rank_local"


@runtime_checkable
class Stateful(Protocol):
    """Anything checkpointable: the ``state_dict`` / ``load_state_dict`` convention of PyTorch."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any], /) -> Any: ...


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
    data:
        The data loaders' positions (a Stateful of JSON values, the same on every rank), saved
        under ``data`` when it has any (a training context's resumable loaders).
    rank_data:
        The positions that differ per rank (streams' loaders), saved in each rank's own part
        under ``data`` when it has any.
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
        data: Stateful | None = None,
        rank_data: Stateful | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.extra = {} if extra is None else extra
        self.rank_extra = {} if rank_extra is None else rank_extra
        self.rng = rng
        self.data = data
        self.rank_data = rank_data
        self._created_for_restore = False

    def restore_target(self, saved: dict[str, Any]) -> dict[str, Any]:
        """The state to restore ``saved`` into: with optimizer state shaped like the model's now.

        An optimizer creates its state lazily; to restore moments into sharded parameters they
        must exist first, with this rank's layout. They are created empty, for exactly the
        parameters and keys the checkpoint has state for (``saved`` holds arrays of the saved
        shapes and dtypes): a state of a parameter's global shape is laid out like the parameter
        (a ``DTensor`` with its placements), anything else (a step count) as a plain tensor that
        the optimizer's ``load_state_dict`` moves where it keeps it. A step of zero gradients, as
        PyTorch's helper does it, would compute a whole update only to have it overwritten, and
        would give state to parameters that had none.
        """
        saved_state = (saved.get("optimizer") or {}).get("state") or {}
        optimizer = self.optimizer
        module = isinstance(self.model, torch.nn.Module)
        init = bool(saved_state) and module and optimizer is not None and not optimizer.state
        self._created_for_restore = init
        if init and optimizer is not None:
            self._create_optimizer_state(optimizer, saved_state)
        return self.state_dict()

    def _create_optimizer_state(self, optimizer: torch.optim.Optimizer, saved_state: dict[str, Any]) -> None:
        params = {name: param for param, name in _parameter_names(self.model).items()}
        for name, values in saved_state.items():
            param = params.get(name)
            if param is not None and isinstance(values, dict):
                optimizer.state[param] = {key: _empty_like_saved(param, value) for key, value in values.items()}

    def created_for_restore(self) -> tuple[str, ...]:
        """Prefixes of the arrays :meth:`restore_target` created: nothing trains from them before
        the restore succeeds, so they may be filled while they are verified."""
        return ("optimizer/state/",) if self._created_for_restore else ()

    def discard_restore_target(self) -> None:
        """Undo :meth:`restore_target` when nothing was restored: the optimizer is left as it was."""
        if self._created_for_restore and self.optimizer is not None:  # created only for an optimizer
            self.optimizer.state.clear()
        self._created_for_restore = False

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        module = isinstance(self.model, torch.nn.Module)
        if module and self.optimizer is not None and self.optimizer.state:
            state["model"], state["optimizer"] = get_state_dict(self.model, self.optimizer)  # one walk, not two
        else:
            if self.model is not None:
                state["model"] = self._model_state()
            if self.optimizer is not None:
                state["optimizer"] = self._optimizer_state(self.optimizer)
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        state["extra"] = dict(self.extra)
        positions = {} if self.data is None else self.data.state_dict()
        if positions:  # no key without loaders: checkpoints of loops without one are unchanged
            state["data"] = positions
        local: dict[str, Any] = {"extra": dict(self.rank_extra)}
        streams = {} if self.rank_data is None else self.rank_data.state_dict()
        if streams:
            local["data"] = streams
        if self.rng:
            local["rng"] = capture_rng()
        state[RANK_LOCAL] = local
        return state

    def _model_state(self) -> dict[str, Any]:
        if isinstance(self.model, torch.nn.Module):
            return get_model_state_dict(self.model)
        return self.model.state_dict()

    def _optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        if not isinstance(self.model, torch.nn.Module):
            return optimizer.state_dict()
        if optimizer.state:
            return get_optimizer_state_dict(self.model, optimizer)
        # The helper would create the state (a step with zero gradients) where none exists yet,
        # changing what the next real step does; before the first step there is nothing but the
        # hyperparameters to save.
        names = _parameter_names(self.model)
        groups = []
        for group in optimizer.param_groups:
            hyperparameters = {k: v for k, v in group.items() if k != "params"}
            groups.append({**hyperparameters, "params": [names[p] for p in group["params"]]})
        return {"state": {}, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._created_for_restore = False
        if self.model is not None:
            if isinstance(self.model, torch.nn.Module):
                set_model_state_dict(self.model, state_dict["model"])
            else:
                self.model.load_state_dict(state_dict["model"])
        if self.optimizer is not None:
            saved = state_dict["optimizer"]
            if not isinstance(self.model, torch.nn.Module):
                self.optimizer.load_state_dict(saved)
            elif saved["state"]:
                # Not strict: a trainable parameter that never had a gradient has no state saved, and gets none.
                set_optimizer_state_dict(self.model, self.optimizer, saved, options=StateDictOptions(strict=False))
            else:  # saved before the first step: hyperparameters only, and no state
                self.optimizer.state.clear()
                for group, stored in zip(self.optimizer.param_groups, saved["param_groups"], strict=True):
                    group.update({k: v for k, v in stored.items() if k != "params"})
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state_dict["scheduler"])
        _replace(self.extra, state_dict.get("extra", {}))
        if self.data is not None and "data" in state_dict:
            self.data.load_state_dict(state_dict["data"])
        local = state_dict.get(RANK_LOCAL, {})
        _replace(self.rank_extra, local.get("extra", {}))
        if self.rank_data is not None and "data" in local:
            self.rank_data.load_state_dict(local["data"])
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
            live = [g["params"] for g in self._optimizer_state(self.optimizer)["param_groups"]]
            stored = [g["params"] for g in saved["optimizer"]["param_groups"]]
            if [len(g) for g in live] != [len(g) for g in stored]:
                raise StateMismatchError(
                    f"the checkpoint's optimizer has parameter groups of sizes {[len(g) for g in stored]}, "
                    f"this one {[len(g) for g in live]}"
                )
            for group, (now, then) in enumerate(zip(live, stored, strict=True)):
                if isinstance(self.model, torch.nn.Module) and list(now) != list(then):
                    odd = sorted(set(map(str, now)) ^ set(map(str, then)))
                    raise StateMismatchError(
                        f"the checkpoint's optimizer group {group} holds other parameters than this one: {odd[:5]}"
                    )

    def deferrable(self) -> Callable[[str], bool]:
        """Which leaves only ``optimizer.step()`` changes: safe to copy during the next pass."""
        params = set()
        if isinstance(self.model, torch.nn.Module):
            params = {f"model/{name}" for name in _parameter_names(self.model).values()}
        optimizer_state = "optimizer/state/" if self.optimizer is not None else None
        return lambda name: name in params or (optimizer_state is not None and name.startswith(optimizer_state))

    def lazy_prefixes(self) -> tuple[str, ...]:
        """Where a checkpoint may hold arrays the live state does not have yet.

        An optimizer creates its per-parameter state on its first step, and the number of CUDA
        generators depends on the machine.
        """
        return ("optimizer/state/", f"{RANK_LOCAL}/")


def _parameter_names(model: torch.nn.Module) -> dict[torch.nn.Parameter, str]:
    """Each parameter's name as the state-dict helpers write it (wrapper prefixes removed)."""
    # The helpers' own rule for names, so that ours always agree with theirs.
    from torch.distributed.checkpoint.state_dict import _get_fqns

    names: dict[torch.nn.Parameter, str] = {}
    for name, param in model.named_parameters():
        (fqn,) = _get_fqns(model, name)
        names[param] = fqn
    return names


def _empty_like_saved(param: torch.Tensor, saved: Any) -> Any:
    """Room for one saved optimizer value of ``param``: shaped like the saved array, laid out like
    the parameter where it has its global shape; values that are not arrays as saved."""
    if not isinstance(saved, torch.Tensor):
        return saved
    if tuple(saved.shape) == tuple(param.shape):
        return torch.empty_like(param.detach(), dtype=saved.dtype, requires_grad=False)
    return torch.empty(saved.shape, dtype=saved.dtype)


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
