"""A checkpointed loop run as a Parsl stage by ``test_resilience_app``: it kills its own worker once."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

import numpy as np

from resilient_flows.resilience import Context


def heat(ctx: Context, steps: int, kill_at: int = -1, marker: str | None = None) -> str:
    """A 64 x 64 heat stencil; on the first attempt SIGKILLs its worker at ``kill_at``; the digest of the fields."""
    u = np.zeros((64, 64))
    v = np.zeros((64, 64))
    u[32, 32] = 100.0

    def step() -> None:
        v[1:-1, 1:-1] = u[1:-1, 1:-1] + 0.1 * (
            u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
        )
        u[...] = v

    first_attempt = marker is not None and not Path(marker).exists()
    for i in range(max(ctx.latest_version("heat"), 0), steps):
        if first_attempt and i == kill_at:
            Path(marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        ctx.checkpoint("heat", i, step)
    return hashlib.sha256(u.tobytes() + v.tobytes()).hexdigest()
