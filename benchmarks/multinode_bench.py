"""Checkpoints across nodes: restoring after a node loss, and saving with one rank per node.

Two questions an HPC user asks before trusting node-local tiers, each answered side by side in
one run, rounds interleaved so that a noisy neighbour slows both variants alike:

1. **Restore after a node loss.** Ranks 0..R-1 on nodes 1..R save a checkpoint to their node-local
   tiers and the shared tier; node 1 is then lost (its node-local directory deleted) and replaced
   by an empty one. The same ranks restore it, once reading every shard from the fastest copy
   their node still has (``local+shared``: R-1 shards from the nodes, one from the shared tier)
   and once from the shared tier alone (``shared``: a Checkpointer given no node-local tier).
   Before every restore the shared tier's files are evicted from the page cache
   (``posix_fadvise(DONTNEED)``), as a shared file system that another node wrote serves them
   cold; the survivors' node-local copies stay as the save left them (written moments before).
   The restored state is compared bit for bit with the saved one in both variants.
2. **One rank per node against all ranks on one node.** The same save (``save`` + ``wait``:
   committed in every node-local tier and the shared tier), with the ranks ``spread`` (rank i on
   node i: a node-local directory each, and with ``--cluster`` a network namespace each, the
   collectives crossing the bridge between them) and ``packed`` (every rank on node 1, sharing its
   directory and its loopback).

The state is a stack of square linear layers and SGD's momentum, replicated on every rank as under
DDP (the engine splits writing it among the ranks and has each replicated piece read by one rank
and broadcast): ``--quick`` 32 MiB, 192 MiB by default, 1 GiB with ``--full``.

Ranks are started as torchrun would (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
gloo, one thread each). With ``--cluster DIR/env`` (the env file of ``.ci/slurm-up --nodes N``,
run as root) rank i runs in node i's network namespace (``nsenter``) and gloo talks over the
nodes' interface; without it the nodes are emulated on this host (a node-local directory each,
loopback between them). On this machine the shared tier and the node-local ones are the same
disk, so the restore comparison measures a cold read against a warm one, which is what a real
node-local tier saves a restart from.

``python benchmarks/multinode_bench.py [--quick | --full] [--ranks R] [--rounds N] [--cluster ENV] [--json PATH]``
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from clusterenv import read_env_file
from harness import options, rounds_of, scratch, size_of, write_json
from ranks import launch_ranks, rank_options, torchrun_env
from report import judge, print_checks, print_figures

MiB = 1 << 20
#: state MiB, layer width, rounds after a warm-up
SIZES = {"quick": (32, 512, 3), "default": (192, 1024, 5), "full": (1024, 2048, 5)}
TIMEOUT_S = {"quick": 120, "default": 600, "full": 1800}

LABELS = {
    "restore_local_shared_s": (
        "restore after a node loss",
        "s",
        "local+shared: survivors' copies, shared for the rest",
    ),
    "restore_shared_s": ("restore after a node loss", "s", "shared tier alone"),
    "restore_local_shards": ("restore after a node loss", "shards", "shards read from a node-local copy"),
    "save_spread_s": ("save (commit everywhere)", "s", "spread: one rank per node"),
    "save_packed_s": ("save (commit everywhere)", "s", "packed: every rank on one node"),
    "state_mib": ("state", "MiB", "checkpointed state"),
}
RATIOS = [
    (
        "restore_speedup",
        "restore: shared alone / local+shared",
        "restore_shared_s",
        ">=",
        "restore_local_shared_s",
        None,
    ),
    ("save_spread_cost", "save: spread / packed", "save_spread_s", "<=", "save_packed_s", None),
]


# ------------------------------------------------------------------------------------------ a rank


def model_and_optimizer(spec: dict, seed: int) -> tuple[Any, Any]:
    """A model of ``spec``'s width and depth whose weights ``seed`` decides, and its SGD optimizer,
    stepped once so that its momentum buffers exist (they are checkpointed too)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(*[nn.Linear(spec["width"], spec["width"]) for _ in range(spec["depth"])])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    return model, optimizer


def rank_main(spec: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from resilient_flows.checkpoint import Checkpointer, TrainState

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    root = Path(spec["dir"])

    def checkpointer(case: str, node: str, local: bool) -> Checkpointer:
        local_dir = root / case / "nodes" / node / "local" if local else None
        return Checkpointer(
            [local_dir, root / case / "shared"] if local_dir else root / case / "shared", keep=1, comm=dist.group.WORLD
        )

    def flat(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        return [*model.state_dict().values(), *(s["momentum_buffer"] for s in optimizer.state.values())]

    model, optimizer = model_and_optimizer(spec, 1)
    state = TrainState(model, optimizer)
    report: dict[str, list[float] | int] = {"save_spread_s": [], "save_packed_s": []}
    for round_ in range(spec["rounds"] + 1):  # the first is a warm-up
        order = ["spread", "packed"] if round_ % 2 == 0 else ["packed", "spread"]
        for layout in order:
            node = f"node-{rank + 1}" if layout == "spread" else "node-1"
            shutil.rmtree(root / f"save-{layout}", ignore_errors=True) if rank == 0 else None
            dist.barrier()
            with checkpointer(f"save-{layout}", node, local=True) as ck:
                ck.prepare(state)
                dist.barrier()
                began = time.perf_counter()
                ck.save(round_, state)
                ck.wait()
                took = time.perf_counter() - began
            if round_:
                report[f"save_{layout}_s"].append(took)

    # A checkpoint saved spread, then node 1 lost and replaced by an empty node.
    with checkpointer("loss", f"node-{rank + 1}", local=True) as ck:
        ck.save(7, state)
        ck.wait()
    dist.barrier()
    if rank == 0:
        shutil.rmtree(root / "loss" / "nodes" / "node-1" / "local")
    saved = [t.clone() for t in flat(model, optimizer)]
    report |= {"restore_local_shared_s": [], "restore_shared_s": []}
    for round_ in range(spec["rounds"] + 1):
        order = [True, False] if round_ % 2 == 0 else [False, True]
        for local in order:
            fresh_model, fresh_optimizer = model_and_optimizer(spec, 2)
            fresh = TrainState(fresh_model, fresh_optimizer)
            if rank == 0:
                evict(root / "loss" / "shared")
            dist.barrier()
            with checkpointer("loss", f"node-{rank + 1}", local=local) as ck:
                began = time.perf_counter()
                step = ck.restore(fresh)
                took = time.perf_counter() - began
                sources = ck.restored.read_from
            restored = flat(fresh_model, fresh_optimizer)
            if step != 7 or any(not torch.equal(a, b) for a, b in zip(saved, restored, strict=True)):
                raise SystemExit(f"rank {rank}: the restored state differs from the saved one (local={local})")
            if round_:
                report["restore_local_shared_s" if local else "restore_shared_s"].append(took)
            if local:
                report["restore_local_shards"] = sum(
                    1 for where in sources.values() if any("local" in w for w in where)
                )
    (root / f"rank-{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def evict(directory: Path) -> None:
    """Drop ``directory``'s files from the page cache: the next read comes from the disk."""
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# ------------------------------------------------------------------------------------- the launcher


def launch(ranks: int, spec: dict, cluster: dict[str, str] | None, timeout: float) -> list[dict]:
    """Start the ranks as torchrun would, rank i in node i's namespace with a cluster; their reports."""
    if cluster is not None:
        nodes = cluster["RESILIENT_FLOWS_TEST_NODES"].split()
        addresses = cluster["RESILIENT_FLOWS_TEST_NODE_ADDRS"].split()
        if ranks > len(nodes):
            raise SystemExit(f"--ranks {ranks}: the cluster has {len(nodes)} nodes")
        master = addresses[0]
    else:
        master = "127.0.0.1"
    env = torchrun_env(ranks, master)
    if cluster is not None:
        env["GLOO_SOCKET_IFNAME"] = cluster["RESILIENT_FLOWS_TEST_IFNAME"]
    namespaces = [["nsenter", f"--net=/var/run/netns/{nodes[r]}"] if cluster is not None else [] for r in range(ranks)]
    envs = [{**env, "RANK": str(r)} for r in range(ranks)]
    reports = [Path(spec["dir"]) / f"rank-{r}.json" for r in range(ranks)]
    return launch_ranks(__file__, spec, envs, reports, timeout, namespaces)


def main(argv: list[str] | None = None) -> int:
    parser, _ = options(__doc__, quick="32 MiB of state, 3 rounds (under a minute)", full="1 GiB of state, 5 rounds")
    parser.add_argument("--ranks", type=int, default=3, help="ranks, one per node when spread (default 3)")
    parser.add_argument("--rounds", type=int, help="rounds per median after a warm-up (default 5; --quick 3)")
    parser.add_argument(
        "--cluster", type=Path, help="DIR/env of .ci/slurm-up --nodes N: ranks in its nodes' namespaces"
    )
    parser.add_argument("--json", type=Path, help="write the figures and ratios")
    rank_options(parser)
    args = parser.parse_args(argv)
    if args.rank_of:
        rank_main(args.rank_of)
        return 0
    if args.ranks < 2:
        parser.error("--ranks must be at least 2: one node is lost, another survives")
    size = size_of(args)
    state_mib, width, rounds = SIZES[size]
    rounds = rounds_of(parser, args.rounds, rounds)
    cluster = None
    if args.cluster is not None:
        if not args.cluster.is_file():
            parser.error(f"--cluster {args.cluster}: no such file (the DIR/env of .ci/slurm-up --nodes N)")
        cluster = read_env_file(args.cluster)
        missing = [n for n in ("RESILIENT_FLOWS_TEST_NODES", "RESILIENT_FLOWS_TEST_NODE_ADDRS") if n not in cluster]
        if missing:
            parser.error(f"--cluster {args.cluster}: no {', '.join(missing)} (a one-node cluster?)")
    depth = max(1, round(state_mib * MiB / 2 / 4 / (width * width + width)))
    started = time.perf_counter()
    with scratch("multinode-bench-", args.dir, fallback=None) as directory:
        spec = {"width": width, "depth": depth, "rounds": rounds, "dir": str(directory)}
        reports = launch(args.ranks, spec, cluster, TIMEOUT_S[size])
    figures: dict[str, float] = {"state_mib": 2 * 4 * depth * (width * width + width) / MiB}
    for key in ("save_spread_s", "save_packed_s", "restore_local_shared_s", "restore_shared_s"):
        # a collective operation ends when its slowest rank does: the slowest rank's median
        figures[key] = max(statistics.median(r[key]) for r in reports)
    figures["restore_local_shards"] = float(reports[0]["restore_local_shards"])
    checks = judge(figures, RATIOS)
    console = harness.console()
    where = "network namespaces of " + str(args.cluster) if cluster else "one host, nodes emulated by directories"
    console.print(f"{args.ranks} ranks ({where}), {size} size, {rounds} rounds, {time.perf_counter() - started:.0f} s")
    print_figures(console, figures, LABELS)
    print_checks(console, checks)
    if args.json:
        document = {"size": size, "ranks": args.ranks, "cluster": bool(cluster), "figures": figures, "ratios": checks}
        write_json(args.json, document, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
