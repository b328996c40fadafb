"""A 2-D heat stencil under ``resilience.Context`` that can SIGKILL itself mid-run.

Usage: ``python resilience_worker.py DIR numpy|torch STEPS KILL_AT OUT`` (``KILL_AT`` -1: no kill).
Writes the final fields to ``OUT`` (``.npz``). The numpy run uses the ``latest_version`` loop, the
torch run the ``iterations`` loop, so that both forms are exercised across a real crash.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
import torch

from resilient_flows.resilience import Context, every

N = 32


def main(directory: str, kind: str, steps: int, kill_at: int, out: str) -> None:
    torch.set_num_threads(1)
    lib = torch if kind == "torch" else np
    u = lib.zeros((N, N), dtype=lib.float64)
    v = lib.zeros((N, N), dtype=lib.float64)
    t = lib.zeros((), dtype=lib.float64)  # a scalar the loop advances, kept in a 0-d array
    u[N // 2, N // 2] = 100.0

    def step() -> None:
        inner = u[1:-1, 1:-1]
        lap = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * inner
        v[1:-1, 1:-1] = inner + 0.1 * lap
        v[0, :] = 1.0 + t  # a boundary that depends on the restored scalar
        u[...] = v
        t[...] += 0.01

    with Context(directory, filter=every(10)) as ctx:
        if kind == "torch":
            loop = ctx.iterations("heat", steps)
        else:
            loop = iter(range(max(ctx.latest_version("heat"), 0), steps))
        for i in loop:
            if i == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            ctx.checkpoint("heat", i, lambda: step())
    arrays = {"u": u, "v": v, "t": t}
    np.savez(out, **{k: a.numpy() if isinstance(a, torch.Tensor) else a for k, a in arrays.items()})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
