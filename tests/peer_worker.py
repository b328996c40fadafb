"""One rank of a job with a peer tier whose ranks sit on emulated nodes, for tests/test_peer.py.

usage: python peer_worker.py MODE DIR LAYOUT NODES [CAPACITY]
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun sets them)

NODES names each rank's node, comma-separated (``n0,n1``): rank r's node-local tier is
DIR/nodes/<node>/local and its node's peer tier DIR/nodes/<node>/peer, so no node sees another's,
as on a cluster. The shared tier is DIR/shared. LAYOUT is ddp (replicated) or fsdp (sharded).

MODE save: six Adam steps, a checkpoint after each (every third also to the shared tier); the full
    tensors after each step go to DIR/reference-<step>.safetensors. Reports the peer statistics.
MODE restore: restore into a fresh model and report the step, the tensors that differ from that
    step's reference, and where the restore read every shard and how many bytes from each source;
    then save the next step and report whether it reached the shared tier.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from sharded_worker import ddp, fresh, fsdp, full_tensors, same, trained

from resilient_flows.checkpoint import Checkpointer, TierSpec

STEPS = 6
PERSIST_EVERY = 3


def checkpointer(directory: Path, node: str, capacity: int | None) -> Checkpointer:
    here = directory / "nodes" / node
    tiers = [
        TierSpec(here / "local"),
        TierSpec(here / "peer", peer=True, capacity=capacity),
        TierSpec(directory / "shared", persist_every=PERSIST_EVERY),
    ]
    return Checkpointer(tiers=tiers, keep=STEPS, comm=dist.group.WORLD, node=node)


def save(directory: Path, wrap, node: str, capacity: int | None) -> dict:
    state, step = trained(wrap, steps=0)
    with checkpointer(directory, node, capacity) as ck:
        for s in range(STEPS):
            step()
            reference = full_tensors(state)
            ck.save(s, state)
            if dist.get_rank() == 0:
                save_file(reference, str(directory / f"reference-{s}.safetensors"))
        ck.wait()
        stats = ck.stats
    return {"peer_held_bytes": stats.peer_held_bytes, "peer_skipped": stats.peer_skipped, "failed": stats.peer_failed}


def restore(directory: Path, wrap, node: str, capacity: int | None) -> dict:
    state = fresh(wrap)
    with checkpointer(directory, node, capacity) as ck:
        restored = ck.restore(state)
        report = {
            "step": restored,
            "skipped": [(s.step, s.tier) for s in ck.skipped],
            "read_from": ck.restored.read_from,
            "bytes_from": ck.restored.bytes_from,
        }
        ck.save(restored + 1, state)  # the next save: through every tier when a peer copy was read
        ck.wait()
        report["next_in_shared"] = restored + 1 in ck.shared.committed_steps()
    report["differ"] = same(state, load_file(str(directory / f"reference-{restored}.safetensors")))
    return report


def main(mode: str, directory: Path, layout: str, nodes: str, capacity: str | None = None) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    wrap = {"ddp": ddp, "fsdp": fsdp}[layout]
    node = nodes.split(",")[dist.get_rank()]
    limit = None if capacity is None else int(capacity)
    report = (save if mode == "save" else restore)(directory, wrap, node, limit)
    (directory / f"{mode}-{dist.get_world_size()}-{dist.get_rank()}.json").write_text(json.dumps(report))
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:])
