"""A workload that prints through every channel a member has, and fails when its name says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from resilient_flows.training import TrainContext


def train(ctx: TrainContext) -> dict[str, Any]:
    me = f"{ctx.name} rank {ctx.rank}"
    print(f"stdout of {me}, attempt {ctx.attempt}")
    print(f"stderr of {me}, attempt {ctx.attempt}", file=sys.stderr)
    subprocess.run([sys.executable, "-c", f"print('a child process of {me}')"], check=True)
    os.write(1, f"descriptor 1 of {me}\n".encode())  # as a C extension writes
    if ctx.name.startswith("bad"):
        raise ValueError(f"{ctx.name} cannot train (attempt {ctx.attempt})")
    return {"member": ctx.name}


def loop(ctx: Any, output: Path, inputs: dict[str, Path]) -> str:
    """A stage's loop function that prints to both streams and finishes."""
    print("stdout of the stage loudly")
    print("stderr of the stage loudly", file=sys.stderr)
    return "done"
