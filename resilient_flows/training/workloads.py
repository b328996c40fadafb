"""Built-in workloads that train for real on a laptop CPU in seconds, on data that ships offline.

scikit-learn bundles the digits (8x8 images, 10 classes) and breast-cancer (30 features, 2 classes)
sets, so these run without a network. Every batch is a pure function of (seed, step): a resumed
member draws exactly the batches an uninterrupted one would, without checkpointing a sampler.

A workflow names a built-in (``mlp-digits``) or a user's ``module:function``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from resilient_flows.errors import ResilientFlowsError
from resilient_flows.training.context import TrainContext

__all__ = [
    "BUILTIN_WORKLOADS",
    "DEFAULTS",
    "STRUCTURAL",
    "Dataset",
    "Workload",
    "batch_indices",
    "builtin_model",
    "evaluate_model",
    "import_function",
    "load_dataset",
    "resolve_workload",
]

#: Defaults of the built-ins; a member's ``params`` override them.
DEFAULTS = {"lr": 0.05, "momentum": 0.9, "hidden": 64, "batch_size": 64, "dropout": 0.1, "weight_decay": 0.0}
#: Params that decide the shape of a model: a clone cannot change them.
STRUCTURAL = frozenset({"hidden", "channels"})


@dataclass(frozen=True)
class Dataset:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: int


@functools.cache
def load_dataset(name: str) -> Dataset:
    """A fixed 80/20 split, standardised with the training statistics."""
    from sklearn import datasets

    loaders = {"digits": datasets.load_digits, "breast-cancer": datasets.load_breast_cancer}
    if name not in loaders:
        raise ResilientFlowsError(f"unknown dataset {name!r}; built-in: {', '.join(loaders)}")
    bunch = loaders[name]()
    x, y = bunch.data.astype(np.float32), bunch.target.astype(np.int64)
    order = np.random.RandomState(0).permutation(len(x))
    cut = int(0.8 * len(x))
    train, test = order[:cut], order[cut:]
    mean, std = x[train].mean(0), x[train].std(0) + 1e-6
    x = (x - mean) / std
    return Dataset(
        torch.from_numpy(x[train]),
        torch.from_numpy(y[train]),
        torch.from_numpy(x[test]),
        torch.from_numpy(y[test]),
        int(y.max()) + 1,
    )


def _mlp(data: Dataset, p: dict[str, Any]) -> nn.Module:
    features, hidden = data.x_train.shape[1], int(p["hidden"])
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Dropout(p["dropout"]),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, data.classes),
    )


def _cnn(data: Dataset, p: dict[str, Any]) -> nn.Module:
    channels = int(p.get("channels", 16))
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, channels, 3, padding=1),
        nn.BatchNorm2d(channels),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Dropout(p["dropout"]),
        nn.Linear(2 * channels * 16, data.classes),
    )


_BUILDERS: dict[str, tuple[Callable[[Dataset, dict[str, Any]], nn.Module], str]] = {
    "mlp-digits": (_mlp, "digits"),
    "mlp-breast-cancer": (_mlp, "breast-cancer"),
    "cnn-digits": (_cnn, "digits"),
}


def builtin_model(workload: str, params: dict[str, Any]) -> tuple[nn.Module, Dataset, dict[str, Any]]:
    """A built-in workload's model (from the current torch RNG), its data, and its full params."""
    build, dataset = _BUILDERS[workload]
    full = {**DEFAULTS, **params}
    data = load_dataset(dataset)
    return build(data, full), data, full


def batch_indices(seed: int, step: int, n: int, size: int) -> torch.Tensor:
    """The training batch of ``step``: a function of (seed, step) only, so resumes need no sampler state."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(n, (size,), generator=generator)


def _train_builtin(kind: str, ctx: TrainContext) -> dict[str, Any]:
    torch.manual_seed(ctx.seed)
    model, data, p = builtin_model(kind, ctx.params)
    optimizer = torch.optim.SGD(model.parameters(), lr=p["lr"], momentum=p["momentum"], weight_decay=p["weight_decay"])
    ctx.track(model=model, optimizer=optimizer)
    model.train()
    for step in ctx.steps(p["steps"]):
        index = batch_indices(ctx.seed, step, len(data.x_train), int(p["batch_size"]))
        loss = nn.functional.cross_entropy(model(data.x_train[index]), data.y_train[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        ctx.log(step, loss=loss.item())
    return ctx.result(model, **evaluate_model(model, data))


def evaluate_model(model: nn.Module, data: Dataset) -> dict[str, float]:
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(data.x_test)
        loss = nn.functional.cross_entropy(logits, data.y_test).item()
        accuracy = (logits.argmax(1) == data.y_test).float().mean().item()
    model.train(was_training)
    return {"test_loss": loss, "test_accuracy": accuracy}


def _evaluate_builtin(kind: str, params: dict[str, Any], state: dict[str, Any]) -> dict[str, float]:
    model, data, _ = builtin_model(kind, params)
    model.load_state_dict(state["model"])
    return evaluate_model(model, data)


@dataclass(frozen=True)
class Workload:
    """A training function, and optionally how to evaluate a checkpoint of it (for analytics).

    ``evaluate(params, state)`` receives the member's parameters and a checkpoint as a nested
    dict (``state["model"]`` is the model's ``state_dict``) and returns metrics.
    """

    name: str
    train: Callable[[TrainContext], Any]
    evaluate: Callable[[dict[str, Any], dict[str, Any]], dict[str, float]] | None = None


BUILTIN_WORKLOADS = tuple(_BUILDERS)


def resolve_workload(name: str, evaluate: str | None = None) -> Workload:
    """A built-in by name, or ``package.module:function`` (and an optional evaluate function)."""
    if name in _BUILDERS:
        return Workload(name, functools.partial(_train_builtin, name), functools.partial(_evaluate_builtin, name))
    if ":" not in name:
        raise ResilientFlowsError(
            f"unknown workload {name!r}: name a built-in ({', '.join(BUILTIN_WORKLOADS)}) or 'module:function'"
        )
    return Workload(name, import_function(name), import_function(evaluate) if evaluate else None)


def import_function(ref: str, what: str = "workload") -> Callable[..., Any]:
    """The function ``ref`` (``package.module:function``) names; ``what`` it is, for the error."""
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ResilientFlowsError(f"{what} {ref!r}: cannot import {module_name!r} ({exc})") from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise ResilientFlowsError(f"{what} {ref!r}: {module_name} has no function {attr!r}")
    return function
