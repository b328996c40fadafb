"""A peer tier over an mpi4py communicator, for tests/test_peer.py.

usage: mpiexec -n 2 python peer_mpi_worker.py MODE DIR   (MODE: save, restore)

Rank r runs on emulated node ``n<r>`` to save and on ``n<2r>`` to restore (node n1 was lost, n2 is
new). The state is one 24 MiB tensor, so that each rank's shard crosses in several messages.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from mpi4py import MPI

from resilient_flows.checkpoint import Checkpointer, TierSpec


def checkpointer(directory: Path, node: str) -> Checkpointer:
    here = directory / "nodes" / node
    tiers = [TierSpec(here / "local"), TierSpec(here / "peer", peer=True), TierSpec(directory / "shared")]
    return Checkpointer(tiers=tiers, comm=MPI.COMM_WORLD, node=node, heartbeat=False)


def state(seed: int) -> dict[str, torch.Tensor]:
    return {"weights": torch.randn(6 << 20, generator=torch.Generator().manual_seed(seed))}


def main(mode: str, directory: Path) -> None:
    rank = MPI.COMM_WORLD.rank
    if mode == "save":
        with checkpointer(directory, f"n{rank}") as ck:
            for step in range(3):
                ck.save(step, state(step))
            ck.wait()
            report = {"peer_held_bytes": ck.stats.peer_held_bytes}
    else:
        restored = {"weights": torch.zeros(6 << 20)}
        with checkpointer(directory, f"n{2 * rank}") as ck:
            step = ck.restore(restored)
            report = {
                "step": step,
                "equal": torch.equal(restored["weights"], state(2)["weights"]),
                "bytes_from": ck.restored.bytes_from,
            }
    (directory / f"{mode}-{MPI.COMM_WORLD.size}-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
