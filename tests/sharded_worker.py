"""One rank of an FSDP2 / DDP job (gloo, CPU) saving or resharding a checkpoint, for tests/test_sharded.py.

usage: python sharded_worker.py MODE DIR   (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun sets them)

MODE save: train FSDP2 and DDP copies of one model (and on 4 ranks an HSDP one: a 2 x 2 mesh, shards
    replicated twice) for a few steps on WORLD_SIZE ranks, save them to DIR/fsdp, DIR/ddp,
    DIR/hsdp, and write the full tensors (parameters and Adam moments) to
    DIR/reference-{fsdp,ddp,hsdp}.safetensors.
MODE restore: restore DIR/fsdp into FSDP2 and into DDP on WORLD_SIZE ranks, DIR/ddp and DIR/hsdp into FSDP2,
    and report per case whether every full tensor equals the reference bitwise; then try a model
    of other shapes (must be refused, state untouched) and close a Checkpointer after
    destroy_process_group.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from resilient_flows.checkpoint import Checkpointer, StateMismatchError, TrainState

WIDTHS = (13, 37, 29, 5)  # odd sizes: shards are uneven on 2, 3 and 4 ranks


def model(widths: tuple[int, ...] = WIDTHS) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def fsdp(module: torch.nn.Module) -> torch.nn.Module:
    for child in module:
        if any(True for _ in child.parameters()):
            fully_shard(child)
    return fully_shard(module)


def hsdp(module: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 over a 2 x 2 mesh: shards over one dimension, replicas over the other (placements Replicate, Shard(0))."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    for child in module:
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)
    return fully_shard(module, mesh=mesh)


def ddp(module: torch.nn.Module) -> torch.nn.Module:
    return DistributedDataParallel(module)


def trained(wrap, steps: int = 3) -> tuple[TrainState, object]:
    """A wrapped model after ``steps`` Adam steps, and a function that takes one more step."""
    net = wrap(model())
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1 + dist.get_rank())

    def step() -> None:
        x = torch.randn(8, WIDTHS[0], generator=generator)
        net(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(steps):
        step()
    return TrainState(net, optimizer, extra={"epoch": 2}, rank_extra={"rank": dist.get_rank()}), step


def fresh(wrap, widths: tuple[int, ...] = WIDTHS) -> TrainState:
    net = wrap(model(widths))
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(0.5)
    return TrainState(net, torch.optim.Adam(net.parameters(), lr=0.5))


def full_tensors(state: TrainState) -> dict[str, torch.Tensor]:
    """Every parameter and Adam moment as a full plain tensor, by name (collective under FSDP)."""
    out = {}
    for name, value in get_model_state_dict(state.model).items():
        out[f"model.{name}"] = value.full_tensor() if isinstance(value, DTensor) else value.detach().clone()
    for name, moments in get_optimizer_state_dict(state.model, state.optimizer)["state"].items():
        for key, value in moments.items():
            out[f"optim.{name}.{key}"] = value.full_tensor() if isinstance(value, DTensor) else value.detach().clone()
    return out


def same(state: TrainState, reference: dict[str, torch.Tensor]) -> list[str]:
    """Names whose full tensor differs from the reference, bit for bit."""
    now = full_tensors(state)
    if set(now) != set(reference):
        return sorted(set(now) ^ set(reference))
    return [n for n in sorted(now) if not torch.equal(now[n].contiguous(), reference[n].contiguous())]


def save(directory: Path) -> dict:
    report = {}
    layouts = (("fsdp", fsdp), ("ddp", ddp), ("hsdp", hsdp))
    for label, wrap in layouts if dist.get_world_size() == 4 else layouts[:2]:
        state, step = trained(wrap)
        reference = full_tensors(state)
        with Checkpointer(directory / label, comm=dist.group.WORLD) as ck:
            ck.prepare(state)
            ck.save(3, state, overlap=True)  # local shards copied behind the next step
            step()  # optimizer.step() waits for that copy: the checkpoint is the state at the call
            ck.wait()
            report[f"{label}_bytes"] = ck.stats.bytes_written
        if dist.get_rank() == 0:
            save_file(reference, str(directory / f"reference-{label}.safetensors"))
    return report


def restore(directory: Path) -> dict:
    report: dict = {}
    cases = (
        ("fsdp->fsdp", "fsdp", fsdp),
        ("fsdp->ddp", "fsdp", ddp),
        ("ddp->fsdp", "ddp", fsdp),
        ("hsdp->fsdp", "hsdp", fsdp),
    )
    for case, source, wrap in cases:
        state = fresh(wrap)
        with Checkpointer(directory / source, comm=dist.group.WORLD) as ck:
            report[f"{case} step"] = ck.restore(state)
        report[f"{case} differ"] = same(state, load_file(str(directory / f"reference-{source}.safetensors")))
        report[f"{case} extra"] = [state.extra, state.rank_extra]
    other = fresh(fsdp, (13, 37, 31, 5))
    before = full_tensors(other)
    with Checkpointer(directory / "fsdp", comm=dist.group.WORLD) as ck:
        try:
            ck.restore(other)
        except StateMismatchError as exc:
            report["mismatch"] = str(exc)
    report["mismatch untouched"] = not same(other, before)
    return report


def main(mode: str, directory: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    report = save(directory) if mode == "save" else restore(directory)
    rank, world = dist.get_rank(), dist.get_world_size()
    closed_late = Checkpointer(directory / "closed-late", comm=dist.group.WORLD)
    left_open = Checkpointer(directory / "left-open", comm=dist.group.WORLD)
    for ck in (closed_late, left_open):
        ck.save(1, {"w": torch.ones(3)})
        ck.wait()
    dist.destroy_process_group()
    closed_late.close()  # after the group is gone; left_open is closed by the exit hook
    (directory / f"{mode}-{world}-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
