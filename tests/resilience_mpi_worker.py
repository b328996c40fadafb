"""A domain-decomposed heat stencil under mpiexec, checkpointed by resilience.Context, for test_resilience_mpi.

Each rank owns a slice of a 1-D rod plus two halo cells, exchanged with its neighbours every
iteration; only rank 0's slice starts hot, so the ranks' arrays differ and must come back per rank.

usage: mpiexec -n N python resilience_mpi_worker.py MODE DIR   (MODE: reference, crash, resume)
A resume that is refused (another number of ranks) reports the error instead of digests.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from resilient_flows.errors import StateMismatchError
from resilient_flows.resilience import Context, every

TOTAL, COMMITTED, CRASH_AFTER, CELLS = 120, 39, 57, 64


def main(mode: str, directory: Path) -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    u = np.zeros(CELLS + 2)
    v = np.zeros(CELLS + 2)
    if rank == 0:
        u[1:9] = 100.0

    def step() -> None:
        for neighbour, mine, halo in ((rank - 1, 1, 0), (rank + 1, CELLS, CELLS + 1)):
            if 0 <= neighbour < size:
                comm.Sendrecv(u[mine : mine + 1], neighbour, recvbuf=u[halo : halo + 1], source=neighbour)
        v[1:-1] = u[1:-1] + 0.25 * (u[:-2] - 2 * u[1:-1] + u[2:])
        u[1:-1] = v[1:-1]

    restart = -1
    if mode == "reference":
        for _ in range(TOTAL):
            step()
    else:
        ctx = Context(directory / "ckpt", filter=every(10), comm=comm)
        restart = ctx.latest_version("rod")
        try:
            ctx.checkpoint("rod", max(restart, 0), step)
        except StateMismatchError as exc:
            (directory / f"{mode}-{size}-{rank}.json").write_text(json.dumps({"error": str(exc)}))
            return
        for i in range(max(restart, 0) + 1, TOTAL):
            ctx.checkpoint("rod", i, step)
            if mode == "crash" and i == COMMITTED:
                ctx.wait()  # the iterations here take microseconds: make sure one checkpoint is committed
            if mode == "crash" and i == CRASH_AFTER:
                comm.Barrier()
                os._exit(0)  # no wait, no close: whatever was in flight is abandoned
        ctx.close()
    report = {
        "restart": restart,
        "digest": hashlib.sha256(u.tobytes() + v.tobytes()).hexdigest(),
        "hot": float(u.sum()),
    }
    (directory / f"{mode}-{size}-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
