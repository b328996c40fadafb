"""``mpiexec -n 2 python distributed_worker.py DIR``: the checks of test_distributed_members that need ranks.

One launch does them all, since starting ranks (torch and DDP's imports) costs more
than the checks:

1. the process group forms from mpiexec's environment alone (no communicator given), all-reduces,
   and ``init_process_group`` / ``shutdown_process_group`` pair up idempotently;
2. ``ctx.wrap`` with ``parallel: fsdp`` shards a model's parameters over the ranks;
3. every member spec ``DIR/specs/RUN/*.json`` runs through the real entry point
   (``mpi_member.main``), in name order, in the run directory ``DIR/RUN``; its exit status is
   reported, or the error it raised.

Each rank writes ``DIR/rank-R.json``. Also the workload that cannot be wrapped (``parameterless``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from resilient_flows.training import MemberSpec, TrainContext, init_process_group, shutdown_process_group
from resilient_flows.training.mpi_member import main as mpi_member


def parameterless(ctx: TrainContext) -> dict[str, Any]:
    """A workload whose model has nothing to shard: ``ctx.wrap`` refuses it."""
    model = nn.Sequential(nn.ReLU())
    ctx.wrap(model)
    raise AssertionError("ctx.wrap accepted a model without parameters")


def group_checks() -> dict[str, Any]:
    info = init_process_group(timeout=60)
    again = init_process_group()
    total = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(total, group=info.group)
    shutdown_process_group()
    still = dist.is_initialized()
    shutdown_process_group()
    return {
        "rank": info.rank,
        "world_size": info.world_size,
        "local_rank": info.local_rank,
        "backend": info.backend,
        "launcher": info.launcher,
        "device": str(info.device),
        "sum": total.item(),
        "same_info": again is info,
        "initialized_after_first_shutdown": still,
        "initialized_after_second_shutdown": dist.is_initialized(),
    }


def fsdp_checks(directory: Path) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    spec = MemberSpec(name="wrap", workload="mlp-digits", params={}, ranks=2, parallel="fsdp")
    ctx = TrainContext(spec, directory)
    try:
        model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
        wrapped = ctx.wrap(model)
        params = dict(model.named_parameters())
        return {
            "same_module": wrapped is model,
            "class": type(model).__name__,
            "sharded": all(isinstance(p, DTensor) for p in params.values()),
            "local_shapes": {name: list(p.to_local().shape) for name, p in params.items()},
            "ctx": [ctx.rank, ctx.world_size, ctx.group is not None],
        }
    finally:
        ctx.close()


def main(directory: Path) -> None:
    report: dict[str, Any] = {"group": group_checks(), "fsdp": fsdp_checks(directory / "wrap"), "members": {}}
    for path in sorted((directory / "specs").glob("*/*.json")):
        name = json.loads(path.read_text())["name"]
        try:
            report["members"][name] = mpi_member([str(path), str(directory / path.parent.name)])
        except Exception as exc:  # an injected error: the other members still run
            report["members"][name] = f"{type(exc).__name__}: {exc}"
    rank = report["group"]["rank"]
    (directory / f"rank-{rank}.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
