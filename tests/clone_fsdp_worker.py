"""An FSDP2 training on 2 ranks cloned over MPI into an FSDP2 training on 3 ranks, for tests/test_clone_mpi.py.

usage: mpiexec -n 5 python clone_fsdp_worker.py MODE DIR   (MODE: reshard)

Ranks 0-1 are the source (a mesh of their own), ranks 2-4 the clone (another mesh). One
torch.distributed world spans all five; each side shards over its own subgroup. Each rank writes
``reshard-5-RANK.json``: its side's full tensors' digest and, for the clone, the bytes it received.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from resilient_flows.checkpoint import TrainState
from resilient_flows.clone._mpi import CloneTransferStats, recv_state, send_state
from resilient_flows.training._distributed import init_process_group

SOURCES, CLONES = [0, 1], [2, 3, 4]
WIDTHS = (11, 29, 23, 3)  # uneven on 2 and on 3 ranks


def build(group: dist.ProcessGroup) -> TrainState:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(WIDTHS[0], WIDTHS[1]),
        torch.nn.Tanh(),
        torch.nn.Linear(WIDTHS[1], WIDTHS[2]),
        torch.nn.Tanh(),
        torch.nn.Linear(WIDTHS[2], WIDTHS[3]),
    )
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in net:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return TrainState(net, torch.optim.Adam(net.parameters(), lr=0.01), rng=False)


def digest(state: TrainState) -> str:
    """Of the full parameters and Adam moments (collective over the side's mesh)."""
    h = hashlib.sha256()
    moments = get_optimizer_state_dict(state.model, state.optimizer)["state"]
    values = {**get_model_state_dict(state.model), **{f"{k}/{m}": v for k, d in moments.items() for m, v in d.items()}}
    for name in sorted(values):
        value = values[name]
        full = value.full_tensor() if isinstance(value, DTensor) else value
        h.update(name.encode() + full.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main(directory: Path) -> None:
    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    init_process_group(comm=world)
    groups = {"source": dist.new_group(SOURCES), "clone": dist.new_group(CLONES)}
    side = "source" if world.rank in SOURCES else "clone"
    state = build(groups[side])
    out: dict = {"side": side}
    if side == "source":
        generator = torch.Generator().manual_seed(world.rank)
        for _ in range(3):
            state.model(torch.randn(4, WIDTHS[0], generator=generator)).square().mean().backward()
            state.optimizer.step()
            state.optimizer.zero_grad()
        out["stats"] = send_state(world, state, CLONES, SOURCES, timeout=60).__dict__
    else:
        stats = CloneTransferStats()
        recv_state(world, SOURCES, into=state, timeout=60, stats=stats)
        out["stats"] = stats.__dict__
    out["digest"] = digest(state)
    out["local_bytes"] = sum(
        t.to_local().numel() * t.element_size() for t in get_model_state_dict(state.model).values()
    )
    (directory / f"reshard-5-{world.rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[2]))
