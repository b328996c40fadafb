"""A plain PyTorch training script, as a user has one, that joins a workflow with three lines.

Run as a command member: ``command: [python, command_script.py, --lr, "{lr}"]``. The lines that
belong to resilient-flows are marked; everything else is ordinary PyTorch.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn

from resilient_flows.training import from_env


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step-s", type=float, default=0.0, help="sleep per step, to be caught mid-run")
    parser.add_argument("--gate", help="a file to wait for before step --hold-at: a test's member, caught mid-run")
    parser.add_argument("--hold-at", type=int, default=0)
    args = parser.parse_args()

    run = from_env()  # resilient-flows (1/3)
    torch.manual_seed(run.params["seed"])
    data = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 8, generator=data)
    y = x @ torch.randn(8, 1, generator=data)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    start = run.restore(model=model, optimizer=optimizer)  # resilient-flows (2/3)
    for step in range(start, run.params["steps"]):
        batch = slice((step % 4) * 16, (step % 4 + 1) * 16)  # the data position follows from the step
        loss = nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_s)
        while args.gate and step + 1 == args.hold_at and not os.path.exists(args.gate):
            time.sleep(0.05)  # changes no weight
        run.step(step, loss=loss.item())  # resilient-flows (3/3)
    run.close(model=model)  # commit the last step; its report becomes the member's result


if __name__ == "__main__":
    main()
