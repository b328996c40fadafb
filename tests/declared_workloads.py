"""Workloads that declare their params with defaults, and one that trains without ever checkpointing."""

from __future__ import annotations

import dataclasses
from typing import Any

import pydantic
import torch

from resilient_flows.training import TrainContext


class ModelParams(pydantic.BaseModel):
    lr: float
    batch: int = 64
    widths: list[int] = pydantic.Field(default_factory=lambda: [4, 8])


@dataclasses.dataclass
class DataclassParams:
    lr: float
    batch: int = 32
    tags: list[str] = dataclasses.field(default_factory=lambda: ["a"])


def _echo(ctx: TrainContext) -> dict[str, Any]:
    return {"member": ctx.name, "params": {k: v for k, v in ctx.params.items() if k != "steps"}}


def with_model(ctx: TrainContext) -> dict[str, Any]:
    return _echo(ctx)


def with_dataclass(ctx: TrainContext) -> dict[str, Any]:
    return _echo(ctx)


def evaluate(params: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    return {"batch": params["batch"]}


with_model.params = ModelParams  # type: ignore[attr-defined]
with_dataclass.params = DataclassParams  # type: ignore[attr-defined]


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> torch.Tensor:
    loss = model(torch.ones(1, 2)).square().sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def own_loop(ctx: TrainContext) -> dict[str, Any]:
    """Its own ``for`` over the steps: it logs them, but no step boundary ever saves."""
    model, opt = _model()
    ctx.track(model=model, optimizer=opt)
    for step in range(ctx.params["steps"]):
        ctx.log(step, loss=_step(model, opt))
    return ctx.result(model)


def boundary_loop(ctx: TrainContext) -> dict[str, Any]:
    """The same loop through ``ctx.steps()``: checkpointed at every interval."""
    model, opt = _model()
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(ctx.params["steps"]):
        ctx.log(step, loss=_step(model, opt))
    return ctx.result(model)
