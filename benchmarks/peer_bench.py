"""Peer tier: a lost node restored from its buddy or from the shared tier, and what its copies cost training.

A peer tier (``TierSpec(peer=True)``) copies every rank's shard, once committed in the node-local
tier, over the ranks' own communicator to a rank of the next node of a ring (its buddy), into that
node's memory. Two questions decide whether it earns its place, each answered side by side in one
run, rounds interleaved (the order rotated each round) so that a noisy neighbour slows both
variants alike, figures the medians over rounds after a warm-up round, of the slowest rank:

1. **Restore after a node loss: from the buddy or from the shared tier.** R ranks (default 3),
   rank r on emulated node ``n<r>``, save a checkpoint with the tiers [local, peer, shared] (in
   all three, so that the ``shared`` variant can read it as well); node ``n1`` is then lost (its local
   and peer directories deleted) and replaced by a fresh node ``n<R>``. The same ranks restore it
   into a fresh model twice per round: ``peer``, with the same three tiers, where the lost node's
   shards come from its buddy's peer copy (``n2``; ``n0`` with two ranks) (read there and relayed over gloo to the ranks
   that need them); and ``shared``, with a Checkpointer given only [local, shared] (the peer
   directories stay on disk, unused), where the lost node's shards come from the shared tier. The
   survivors' own shards come from their node-local copies in both. The benchmark fails when the
   ``peer`` variant reads any shard byte from the shared tier (``Checkpointer.restored.bytes_from``;
   the shared tier's manifest, a few KiB, is still read there: it is the authority on what was
   committed), when the ``shared`` variant reads none from it, or when a restored state differs by
   one bit from the saved one.
2. **Training stall with the peer tier on and off.** An MLP trained with Adam (DDP over gloo, or
   FSDP2 with ``--layout sharded``), one torch thread per rank, saves a checkpoint every K steps
   (``--every``, default 2) with the tiers [local, shared] (``off``) and [local, peer, shared]
   (``on``), the shared tier getting every ``--persist-every``-th checkpoint (default 4) and the
   peer tier every one. Reported: the stall per save (``CheckpointStats.last_stall``, the first
   save of a run dropped, median over a run's saves, and the part of it spent waiting for the host
   arena), the time of one training step, and the time of a checkpoint interval (K steps and a
   save). The issue's target is a stall at most 5 % higher with the peer tier on; the ratio is
   reported, and judged, whatever it is, with the same ratio round by round to show its noise.

Where the tiers are. Node-local and peer directories are in node memory (``/dev/shm``, one
directory per emulated node; the scratch directory when there is no ``/dev/shm``). The shared tier
is an ext4 file system on a loop device (an image file in the scratch directory, attached with
direct I/O so that the host's page cache cannot serve it), and every rank runs in a cgroup (v1
``blkio``) of its own (one per node) whose ``blkio.throttle.read_bps_device`` caps its reads from
that device at ``--shared-mbps`` MB/s. Before every restore the shared tier's files are evicted
from the page cache (``posix_fadvise(DONTNEED)``), as a shared file system another node wrote
serves them cold. Mount, loop device and cgroups are removed when the run ends, however it ends.
The bytes each node's cgroup read from the device are reported: they show that the throttle was
in the path. Writes are not throttled (only restores read the shared tier).

Why 100 MB/s per node by default. A parallel file system is shared by every node of the machine:
ALCF's Lustre file systems on Polaris (Eagle, Grand) are each quoted at about 650 GB/s aggregate,
the same order as Aurora's Lustre file system, and Aurora has 10,624 compute nodes (figures as
ALCF publishes them, assumed here, not measured). When a whole-machine job restarts, each node's
fair share of 650 GB/s is about 61 MB/s; a job of ~6,500 nodes alone on the file system gets 100
MB/s per node, and a 1,000-node job 650 MB/s, but other jobs' checkpoints and reads share it too.
100 MB/s sits in that range and errs in the shared tier's favour for a large restart (a lone
Lustre client reads several GB/s: a figure for a node with the file system to itself, not one
under a restart). ``--shared-mbps`` sets another; ``--shared-mbps 0`` runs unthrottled.

Without the throttle. Where it cannot be set up (not root, no cgroup v1 ``blkio`` hierarchy at
``/sys/fs/cgroup/blkio``, no loop device, ``--shared-mbps 0``) the shared tier is a directory of
the scratch directory, read at the local disk's speed after the same eviction; the console and
the JSON say so (``throttle.kind`` ``"none"`` and the reason). No rate is ever enforced by the
benchmark's or the library's own read path.

What does not carry over. Emulated nodes share this host's cores (2 on the reference machine)
and memory; the buddy's copy travels over loopback gloo, not a network, so the ``peer`` restore
and the copies' cost in the training loop contend for the same few cores as training itself: with
3 ranks on 2 cores every byte the peer copies move (read, hashed, sent, received, hashed, written)
takes CPU from training, where a GPU node's idle host cores would absorb it. Stalls are a few
milliseconds, so one descheduling moves them: read the round-by-round ratios beside the median.

``python benchmarks/peer_bench.py [--quick | --full] [--ranks R] [--layout replicated|sharded]
[--rounds N] [--every K] [--persist-every P] [--shared-mbps MB] [--dir DIR] [--json PATH]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from harness import options, rotated, rounds_of, scratch, size_of, write_json
from multinode_bench import evict
from ranks import launch_ranks, rank_options, torchrun_env
from report import judge, print_checks, print_figures

MiB = 1 << 20
MB = 1_000_000
#: restore part: state MiB (parameters and Adam's two moments), layer width
RESTORE_SIZES = {"quick": (32, 512), "default": (192, 1024), "full": (1024, 2048)}
#: training part: layer width, layers, saves per run (the first is dropped)
TRAIN_SIZES = {"quick": (512, 4, 6), "default": (1024, 8, 10), "full": (2048, 8, 12)}
ROUNDS = {"quick": 3, "default": 5, "full": 5}
TIMEOUT_S = {"quick": 240, "default": 1200, "full": 3600}
BATCH = 32
LOST = 1  # the node lost
STEP = 7  # the step of the checkpoint restored
BLKIO = Path("/sys/fs/cgroup/blkio")
DEFAULT_MBPS = 100.0

LABELS = {
    "restore_peer_s": ("restore after a node loss", "s", "peer: lost node's shards from its buddy"),
    "restore_shared_s": ("restore after a node loss", "s", "shared: lost node's shards from the shared tier"),
    "restore_peer_buddy_mib": ("restore after a node loss", "MiB", "peer: read from the buddy's peer copy"),
    "restore_peer_shared_mib": ("restore after a node loss", "MiB", "peer: shard bytes read from the shared tier"),
    "restore_shared_shared_mib": ("restore after a node loss", "MiB", "shared: read from the shared tier"),
    "state_mib": ("restore after a node loss", "MiB", "checkpointed state"),
    "shared_mbps": ("shared tier", "MB/s", "read throttle per node (0: none)"),
    "throttled_read_mib": ("shared tier", "MiB", "read from its device, all nodes, all restores"),
    "stall_off_s": ("training, peer tier off / on", "s", "off: stall per save"),
    "stall_on_s": ("training, peer tier off / on", "s", "on: stall per save"),
    "wait_off_s": ("training, peer tier off / on", "s", "off: of which waiting for the host arena"),
    "wait_on_s": ("training, peer tier off / on", "s", "on: of which waiting for the host arena"),
    "step_off_s": ("training, peer tier off / on", "s", "off: one training step"),
    "step_on_s": ("training, peer tier off / on", "s", "on: one training step"),
    "interval_off_s": ("training, peer tier off / on", "s", "off: K steps and a save"),
    "interval_on_s": ("training, peer tier off / on", "s", "on: K steps and a save"),
    "peer_copy_s": ("training, peer tier off / on", "s", "on: one peer copy (send, receive, commit)"),
    "peer_sent_mib": ("training, peer tier off / on", "MiB", "on: sent to the buddy per save and rank"),
    "train_state_mib": ("training, peer tier off / on", "MiB", "checkpointed state"),
}
RATIOS = [
    ("restore_speedup", "restore: shared / peer", "restore_shared_s", ">=", "restore_peer_s", None),
    ("stall_cost", "stall per save: peer on / off", "stall_on_s", "<=", "stall_off_s", 1.05),
    ("step_cost", "training step: peer on / off", "step_on_s", "<=", "step_off_s", None),
    ("interval_cost", "checkpoint interval: peer on / off", "interval_on_s", "<=", "interval_off_s", None),
]


# ------------------------------------------------------------------------------------------ a rank


def rank_main(spec: dict) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    report = restore_part(spec) | stall_part(spec)
    (Path(spec["dir"]) / f"rank-{dist.get_rank()}.json").write_text(json.dumps(report))
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()


def build(layout: str, width: int, depth: int, seed: int, train: bool = False):
    """An MLP and Adam after one step (the moments exist): identical on every rank (replicated,
    DDP-wrapped with ``train``) or FSDP2-sharded over the ranks."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model: nn.Module = nn.Sequential(*layers[:-1])
    if layout == "sharded":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    elif train:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(4, width)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def held_tensors(model, optimizer) -> list:
    """Every tensor this rank holds of the model and Adam (a DTensor's local shard), in a fixed order."""
    import torch
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    found = [local(t) for t in model.state_dict().values()]
    for p in model.parameters():
        state = optimizer.state[p]
        found += [local(state[k]) for k in sorted(state) if torch.is_tensor(state[k])]
    return found


def restore_part(spec: dict) -> dict:
    """Save with [local, peer, shared], lose node 1, restore from the buddy and from the shared tier."""
    import torch
    import torch.distributed as dist

    from resilient_flows.checkpoint import Checkpointer, TierSpec, TrainState

    rank, world = dist.get_rank(), dist.get_world_size()
    nodes, shared = Path(spec["nodes"]) / "restore", Path(spec["shared"]) / "restore"

    def checkpointer(node: str, peer: bool) -> Checkpointer:
        here = nodes / node
        tiers = [TierSpec(here / "local"), *([TierSpec(here / "peer", peer=True)] if peer else []), TierSpec(shared)]
        return Checkpointer(tiers=tiers, keep=1, comm=dist.group.WORLD, node=node)

    model, optimizer = build(spec["layout"], spec["width"], spec["depth"], seed=1)
    with checkpointer(f"n{rank}", peer=True) as ck:
        ck.save(STEP, TrainState(model, optimizer))
        ck.wait()
        if ck.stats.peer_failed or ck.stats.peer_skipped or ck.stats.tier_commits[1] != 1:
            raise SystemExit(f"rank {rank}: the save made no peer copy ({ck.stats})")
    saved = [t.clone() for t in held_tensors(model, optimizer)]
    del model, optimizer
    dist.barrier()
    if rank == 0:
        shutil.rmtree(nodes / f"n{LOST}")  # the node and its memory are gone
    node = f"n{world}" if rank == LOST else f"n{rank}"  # its replacement is a fresh node
    report: dict = {"restore_peer_s": [], "restore_shared_s": [], "bytes_from": {}}
    for round_ in range(spec["rounds"] + 1):  # the first is a warm-up
        for variant in rotated(("peer", "shared"), round_):
            fresh_model, fresh_optimizer = build(spec["layout"], spec["width"], spec["depth"], seed=2)
            fresh = TrainState(fresh_model, fresh_optimizer)
            if rank == 0:
                evict(shared)
            dist.barrier()
            with checkpointer(node, peer=variant == "peer") as ck:
                dist.barrier()
                began = time.perf_counter()
                step = ck.restore(fresh)
                took = time.perf_counter() - began
                bytes_from = dict(ck.restored.bytes_from) if ck.restored else {}
            restored = held_tensors(fresh_model, fresh_optimizer)
            if step != STEP or any(not torch.equal(a, b) for a, b in zip(saved, restored, strict=True)):
                raise SystemExit(f"rank {rank}: the state restored ({variant}) differs from the one saved")
            from_shared = bytes_from.get("shared", 0)
            if variant == "peer" and from_shared:
                raise SystemExit(f"rank {rank}: the peer restore read {from_shared} bytes from the shared tier")
            if variant == "shared" and not from_shared:
                raise SystemExit(f"rank {rank}: the shared restore read nothing from the shared tier: {bytes_from}")
            report["bytes_from"][variant] = bytes_from
            if round_:
                report[f"restore_{variant}_s"].append(took)
            del fresh, fresh_model, fresh_optimizer
    return report


def stall_part(spec: dict) -> dict:
    """The same training loop checkpointing with the peer tier off and on, runs interleaved."""
    import torch
    import torch.distributed as dist

    from resilient_flows.checkpoint import Checkpointer, TierSpec, TrainState

    rank = dist.get_rank()
    width, depth, saves, every = spec["train_width"], spec["train_depth"], spec["saves"], spec["every"]
    model, optimizer = build(spec["layout"], width, depth, seed=3, train=True)
    state = TrainState(model, optimizer)
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own batches, as under DDP

    def train_step() -> float:
        began = time.perf_counter()
        model(torch.randn(BATCH, width, generator=generator)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - began

    keys = ("stall", "wait", "step", "interval", "peer_copy", "peer_sent")
    report: dict = {f"{key}_{variant}": [] for key in keys for variant in ("off", "on")}
    for round_ in range(spec["rounds"] + 1):  # the first is a warm-up
        for variant in rotated(("off", "on"), round_):
            nodes, shared = Path(spec["nodes"]) / f"train-{variant}", Path(spec["shared"]) / f"train-{variant}"
            dist.barrier()  # every rank has committed its node's copy of the last run's last save
            if rank == 0:  # the previous run's checkpoints: each run starts empty
                shutil.rmtree(nodes, ignore_errors=True)
                shutil.rmtree(shared, ignore_errors=True)
            dist.barrier()
            here = nodes / f"n{rank}"
            tiers = [
                TierSpec(here / "local"),
                *([TierSpec(here / "peer", peer=True)] if variant == "on" else []),
                TierSpec(shared, persist_every=spec["persist_every"]),
            ]
            with Checkpointer(tiers=tiers, keep=2, comm=dist.group.WORLD, node=f"n{rank}") as ck:
                ck.prepare(state)
                train_step()
                dist.barrier()
                stalls, waits, steps, intervals = [], [], [], []
                mark = time.perf_counter()
                for s in range(saves):
                    steps += [train_step() for _ in range(every)]
                    ck.save(s, state)
                    stalls.append(ck.stats.last_stall)
                    waits.append(ck.stats.last_wait)
                    now = time.perf_counter()
                    intervals.append(now - mark)
                    mark = now
                ck.wait()
                stats = ck.stats
            if variant == "on" and (stats.peer_failed or stats.peer_skipped or stats.tier_commits[1] != saves):
                raise SystemExit(f"rank {rank}: not every save was copied to the buddy ({stats})")
            if round_:
                report[f"stall_{variant}"].append(statistics.median(stalls[1:]))
                report[f"wait_{variant}"].append(statistics.median(waits[1:]))
                report[f"step_{variant}"].append(statistics.median(steps[every:]))
                report[f"interval_{variant}"].append(statistics.median(intervals[1:]))
                if variant == "on":
                    report["peer_copy_on"].append(stats.tier_seconds[1] / stats.tier_commits[1])
                    report["peer_sent_on"].append(stats.tier_bytes[1] / stats.tier_commits[1] / MiB)
    return report


# ------------------------------------------------------------------------------ the throttled tier


@dataclass
class Throttle:
    """Where the shared tier is, and how its reads are limited per node (or why they are not)."""

    shared: Path
    kind: str  # "blkio": cgroup v1 read throttle on a loop device; "none"
    why: str
    bps: int = 0
    device: str | None = None  # MAJ:MIN of the loop device
    cgroups: list[Path] = field(default_factory=list)

    def prefixes(self) -> list[list[str]]:
        """Per rank, a command that moves itself into its node's cgroup and runs the rank."""
        into = 'echo $$ > "$0" && exec "$@"'
        return [["sh", "-c", into, str(cgroup / "cgroup.procs")] for cgroup in self.cgroups]

    def read_bytes(self) -> list[int]:
        """Bytes each node's cgroup read from the shared tier's device so far."""
        found = []
        for cgroup in self.cgroups:
            total = 0
            for line in (cgroup / "blkio.throttle.io_service_bytes").read_text().splitlines():
                words = line.split()
                if len(words) == 3 and words[0] == self.device and words[1] == "Read":
                    total += int(words[2])
            found.append(total)
        return found

    def document(self) -> dict:
        return {"kind": self.kind, "why": self.why, "read_bps_per_node": self.bps, "device": self.device}


def why_no_throttle(mbps: float) -> str | None:
    if mbps <= 0:
        return "--shared-mbps 0: no throttle asked for"
    if os.geteuid() != 0:
        return "not root: cannot mount a loop device or make cgroups"
    if not (BLKIO / "blkio.throttle.read_bps_device").is_file():
        return f"no cgroup v1 blkio hierarchy with read throttling at {BLKIO}"
    missing = [tool for tool in ("losetup", "mkfs.ext4", "mount", "umount") if shutil.which(tool) is None]
    if missing:
        return f"no {', '.join(missing)} on PATH"
    return None


def run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise OSError(f"{' '.join(command)}: {done.stderr.strip() or f'exit code {done.returncode}'}")
    return done.stdout.strip()


@contextlib.contextmanager
def throttled_shared(directory: Path, ranks: int, mbps: float, image_mib: int) -> Iterator[Throttle]:
    """The shared tier on a loop-mounted ext4 image whose reads each rank's cgroup throttles to
    ``mbps`` MB/s; unthrottled in ``directory`` where that cannot be set up (said so). Mount, loop
    device and cgroups are removed afterwards, however the run ends."""
    fallback = directory / "shared"
    problem = why_no_throttle(mbps)
    if problem is not None:
        yield Throttle(fallback, "none", problem)
        return
    image, mount = directory / "shared.img", directory / "shared-fs"
    loop: str | None = None
    mounted = False
    cgroups: list[Path] = []
    try:
        try:
            with open(image, "wb") as f:
                f.truncate(image_mib * MiB)
            # initialised now, not by a kernel thread writing in the background during the run
            run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image))
            loop = run("losetup", "--find", "--show", "--direct-io=on", str(image))
            mount.mkdir()
            run("mount", "-o", "noatime", loop, str(mount))
            mounted = True
            device = (Path("/sys/block") / Path(loop).name / "dev").read_text().strip()
            bps = int(mbps * MB)
            for rank in range(ranks):
                cgroup = BLKIO / f"rf-peer-bench-{os.getpid()}-n{rank}"
                cgroup.mkdir()
                cgroups.append(cgroup)
                (cgroup / "blkio.throttle.read_bps_device").write_text(f"{device} {bps}\n")
        except (OSError, subprocess.SubprocessError) as exc:
            problem = f"setting up the throttled shared tier failed: {exc}"
        if problem is not None:
            yield Throttle(fallback, "none", problem)
        else:
            why = f"ext4 on {loop} (direct I/O to {image.name}), cgroup v1 blkio.throttle.read_bps_device per node"
            yield Throttle(mount / "shared", "blkio", why, bps, device, cgroups)
    finally:
        if mounted and subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(mount)], capture_output=True)
        if loop is not None:
            subprocess.run(["losetup", "-d", loop], capture_output=True)
        for cgroup in cgroups:
            for _ in range(50):  # the ranks' processes may still be leaving it
                try:
                    cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        image.unlink(missing_ok=True)


@contextlib.contextmanager
def node_memory(base: Path) -> Iterator[tuple[Path, str]]:
    """Where the emulated nodes' local and peer tiers go: ``/dev/shm`` (node memory), else ``base``."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with scratch("peer-bench-nodes-", shm) as directory:
            yield directory, "/dev/shm"
    else:
        yield base / "nodes", f"{base} (no writable /dev/shm)"


# ------------------------------------------------------------------------------------- the launcher


def parser_of() -> argparse.ArgumentParser:
    """The options; ``--rank-of`` (:func:`ranks.rank_options`) makes this process one rank."""
    parser, _ = options(
        __doc__, quick="32 MiB of state, 3 rounds (under a minute)", full="1 GiB of state, larger MLP, 5 rounds"
    )
    parser.add_argument("--ranks", type=int, default=3, help="ranks, one per emulated node (default 3)")
    parser.add_argument(
        "--layout",
        choices=("replicated", "sharded"),
        default="replicated",
        help="replicated (DDP) or sharded (FSDP2) state (default replicated)",
    )
    parser.add_argument("--rounds", type=int, help="rounds per median after a warm-up (default 5; --quick 3)")
    parser.add_argument("--every", type=int, default=2, help="training steps between saves (default 2)")
    parser.add_argument(
        "--persist-every", type=int, default=4, help="every P-th save also goes to the shared tier (default 4)"
    )
    parser.add_argument(
        "--shared-mbps",
        type=float,
        default=DEFAULT_MBPS,
        help=f"shared tier's read bandwidth per node, MB/s (default {DEFAULT_MBPS:g}; 0: none)",
    )
    parser.add_argument("--json", type=Path, help="write the figures and ratios")
    rank_options(parser)
    return parser


def model_sizes(size: str) -> dict[str, int]:
    """The shapes of the restored state and of the trained model for ``size``, and their bytes
    (parameters and Adam's two moments, float32)."""
    state_mib, width = RESTORE_SIZES[size]
    depth = max(1, round(state_mib * MiB / 3 / 4 / (width * width + width)))
    train_width, train_depth, saves = TRAIN_SIZES[size]
    return {
        "width": width,
        "depth": depth,
        "train_width": train_width,
        "train_depth": train_depth,
        "saves": saves,
        "state_bytes": 3 * 4 * depth * (width * width + width),
        "train_bytes": 3 * 4 * train_depth * (train_width * train_width + train_width),
    }


def peer_figures(
    reports: list[dict],
    rounds: int,
    sizes: dict[str, int],
    shared_mbps: float,
    throttle: Throttle,
    throttled: list[int],
) -> tuple[dict[str, float], list[float]]:
    """The figures of the ranks' reports (``throttled``: the bytes each node read through the
    throttle), and the stall ratio (peer on / off) round by round."""

    # a collective operation ends when its slowest rank does: the slowest rank's median
    def slowest(key: str) -> float:
        return max(statistics.median(r[key]) for r in reports)

    peer_from, shared_from = reports[0]["bytes_from"]["peer"], reports[0]["bytes_from"]["shared"]
    figures: dict[str, float] = {
        "restore_peer_s": slowest("restore_peer_s"),
        "restore_shared_s": slowest("restore_shared_s"),
        "restore_peer_buddy_mib": sum(n for where, n in peer_from.items() if where.startswith("peer")) / MiB,
        "restore_peer_shared_mib": peer_from.get("shared", 0) / MiB,
        "restore_shared_shared_mib": shared_from.get("shared", 0) / MiB,
        "state_mib": sizes["state_bytes"] / MiB,
        "shared_mbps": shared_mbps if throttle.kind != "none" else 0.0,
        "throttled_read_mib": sum(throttled) / MiB,
        "train_state_mib": sizes["train_bytes"] / MiB,
    }
    for key in ("stall", "wait", "step", "interval"):
        for variant in ("off", "on"):
            figures[f"{key}_{variant}_s"] = slowest(f"{key}_{variant}")
    # the same ratio round by round (slowest rank of each): how far one round strays
    per_round = [
        max(r["stall_on"][i] for r in reports) / max(r["stall_off"][i] for r in reports) for i in range(rounds)
    ]
    figures["peer_copy_s"] = slowest("peer_copy_on")
    figures["peer_sent_mib"] = statistics.median(reports[0]["peer_sent_on"])
    if throttle.kind == "none":
        del figures["throttled_read_mib"]
    return figures, per_round


def main(argv: list[str] | None = None) -> int:
    parser = parser_of()
    args = parser.parse_args(argv)
    if args.rank_of:
        rank_main(args.rank_of)
        return 0
    if args.ranks < 2:
        parser.error("--ranks must be at least 2: one node is lost, its buddy survives")
    if args.every < 1 or args.persist_every < 1:
        parser.error("--every and --persist-every must be at least 1")
    size = size_of(args)
    rounds = rounds_of(parser, args.rounds, ROUNDS[size])
    sizes = model_sizes(size)
    image_mib = int(1.3 * (2 * sizes["state_bytes"] + 6 * sizes["train_bytes"]) / MiB) + 256
    # SIGTERM (a CI timeout) unwinds like Ctrl-C: the ranks, the mount and the cgroups are cleaned up.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    console = harness.console()
    started = time.perf_counter()
    with (
        scratch("peer-bench-", args.dir, fallback=None) as directory,
        node_memory(directory) as (nodes, nodes_where),
        throttled_shared(directory, args.ranks, args.shared_mbps, image_mib) as throttle,
    ):
        if throttle.kind == "none":
            console.print(f"[yellow]shared tier NOT throttled ({throttle.why}): read at this disk's speed[/]")
        spec = {
            "dir": str(directory),
            "nodes": str(nodes),
            "shared": str(throttle.shared),
            "layout": args.layout,
            **{key: sizes[key] for key in ("width", "depth", "train_width", "train_depth", "saves")},
            "every": args.every,
            "persist_every": args.persist_every,
            "rounds": rounds,
        }
        env = torchrun_env(args.ranks)
        envs = [{**env, "RANK": str(r)} for r in range(args.ranks)]
        reports_at = [directory / f"rank-{r}.json" for r in range(args.ranks)]
        reports = launch_ranks(__file__, spec, envs, reports_at, TIMEOUT_S[size], throttle.prefixes())
        throttled = throttle.read_bytes()

    figures, per_round = peer_figures(reports, rounds, sizes, args.shared_mbps, throttle, throttled)
    peer_from, shared_from = reports[0]["bytes_from"]["peer"], reports[0]["bytes_from"]["shared"]
    checks = judge(figures, RATIOS)

    where = f"shared tier throttled to {args.shared_mbps:g} MB/s per node ({throttle.why})"
    if throttle.kind == "none":
        where = f"shared tier NOT throttled: {throttle.why}"
    console.print(
        f"{args.ranks} ranks on emulated nodes ({args.layout} state; node-local and peer tiers in {nodes_where}), "
        f"{size} size, {rounds} rounds, a save every {args.every} steps, {time.perf_counter() - started:.0f} s"
    )
    console.print(where)
    console.print(f"peer restore read {peer_from}; shared restore read {shared_from} (bytes, all ranks)")
    console.print(f"stall per save, peer on / off, round by round: {', '.join(f'{r:.3g}' for r in per_round)}")
    print_figures(console, figures, LABELS)
    print_checks(console, checks)
    if args.json:
        document = {
            "size": size,
            "ranks": args.ranks,
            "layout": args.layout,
            "rounds": rounds,
            "every": args.every,
            "persist_every": args.persist_every,
            "nodes_in": nodes_where,
            "throttle": throttle.document() | {"read_bytes_per_node": throttled},
            "bytes_from": {"peer": peer_from, "shared": shared_from},
            "figures": figures,
            "ratios": checks,
            "stall_ratio_by_round": per_round,
        }
        write_json(args.json, document, indent=2)
    return int(harness.failed(checks))


if __name__ == "__main__":
    sys.exit(main())
