"""Starting a benchmark's ranks as ``torchrun`` would, and watching them: one failed rank, or a
run past its deadline, stops them all (each rank's process group, so that helpers a rank started
go too) and ends the benchmark with the exit codes, never a hang."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["free_port", "launch_ranks", "rank_options", "run_ranks", "torchrun_env"]

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


def rank_options(parser: argparse.ArgumentParser) -> None:
    """``--dir`` for the ranks' checkpoints, and the hidden ``--rank-of SPEC`` (parsed) by which
    :func:`launch_ranks` starts the script again as one rank."""
    parser.add_argument("--dir", type=Path, help="where the checkpoints go (default: a temporary directory in /tmp)")
    parser.add_argument("--rank-of", type=json.loads, help=argparse.SUPPRESS)


def launch_ranks(
    script: str,
    spec: Mapping[str, object],
    envs: Sequence[Mapping[str, str]],
    reports: Sequence[Path],
    timeout: float,
    prefixes: Sequence[Sequence[str]] = (),
) -> list[dict]:
    """Run ``script --rank-of SPEC`` once per rank (behind ``prefixes[r]``, such as ``nsenter``, if
    given) and read back the report each rank wrote to ``reports[r]``: a benchmark's rank keeps its
    figures in a file, since its output is its own and interleaves with the others'."""
    command = [sys.executable, script, "--rank-of", json.dumps(spec)]
    wrapped = [[*(prefixes[r] if prefixes else ()), *command] for r in range(len(envs))]
    run_ranks(wrapped, envs, timeout)
    return [json.loads(path.read_text()) for path in reports]
