"""A workload whose steps take a set time (``step_s``), so that a test knows how long a member
needs: workers import it from ``tests/``, which a test puts on their ``PYTHONPATH``."""

from __future__ import annotations

import time
from typing import Any

import torch

from resilient_flows.training import TrainContext


def train(ctx: TrainContext) -> dict[str, Any]:
    torch.manual_seed(ctx.seed)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(ctx.params["steps"]):
        x = torch.randn(16, 8)
        loss = (model(x) - x.sum(1, keepdim=True)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(float(ctx.params["step_s"]))
        ctx.log(step, loss=loss)
    return ctx.result(model)
