"""A user's own training function, written against the contract exactly as the README shows it."""

from __future__ import annotations

from typing import Any

import torch

from resilient_flows.training import TrainContext


def build(params: dict[str, Any]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return model, torch.optim.Adam(model.parameters(), lr=params.get("lr", 0.01))


def train(ctx: TrainContext) -> dict[str, Any]:
    torch.manual_seed(ctx.seed)
    model, opt = build(ctx.params)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(ctx.params["steps"]):
        x = torch.randn(32, 4)  # the global RNG: restored with the checkpoint
        loss = (model(x) - x.sum(1, keepdim=True)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss)
    return ctx.result(model)


def evaluate(params: dict[str, Any], state: dict[str, Any]) -> dict[str, float]:
    model, _ = build(params)
    model.load_state_dict(state["model"])
    x = torch.ones(1, 4)
    with torch.no_grad():
        return {"prediction_at_ones": float(model(x))}
