"""A member's ranks forked, ``torchrun``-style, from one process that has imported torch already.

A fresh rank pays seconds of imports (torch, ``torch.distributed.checkpoint``, and ``torch._dynamo``
at the optimizer's first step) before its first step: a benchmark that launches many short
attempts of a member spends most of its time there. Forked from a process that paid them once,
each rank starts at its member's entry point (``mpi_member.main``) with nothing of a previous
attempt in memory: what it trains from is the run directory's checkpoint, as after a real launch.
The ranks form their group from ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``;
as under ``mpiexec``, one rank that fails stops the others after a grace period.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from ranks import free_port

from resilient_flows.sites._preload import preload

GRACE_S = 15.0  # how long the other ranks may take to stop once one rank failed (a preemption commits first)


def warm() -> None:
    """Import what every rank imports, and take an optimizer step (it imports ``torch._dynamo``),
    in this process, once; it must start no thread that a fork would copy mid-lock. numpy's
    OpenBLAS pool, which starts at import on a machine of several cores, is not counted: it stops
    and restarts around a fork, as the warm pools' fork servers count it too."""
    failed, started = preload(["torch", "resilient_flows.training._run", "resilient_flows.training.mpi_member"])
    if failed:
        raise RuntimeError(f"cannot import what the ranks import: {'; '.join(failed)}")
    import torch

    weight = torch.zeros(1, requires_grad=True)
    weight.grad = torch.zeros(1)
    torch.optim.SGD([weight], lr=0.1).step()
    if started:
        raise RuntimeError(f"the launcher's imports started {started} thread(s): forking it would copy their locks")


def run_forked(spec: Path, run_dir: Path, ranks: int, log: Path, timeout: float = 600.0) -> int:
    """Run one attempt of the member of ``spec`` on ``ranks`` forked ranks; its exit status as
    ``subprocess`` gives it (negative: killed by that signal), the first failed rank's."""
    port = free_port()
    pids = []
    try:
        for rank in range(ranks):
            pid = os.fork()
            if pid == 0:
                _rank(rank, ranks, port, spec, run_dir, log)
            pids.append(pid)
        return _wait(pids, timeout)
    except BaseException:  # interrupted: no rank outlives the benchmark
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        raise


def _rank(rank: int, world: int, port: int, spec: Path, run_dir: Path, log: Path) -> None:
    """The child: a session of its own (its loader's workers stop with it), the launcher's variables,
    its output in ``log``, then the member's entry point; it never returns."""
    status = 1
    try:
        os.setsid()
        launch = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": world}
        os.environ.update({key: str(value) for key, value in launch.items()})
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        from resilient_flows.training import mpi_member

        status = mpi_member.main([str(spec), str(run_dir)])
    except BaseException:  # a rank's failure is its exit status, as for a launched process
        traceback.print_exc()
    finally:
        logging.shutdown()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


def _wait(pids: list[int], timeout: float) -> int:
    statuses: dict[int, int] = {}
    deadline, stop_at = time.monotonic() + timeout, None
    while len(statuses) < len(pids):
        for pid in pids:
            if pid in statuses:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                statuses[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                if statuses[pid] != 0 and stop_at is None:
                    stop_at = time.monotonic() + GRACE_S
        now = time.monotonic()
        if now > deadline or (stop_at is not None and now > stop_at):
            for pid in set(pids) - set(statuses):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            stop_at = deadline = float("inf")
        time.sleep(0.02)
    failed = [statuses[pid] for pid in pids if statuses[pid] != 0]
    return failed[0] if failed else 0
