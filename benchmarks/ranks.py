"""Starting a benchmark's ranks as ``torchrun`` would, and watching them: one failed rank, or a
run past its deadline, stops them all (each rank's process group, so that helpers a rank started
go too) and ends the benchmark with the exit codes, never a hang."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["free_port", "run_ranks", "torchrun_env"]

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_env(world: int, master: str = "127.0.0.1") -> dict[str, str]:
    """This environment with what every rank shares: the world size, rank 0's address and a free
    port, one torch thread, the repository importable."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": master, "MASTER_PORT": str(free_port())}
    env["WORLD_SIZE"] = str(world)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def run_ranks(commands: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]], timeout: float) -> None:
    """Run one process per rank (``commands[r]`` with ``envs[r]``) until all exit 0; SystemExit
    naming the exit codes when one fails or the run outlives ``timeout`` seconds."""
    procs = [
        subprocess.Popen(list(command), env=dict(env), start_new_session=True)
        for command, env in zip(commands, envs, strict=True)
    ]
    world = len(procs)
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                why = f"exit codes {[p.returncode for p in procs]}" if failed else f"no end after {timeout:.0f} s"
                raise SystemExit(f"the {world}-rank run failed: {why}")
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    if any(p.returncode for p in procs):
        raise SystemExit(f"the {world}-rank run failed: exit codes {[p.returncode for p in procs]}")
