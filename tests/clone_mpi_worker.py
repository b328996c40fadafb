"""Cloning over MPI under mpiexec, for tests/test_clone_mpi.py.

The first ranks are a data-parallel source, the last ones its clone(s). The source trains
``FORK_AT`` steps, hands its TrainState (model, optimizer, scheduler, RNG, extra values of awkward
dtypes and layouts) to the clone ranks with :mod:`resilient_flows.clone._mpi`, then trains ``STEPS``
more; the clones receive into freshly built (differently initialised) models and train the same
steps. Gradients are averaged over each side's own ranks with MPI.

usage: mpiexec -n N python clone_mpi_worker.py MODE DIR
MODE: background (start_send_state, one clone); blocking (send_state, one clone, after a first
attempt into a narrower model that both sides must refuse with a clear message); sliced (each rank
trains its slice of the batch with its own dropout, as many clones as sources)
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI
from trainkit import Problem, replicated_digest

from resilient_flows.checkpoint import plan_send
from resilient_flows.clone._mpi import CloneTransferStats, StagingBuffer, recv_state, send_state, start_send_state
from resilient_flows.errors import ResilientFlowsError

#: At width 640 the largest arrays (1.6 MB) exceed a piece, so two ranks split them.
FORK_AT, STEPS, WIDTH = 5, 50, 640


def odd_extras(real: bool) -> dict:
    """Values numpy cannot hold or that are not contiguous; zeros of the same kind on the clone."""
    g = torch.Generator().manual_seed(5)
    bf16 = torch.randn(5, 7, generator=g).to(torch.bfloat16)
    scalar = torch.tensor(3.25, dtype=torch.float64)
    transposed = torch.arange(12.0).reshape(3, 4).t()
    strided = np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2]
    if not real:
        bf16, scalar, transposed = torch.zeros_like(bf16), torch.zeros_like(scalar), torch.zeros(4, 3)
        strided = np.zeros((3, 2), dtype=np.int16)
    return {"bf16": bf16, "scalar": scalar, "transposed": transposed, "strided": strided, "empty": torch.zeros(0, 3)}


def extras_match(extra: dict) -> bool:
    expected = odd_extras(True)
    for key, value in expected.items():
        got = extra[key]
        if isinstance(value, np.ndarray):
            if not (isinstance(got, np.ndarray) and got.dtype == value.dtype and np.array_equal(got, value)):
                return False
        elif got.dtype != value.dtype or got.shape != value.shape or not torch.equal(got, value):
            return False
    return True


def build(seed: int, rng_seed: int, rank: int, width: int = WIDTH) -> Problem:
    problem = Problem(seed=seed, width=width, depth=3)
    torch.manual_seed(rng_seed)  # dropout masks and the loss noise draw from here
    problem.state.rank_extra["rank"] = rank
    problem.state.extra.update(odd_extras(real=seed == 0))
    return problem


def dp_step(problem: Problem, dp: MPI.Comm, step: int, sliced: bool) -> float:
    x, y = problem.batch(step)
    share = slice(dp.rank * len(x) // dp.size, (dp.rank + 1) * len(x) // dp.size) if sliced else slice(None)
    problem.model.train()
    problem.optimizer.zero_grad()
    noise = torch.rand(()) * 1e-3
    loss = torch.nn.functional.cross_entropy(problem.model(x[share]), y[share]) + noise
    loss.backward()
    if dp.size > 1:
        for b in problem.model.buffers():  # BatchNorm statistics: rank 0's, as SyncBatchNorm would agree
            dp.Bcast(b.numpy(), root=0)
        for p in problem.model.parameters():
            dp.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)
            p.grad /= dp.size
    problem.optimizer.step()
    problem.scheduler.step()
    problem.state.extra["step"] = step
    return dp.allreduce(loss.item()) / dp.size


def split_arrays(problem: Problem, ranks: int) -> int:
    """How many arrays of the replicated state the plan cuts into pieces (to show it is exercised)."""
    state = problem.state.state_dict()
    plans = [plan_send(state, range(ranks), index) for index in range(ranks)]
    return len({item.name for plan in plans for item in plan.items if not item.whole})


def error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def main(mode: str, directory: Path) -> None:
    world = MPI.COMM_WORLD
    torch.set_num_threads(1)
    sliced = mode == "sliced"
    n_clones = world.size // 2 if sliced else 1
    sources = list(range(world.size - n_clones))
    clones = list(range(world.size - n_clones, world.size))
    is_source = world.rank in sources
    dp = world.Split(0 if is_source else 1, world.rank)
    out: dict = {"rank": world.rank, "role": "source" if is_source else "clone", "error": None}
    if is_source:
        rng_seed = 1000 + dp.rank if sliced else 1000
        problem = build(seed=0, rng_seed=rng_seed, rank=world.rank)
        for s in range(FORK_AT):
            dp_step(problem, dp, s, sliced)
        out["digest"] = replicated_digest(problem.state)
        out["split_arrays"] = split_arrays(problem, len(sources))
        try:
            if mode == "blocking":
                try:
                    send_state(world, problem.state, clones, sources, timeout=60)
                except ResilientFlowsError as exc:
                    out["refused"] = error(exc)
                started = time.perf_counter()
                stats = send_state(world, problem.state, clones, sources, timeout=60)
            else:
                staging = StagingBuffer()
                started = time.perf_counter()
                pending = start_send_state(world, problem.state, clones, sources, timeout=60, staging=staging)
            out["returned_s"] = time.perf_counter() - started
            out["losses"] = [dp_step(problem, dp, s, sliced) for s in range(FORK_AT, FORK_AT + STEPS)]
            if mode != "blocking":
                stats = pending.wait()
                staging.acquire(1)  # the finished transfer gave the buffer back
                out["staging_allocations"] = staging.allocations
            out["stats"] = asdict(stats)
        except ResilientFlowsError as exc:
            out["error"] = error(exc)
    else:
        if mode == "blocking":
            narrow = build(seed=7, rng_seed=4242, rank=world.rank, width=WIDTH // 2)
            try:
                recv_state(world, sources, narrow.state, timeout=60)
            except ResilientFlowsError as exc:
                out["refused"] = error(exc)
        problem = build(seed=7, rng_seed=4242, rank=world.rank)
        stats = CloneTransferStats()
        try:
            received = recv_state(world, sources, problem.state, timeout=60, stats=stats)
            out["stats"] = asdict(stats)
            live = problem.model.state_dict()  # received straight into the parameters, not beside them
            out["in_place"] = all(received["model"][k].data_ptr() == v.data_ptr() for k, v in live.items())
            out["digest"] = replicated_digest(problem.state)
            out["rank_extra"] = problem.state.rank_extra
            out["extras_match"] = extras_match(problem.state.extra)
            out["losses"] = [dp_step(problem, dp, s, sliced) for s in range(FORK_AT, FORK_AT + STEPS)]
        except ResilientFlowsError as exc:
            out["error"] = error(exc)
    dp.Free()
    (directory / f"{mode}-{world.size}-{world.rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
