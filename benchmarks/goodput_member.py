"""The member ``goodput.py`` measures, alone in its module: the ranks that a retry starts import
only this (and torch), not the benchmark's harness, so that a restart's figures are the library's."""

from __future__ import annotations

import time
from typing import Any

import torch


def paced(ctx: Any) -> dict[str, Any]:
    """``goodput_member:paced``: a tiny linear model whose every step ends with ``step_s`` of sleep: a
    member of known pace whatever the machine's load, deterministic (its random draws come from
    torch's generator, which a checkpoint restores) so that a faulted run's digest must equal
    the fault-free one's."""
    torch.manual_seed(ctx.seed)
    model = torch.nn.Linear(8, 1)
    net = ctx.wrap(model)  # on several ranks (``--cluster``) DDP, whose all-reduce sees a peer die
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(ctx.params["steps"]):
        x = torch.randn(16, 8)
        loss = (net(x) - x.sum(1, keepdim=True)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(float(ctx.params["step_s"]))
        ctx.log(step, loss=loss)
    return ctx.result(model)
