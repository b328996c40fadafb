"""A workload that prints through every channel a member has, and fails when its name says so."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from resilient_flows.training import TrainContext


def train(ctx: TrainContext) -> dict[str, Any]:
    print(f"stdout of {ctx.name}, attempt {ctx.attempt}")
    print(f"stderr of {ctx.name}, attempt {ctx.attempt}", file=sys.stderr)
    sys.stdout.flush()
    subprocess.run([sys.executable, "-c", f"print('a child process of {ctx.name}')"], check=True)
    os.write(1, f"descriptor 1 of {ctx.name}\n".encode())  # as a C extension writes
    if ctx.name.startswith("bad"):
        raise ValueError(f"{ctx.name} cannot train (attempt {ctx.attempt})")
    return {"member": ctx.name}
