"""Data-parallel training under mpiexec, for tests/test_mpi.py.

Each rank trains on its own slice of every batch with its own dropout masks (its own torch
generator), and gradients are averaged and buffers broadcast with MPI, so parameters stay replicated while the RNG
states differ per rank: resuming is exact only if every rank gets its own generator back.

usage: mpiexec -n N python mpi_worker.py MODE DIR   (MODE: reference, save, resume, load, damaged)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from mpi4py import MPI
from trainkit import Problem, replicated_digest

from resilient_flows.checkpoint import Checkpointer

SAVE_AT, TOTAL = 11, 24


def dp_step(problem: Problem, comm: MPI.Comm, step: int) -> float:
    x, y = problem.batch(step)
    share = slice(comm.rank * len(x) // comm.size, (comm.rank + 1) * len(x) // comm.size)
    problem.model.train()
    problem.optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(problem.model(x[share]), y[share])
    loss.backward()
    for b in problem.model.buffers():  # BatchNorm statistics: rank 0's, as SyncBatchNorm would agree
        comm.Bcast(b.numpy(), root=0)
    for p in problem.model.parameters():
        comm.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)
        p.grad /= comm.size
    problem.optimizer.step()
    problem.scheduler.step()
    problem.state.extra["step"] = step
    return comm.allreduce(loss.item()) / comm.size


def make(comm: MPI.Comm) -> Problem:
    problem = Problem(seed=0, width=512, depth=3)
    torch.manual_seed(1000 + comm.rank)  # per-rank dropout masks
    problem.state.rank_extra["rank"] = comm.rank
    return problem


def main(mode: str, directory: Path) -> None:
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    problem = make(comm)
    out: dict = {"rank": comm.rank, "size": comm.size}
    ck = Checkpointer([directory / "local", directory / "shared"], comm=comm)
    if mode == "reference":
        out["losses"] = [dp_step(problem, comm, s) for s in range(TOTAL)]
    elif mode == "save":
        for s in range(SAVE_AT + 1):
            dp_step(problem, comm, s)
        ck.save(SAVE_AT, problem.state)
        out["digest"] = replicated_digest(problem.state)
        ck.wait()
        out["bytes_written"] = ck.stats.bytes_written
        for s in range(SAVE_AT + 1, SAVE_AT + 4):  # lost work
            dp_step(problem, comm, s)
    elif mode == "resume":
        out["restored"] = ck.restore(problem.state)
        out["losses"] = [dp_step(problem, comm, s) for s in range(SAVE_AT + 1, TOTAL)]
    elif mode == "damaged":
        out["restored"] = ck.restore(problem.state)
        out["skipped"] = [[s.step, s.tier, s.reason] for s in ck.skipped]
    elif mode == "load":
        out["restored"] = ck.restore(problem.state)
        out["digest"] = replicated_digest(problem.state)
        out["rank_extra"] = problem.state.rank_extra
    ck.close()
    (directory / f"{mode}-{comm.size}-{comm.rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
