"""A paced workload (as ``paced.py``) that records, per attempt, which process imported it: a
warm worker finds it, and torch with it, imported by its parent, the pool's fork server.

Each attempt appends ``{"pid", "parent", "imported_in"}`` to ``params["record"]``
(a JSON line) before its first step; ``params["record"]`` is not part of what it trains.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch

from resilient_flows.training import TrainContext

#: The process that imported this module (and torch, imported above).
IMPORTED_IN = os.getpid()


def train(ctx: TrainContext) -> dict[str, Any]:
    with open(ctx.params["record"], "a") as record:
        record.write(json.dumps({"pid": os.getpid(), "parent": os.getppid(), "imported_in": IMPORTED_IN}) + "\n")
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
