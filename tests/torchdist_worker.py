"""Two ranks of torch.distributed (gloo) saving one sharded checkpoint, for tests/test_torchdist.py.

usage: python torchdist_worker.py RANK WORLD PORT DIR
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from trainkit import Problem, replicated_digest

from resilient_flows.checkpoint import Checkpointer


def main(rank: int, world: int, port: int, directory: Path) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    problem = Problem(seed=0, width=512, depth=3)
    for step in range(3):
        problem.step(step)
    problem.state.rank_extra["rank"] = rank
    with Checkpointer(directory, comm=dist.group.WORLD) as ck:
        ck.save(2, problem.state)
        ck.wait()
        written = ck.stats.bytes_written
        restored = ck.restore(Problem(seed=1, width=512, depth=3).state)
    out = {"digest": replicated_digest(problem.state), "bytes_written": written, "restored": restored}
    (directory / f"rank-{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
