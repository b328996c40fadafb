"""One rank of a job whose ranks sit on different (emulated) nodes, for tests/test_nodes.py.

usage: python nodes_worker.py MODE DIR LAYOUT   (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun sets them)

Rank r's node-local tier is DIR/nodes/node-r: no rank sees another's, as on a cluster. The shared
tier is DIR/shared. LAYOUT is ddp (state replicated on every rank) or fsdp (sharded).

MODE save: six Adam steps, a checkpoint after each (every third also to the shared tier); the full
    tensors after each step go to DIR/reference-<step>.safetensors.
MODE restore: restore into a fresh model and report the step, whether every full tensor equals that
    step's reference bitwise, the checkpoints skipped on the way, and where every shard came from.
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


def checkpointer(directory: Path) -> Checkpointer:
    local = directory / "nodes" / f"node-{dist.get_rank()}"
    return Checkpointer(
        [local, TierSpec(directory / "shared", persist_every=PERSIST_EVERY)], keep=STEPS, comm=dist.group.WORLD
    )


def save(directory: Path, wrap) -> dict:
    state, step = trained(wrap, steps=0)
    with checkpointer(directory) as ck:
        for s in range(STEPS):
            step()
            reference = full_tensors(state)
            ck.save(s, state)
            if dist.get_rank() == 0:
                save_file(reference, str(directory / f"reference-{s}.safetensors"))
        ck.wait()
    return {}


def restore(directory: Path, wrap) -> dict:
    state = fresh(wrap)
    with checkpointer(directory) as ck:
        restored = ck.restore(state)
        skipped = [(s.step, s.tier) for s in ck.skipped]
        read_from, bytes_from = ck.restored.read_from, ck.restored.bytes_from
    differ = same(state, load_file(str(directory / f"reference-{restored}.safetensors")))
    return {"step": restored, "differ": differ, "skipped": skipped, "read_from": read_from, "bytes_from": bytes_from}


def main(mode: str, directory: Path, layout: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    wrap = {"ddp": ddp, "fsdp": fsdp}[layout]
    report = save(directory, wrap) if mode == "save" else restore(directory, wrap)
    (directory / f"{mode}-{dist.get_world_size()}-{dist.get_rank()}.json").write_text(json.dumps(report))
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
