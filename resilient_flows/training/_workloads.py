"""Built-in workloads that train for real on a laptop CPU in seconds, on data that ships offline.

The digits (8x8 images, 10 classes) and breast-cancer (30 features, 2 classes) sets ship with the
package (``datasets/``), so these run without a network, and without importing scikit-learn,
whose loaders hold the same tables. Every batch is a pure function of (seed, step): a resumed
member draws exactly the batches an uninterrupted one would, without checkpointing a sampler.

On several ranks each rank trains its slice of that same global batch, through ``ctx.wrap``
(DDP or FSDP2) so that gradients are averaged; dropout masks are drawn for the whole global
batch on every rank and batch-norm statistics are taken over it, so a member's results do not
depend on its rank count beyond floating-point rounding, and a checkpoint resumes on any.

A workflow names a built-in (``mlp-digits``) or a user's ``module:function``.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from resilient_flows.errors import ParamsError, ResilientFlowsError, WorkloadError
from resilient_flows.training._builtins import BUILTIN_PARAMS, BUILTIN_WORKLOADS
from resilient_flows.training._context import TrainContext
from resilient_flows.training._distributed import local_slice
from resilient_flows.training._functions import import_function
from resilient_flows.training._params import declared_params

#: Where the built-in datasets are: ``NAME.npz``, arrays ``data`` and ``target``.
DATASET_DIR = Path(__file__).resolve().parent / "datasets"
DATASETS = ("digits", "breast-cancer")


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
    if name not in DATASETS:
        raise ResilientFlowsError(f"unknown dataset {name!r}; built-in: {', '.join(DATASETS)}")
    with np.load(DATASET_DIR / f"{name}.npz", allow_pickle=False) as archive:
        x, y = archive["data"].astype(np.float32), archive["target"].astype(np.int64)
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


class _AllReduceSum(torch.autograd.Function):
    """A sum over the ranks that gradients flow back through (each rank's input gets the summed gradient)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class GlobalDropout(nn.Module):
    """Dropout whose mask is drawn for the whole global batch and sliced to this rank's rows.

    Every rank draws the same random numbers as a single-rank run, in the same order, so a
    sample gets the same mask whichever rank trains it and the ranks' RNG states stay equal.
    ``rows`` is ``(global batch size, this rank's slice)``; None: the input is the whole batch.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = float(p)
        self.rows: tuple[int, slice] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        total, rows = self.rows or (x.shape[0], slice(None))
        keep = torch.rand((total, *x.shape[1:]), device=x.device)[rows] >= self.p
        return x * keep / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class GlobalBatchNorm2d(nn.BatchNorm2d):
    """``BatchNorm2d`` whose training statistics are over the global batch when ``group`` is set.

    The ranks sum their counts and sums, then their squared deviations from the global mean (two
    passes, as a single rank computes them); gradients flow back through both sums. A CPU
    substitute for ``SyncBatchNorm``, which needs a GPU; the ``state_dict`` is BatchNorm's.
    """

    group: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group is None or not self.training:
            return super().forward(x)
        dims = (0, 2, 3)
        mean_now, var_now, momentum = self.running_mean, self.running_var, self.momentum
        batches = self.num_batches_tracked
        if mean_now is None or var_now is None or batches is None or momentum is None:
            raise ValueError("GlobalBatchNorm2d needs running statistics (track_running_stats) and a momentum")
        count = torch.tensor([x.numel() // x.shape[1]], dtype=x.dtype, device=x.device)
        sums = _AllReduceSum.apply(torch.cat([x.sum(dims), count]), self.group)
        n = sums[-1]
        mean = sums[:-1] / n
        centred = x - mean[None, :, None, None]
        var = _AllReduceSum.apply(centred.pow(2).sum(dims), self.group) / n
        with torch.no_grad():
            batches.add_(1)
            mean_now.lerp_(mean.detach(), momentum)
            var_now.lerp_(var.detach() * n / (n - 1), momentum)
        scale = torch.rsqrt(var + self.eps) * self.weight
        return centred * scale[None, :, None, None] + self.bias[None, :, None, None]


def _mlp(data: Dataset, p: dict[str, Any]) -> nn.Module:
    features, hidden = data.x_train.shape[1], int(p["hidden"])
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        GlobalDropout(p["dropout"]),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, data.classes),
    )


def _cnn(data: Dataset, p: dict[str, Any]) -> nn.Module:
    channels = int(p["channels"])
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, channels, 3, padding=1),
        GlobalBatchNorm2d(channels),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        GlobalDropout(p["dropout"]),
        nn.Linear(2 * channels * 16, data.classes),
    )


_BUILDERS: dict[str, tuple[Callable[[Dataset, dict[str, Any]], nn.Module], str]] = {
    "mlp-digits": (_mlp, "digits"),
    "mlp-breast-cancer": (_mlp, "breast-cancer"),
    "cnn-digits": (_cnn, "digits"),
}


def builtin_model(workload: str, params: dict[str, Any]) -> tuple[nn.Module, Dataset, dict[str, Any]]:
    """A built-in workload's model (from the current torch RNG), its data, and its params with the
    defaults it declares filled in."""
    build, dataset = _BUILDERS[workload]
    full = {**BUILTIN_PARAMS[workload]().model_dump(), **params}
    data = load_dataset(dataset)
    return build(data, full), data, full


def batch_indices(seed: int, step: int, n: int, size: int) -> torch.Tensor:
    """The training batch of ``step``: a function of (seed, step) only, so resumes need no sampler state."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(n, (size,), generator=generator)


def _train_builtin(kind: str, ctx: TrainContext) -> dict[str, Any]:
    torch.manual_seed(ctx.seed)
    model, data, p = builtin_model(kind, ctx.params)
    size = int(p["batch_size"])
    if size < ctx.world_size:
        raise ResilientFlowsError(
            f"member {ctx.name}: batch_size {size} is smaller than its {ctx.world_size} ranks; each needs a sample"
        )
    rows = local_slice(size, ctx.rank, ctx.world_size)
    for module in model.modules():
        if isinstance(module, GlobalDropout):
            module.rows = (size, rows)
        elif isinstance(module, GlobalBatchNorm2d):
            module.group = ctx.group
    net = ctx.wrap(model)
    optimizer = torch.optim.SGD(net.parameters(), lr=p["lr"], momentum=p["momentum"], weight_decay=p["weight_decay"])
    ctx.track(model=model, optimizer=optimizer)
    model.train()
    x_train, y_train = data.x_train.to(ctx.device), data.y_train.to(ctx.device)
    # DDP and FSDP average the ranks' gradients: a rank's share of the global mean is its sum * ranks / size
    scale = ctx.world_size / size
    for step in ctx.steps(p["steps"]):
        index = batch_indices(ctx.seed, step, len(x_train), size)[rows].to(ctx.device)
        total = nn.functional.cross_entropy(net(x_train[index]), y_train[index], reduction="sum")
        optimizer.zero_grad(set_to_none=True)
        (total * scale).backward()
        optimizer.step()
        loss = total.detach()
        if ctx.group is not None:
            dist.all_reduce(loss, group=ctx.group)
        ctx.log(step, loss=loss.item() / size)
    return ctx.result(model, **evaluate_model(model, data))


def evaluate_model(model: nn.Module, data: Dataset) -> dict[str, float]:
    """Test loss and accuracy; on several ranks every rank evaluates the whole test set (FSDP needs all)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(data.x_test.to(device))
        y_test = data.y_test.to(device)
        loss = nn.functional.cross_entropy(logits, y_test).item()
        accuracy = (logits.argmax(1) == y_test).float().mean().item()
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
    dict (``state["model"]`` is the model's ``state_dict``) and returns metrics. ``params`` is
    what the workload declares about its params (see :mod:`resilient_flows.training._params`),
    None when it declares nothing.
    """

    name: str
    train: Callable[[TrainContext], Any]
    evaluate: Callable[[dict[str, Any], dict[str, Any]], dict[str, float]] | None = None
    params: type | None = None


assert tuple(_BUILDERS) == BUILTIN_WORKLOADS, "training.builtins lists the built-ins"


def resolve_workload(name: str, evaluate: str | None = None, directory: str | None = None) -> Workload:
    """A built-in by name, or ``package.module:function`` (and an optional evaluate function).

    ``directory`` (the workflow file's) goes first on ``sys.path`` for the import, as a script's
    directory does for ``python script.py``: a training module beside the workflow needs no
    install and no ``PYTHONPATH``, on whichever worker runs it. It stays there, for the imports
    the module makes later.
    """
    if name in _BUILDERS:
        train, evaluated = functools.partial(_train_builtin, name), functools.partial(_evaluate_builtin, name)
        return Workload(name, train, evaluated, BUILTIN_PARAMS[name])
    if ":" not in name:
        raise WorkloadError(
            f"unknown workload {name!r}: name a built-in ({', '.join(BUILTIN_WORKLOADS)}) or 'module:function'"
        )
    if directory is not None and directory not in sys.path:
        sys.path.insert(0, directory)
    train = import_function(name)
    evaluated = import_function(evaluate, "evaluate function") if evaluate else None
    return Workload(name, train, evaluated, declared_params(train, name))


def check_call(function: Callable[..., Any], what: str, *args: Any, **kwargs: Any) -> None:
    """Raise :class:`ParamsError` when ``function`` cannot be called with these arguments.

    Checked before the call, against the signature, so that a parameter the function does not
    take (or one it needs and was not given) fails the member at once, while a ``TypeError``
    raised inside the function stays an ordinary error that a retry may meet or not.
    """
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # no signature to read (some built-ins): the call decides
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise ParamsError(f"{what}: {exc}") from None
