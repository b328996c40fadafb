"""Checkpoint engine against the machine's limits and PyTorch's own checkpointing, in one run.

Every figure is measured on the same training state, an MLP and its Adam moments (parameters are
a third of the bytes) trained on one fixed batch, and is the median of at least five rounds. The
first round is left out (it allocates the engine's host arena and warms caches), and so are the
rounds before a tier holds ``KEEP`` checkpoints: only from then on does each save also prune one,
the steady state of a long training run.

Sections of the first table:

* ``limits``: copying the state into reused, already-touched buffers (what a stall cannot beat),
  and a sequential write + fsync of as many bytes to the target directory, the faster of buffered
  and direct I/O (what a commit or a flush cannot beat). Each is measured in the same rounds as
  the engine figure it is compared with, so that a noisy neighbour slows both alike.
* ``engine``: how long ``save`` blocks training. Plain mode copies before it returns; overlap mode
  copies behind the next forward/backward and ``optimizer.step`` waits for that copy. Overlap mode
  is charged the time ``save`` blocks, the time ``optimizer.step`` waits, and how much slower the
  forward/backward under the copy is than the one after a plain save: both leave the writer
  running during the next step, and the writer's own interference is shown apart (the whole next
  step against one without a checkpoint) and lands in the throughput (a checkpoint every k steps
  against none). Also: time to a durable commit, flush throughput from a node-local tier (a
  temporary directory under ``--local-dir``, by default the system's temp dir; ``/dev/shm``
  takes the local disk out of the picture) to the target directory, and restore. The flush
  writes from the engine's host arena, which still holds the checkpoint: the figure is the
  shared tier's write path, against a raw write + fsync of as many bytes there.
* ``baselines``: ``torch.save`` (synchronous: its stall is its whole time), DCP ``save`` and
  ``async_save`` (stall: until it returns; torch 2.13 runs DCP without a process group, as
  ``no_dist=True`` asks),
  ``torch.load`` alone and followed by ``load_state_dict``.
* ``mpi``: under ``mpiexec -n 2``, bytes each rank writes and time to commit, against one writer.
  Both ranks share this machine's disk, so only the split of the bytes carries over to a cluster.

The second table divides figures by their references; PASS means the target holds on this
machine. Restore and ``torch.load`` read files the page cache still holds: they compare software
overhead, not disks.

Threads: training gets every core but one (``torch.set_num_threads``). The engine's copy, writer
and flush threads need a core, as they have on a GPU node whose host cores idle during a step;
giving training every core would measure CPU contention with checkpoint I/O instead. The
``limits`` copy runs with the same thread count as the engine's copy.

Run ``python benchmarks/checkpoint_bench.py [--quick | --full | --size 256MiB] [--json PATH]
[--local-dir /dev/shm]``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import math
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import harness
import torch
import torch.distributed.checkpoint as dcp
from harness import Clock, medians, options, parse_size, rounds, scratch, size_of, timed, with_units, write_json
from report import judge, print_checks, print_figures

from resilient_flows.checkpoint import Checkpointer, TrainState

MiB = 1 << 20
GiB = 1 << 30
DEPTH = 8  # linear layers: enough tensors for per-tensor costs to show, few enough to stay compute-bound
BATCH = 32  # forward/backward then takes a few times the state copy: overlap mode has something to hide behind
CHUNK = 16 * MiB
SIZES = {"quick": 128 * MiB, "default": 512 * MiB, "full": GiB}
REPS = {"quick": 5, "default": 7}
KEEP = 2  # committed checkpoints kept per tier
MPI_MAX = 256 * MiB  # each of the two ranks holds a whole state on one small machine
console = harness.console()

#: key: (section, unit, label), in print order.
FIGURES = {
    "state_bytes": ("limits", "MiB", "state (MLP + Adam moments)"),
    "copy_time": ("limits", "s", "copy into reused buffers"),
    "copy_bandwidth": ("limits", "GiB/s", "memory bandwidth (copy)"),
    "write_fsync_time": ("limits", "s", "write + fsync (best of buffered, direct)"),
    "write_bandwidth": ("limits", "GiB/s", "disk bandwidth (write + fsync)"),
    "step_time": ("engine", "s", "training step, no checkpoint"),
    "fwd_bwd_time": ("engine", "s", "  of which forward/backward"),
    "stall_first": ("engine", "s", "plain save stall, first (allocates arena)"),
    "stall_plain_median": ("engine", "s", "plain save stall"),
    "writer_step_extra": ("engine", "s", "  next step slower (writer running)"),
    "commit_latency": ("engine", "s", "save -> durable commit"),
    "overlap_save_block": ("engine", "s", "overlap save: save() blocks"),
    "overlap_fwd_bwd_extra": ("engine", "s", "  next fwd/bwd slower than after plain"),
    "overlap_hook_wait": ("engine", "s", "  next optimizer.step waits for the copy"),
    "stall_overlap_median": ("engine", "s", "overlap save stall (save + step wait)"),
    "overlap_cost_median": ("engine", "s", "  stall + fwd/bwd slowed by the copy"),
    "interval_k": ("engine", "steps", "checkpoint every k steps (10 x commit/step)"),
    "throughput_none": ("engine", "steps/s", "throughput, no checkpoints"),
    "throughput_ckpt": ("engine", "steps/s", "throughput, checkpoint every k"),
    "slowdown": ("engine", "%", "slowdown from checkpoints"),
    "flush_time": ("engine", "s", "local -> shared flush"),
    "flush_throughput": ("engine", "GiB/s", "flush throughput"),
    "restore_time": ("engine", "s", "restore into a fresh state"),
    "torch_save_time": ("baselines", "s", "torch.save stall"),
    "torch_save_fsync_time": ("baselines", "s", "torch.save + fsync"),
    "torch_save_slowdown": ("baselines", "%", "  slowdown if every k steps (computed)"),
    "dcp_save_time": ("baselines", "s", "DCP save stall"),
    "dcp_async_stall": ("baselines", "s", "DCP async_save stall"),
    "dcp_async_total": ("baselines", "s", "DCP async_save -> done"),
    "torch_load_time": ("baselines", "s", "torch.load"),
    "torch_load_sd_time": ("baselines", "s", "torch.load + load_state_dict"),
    "mpi_state_bytes": ("mpi", "MiB", "state on each rank"),
    "mpi_rank0_bytes": ("mpi", "MiB", "2 ranks: rank 0 writes"),
    "mpi_rank1_bytes": ("mpi", "MiB", "2 ranks: rank 1 writes"),
    "mpi_commit_2ranks": ("mpi", "s", "2 ranks: save -> commit (rank 0)"),
    "mpi_single_bytes": ("mpi", "MiB", "1 writer writes"),
    "mpi_commit_single": ("mpi", "s", "1 writer: save -> commit"),
}
#: key, label, numerator, op, denominator, target.
RATIOS = [
    ("stall_vs_copy", "plain stall / reused-buffer copy", "stall_plain_median", "<=", "copy_time", 1.5),
    ("async_vs_stall", "DCP async_save stall / our plain stall", "dcp_async_stall", ">=", "stall_plain_median", 1.0),
    ("overlap_vs_copy", "overlap stall / reused-buffer copy", "stall_overlap_median", "<=", "copy_time", 0.3),
    ("overlap_cost_vs_copy", "overlap stall + interference / copy", "overlap_cost_median", "<=", "copy_time", 1.0),
    ("flush_vs_disk", "flush / write+fsync bandwidth", "flush_throughput", ">=", "write_bandwidth", 0.8),
    ("throughput", "throughput with / without checkpoints", "throughput_ckpt", ">=", "throughput_none", 0.95),
    ("restore_vs_load", "restore / torch.load", "restore_time", "<=", "torch_load_time", 1.0),
    ("restore_vs_load_sd", "restore / (torch.load + load_state_dict)", "restore_time", "<=", "torch_load_sd_time", 0.8),
]


class Workload:
    """An MLP and its Adam state of about ``nbytes``, trained on one fixed batch."""

    def __init__(self, nbytes: int, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.width = max(8, int(math.sqrt(nbytes / 12 / DEPTH)))  # params: a third of nbytes, 4 bytes each
        self.model = _mlp(self.width)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-5)
        self.state = TrainState(self.model, self.optimizer, extra={"epoch": 0})
        self.x, self.y = torch.randn(BATCH, self.width), torch.randn(BATCH, self.width)
        self.step()  # Adam creates its moments on the first step
        self.nbytes = sum(t.numel() * t.element_size() for t in self.tensors())

    def forward_backward(self) -> float:
        """The part of a step that overlap mode copies behind; returns its time."""
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=False)  # reused gradient buffers: steadier step times
        torch.nn.functional.mse_loss(self.model(self.x), self.y).backward()
        return time.perf_counter() - start

    def step(self) -> float:
        """One training step; returns its time, and keeps that of its forward/backward in ``last_fwd_bwd``."""
        start = time.perf_counter()
        self.last_fwd_bwd = self.forward_backward()
        self.optimizer.step()
        return time.perf_counter() - start

    def tensors(self) -> list[torch.Tensor]:
        moments = [v for per_param in self.optimizer.state.values() for v in per_param.values()]
        return [p.detach() for p in self.model.parameters()] + moments

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def fresh(self) -> TrainState:
        """A state of the same shapes in unwritten memory, as a restarted process has it."""
        with torch.device("meta"):
            model = _mlp(self.width)
        model.to_empty(device="cpu")
        return TrainState(model, torch.optim.Adam(model.parameters(), lr=1e-5), extra={"epoch": 0})


def _mlp(width: int) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


class Limits:
    """The state's bytes in one reused, touched buffer: the copy and the write to beat."""

    def __init__(self, work: Workload) -> None:
        self.work = work
        self.buffer = torch.frombuffer(mmap.mmap(-1, work.nbytes), dtype=torch.uint8)  # page-aligned
        self.views, offset = [], 0
        for t in work.tensors():
            size = t.numel() * t.element_size()
            self.views.append(self.buffer[offset : offset + size].view(t.dtype).view(t.shape))
            offset += size
        self.copy()  # touch every page once

    def copy(self) -> float:
        return timed(lambda: [v.copy_(t) for v, t in zip(self.views, self.work.tensors(), strict=True)])

    def write(self, path: Path) -> float:
        """The faster of a buffered and a direct-I/O write + fsync of the buffer: the disk's best."""
        return min(self._write(path, direct=False), self._write(path, direct=True))

    def _write(self, path: Path, direct: bool) -> float:
        data = memoryview(self.buffer.numpy())
        if direct:
            data = data[: len(data) - len(data) % 4096]  # direct I/O writes whole pages
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0), 0o644)
        except OSError:
            return math.inf  # no direct I/O on this file system
        start = time.perf_counter()
        try:
            for at in range(0, len(data), CHUNK):
                os.write(fd, data[at : at + CHUNK])
            os.fsync(fd)
        finally:
            os.close(fd)
        elapsed = time.perf_counter() - start
        path.unlink()
        return elapsed


def measure_engine(work: Workload, limits: Limits, root: Path, reps: int) -> dict[str, float]:
    """Stalls in both modes, commit latency and throughput of one Checkpointer, and the copy limit."""
    steps = itertools.count()
    ck = Checkpointer(root / "engine", keep=KEEP)
    marks: dict[str, float] = {}
    hooks = [work.optimizer.register_step_pre_hook(lambda *_: marks.__setitem__("in", time.perf_counter()))]
    rows = []
    for i in range(reps + 1):
        ck.wait()
        row = {"copy_time": limits.copy(), "step_time": work.step(), "fwd_bwd_time": work.last_fwd_bwd}
        row["stall_plain_median"] = timed(lambda: ck.save(next(steps), work.state))
        row["writer_step_extra"] = work.step() - row["step_time"]
        after_plain = work.last_fwd_bwd
        ck.wait()
        row["commit_latency"] = ck.stats.last_commit_latency
        row["overlap_save_block"] = timed(lambda: ck.save(next(steps), work.state, overlap=True))
        if i == 0:  # the engine's hook exists now; one registered after it sees when it returns
            hook = work.optimizer.register_step_pre_hook(lambda *_: marks.__setitem__("out", time.perf_counter()))
            hooks.append(hook)
        work.step()
        row["overlap_fwd_bwd_extra"] = work.last_fwd_bwd - after_plain
        row["overlap_hook_wait"] = marks["out"] - marks["in"]
        rows.append(row)
    for hook in hooks:
        hook.remove()
    fig = medians(rows, warmup=1)  # two saves a round: from the second round on, each save prunes one
    fig["stall_first"] = rows[0]["stall_plain_median"]
    fig["copy_bandwidth"] = work.nbytes / fig["copy_time"] / GiB
    fig["stall_overlap_median"] = fig["overlap_save_block"] + fig["overlap_hook_wait"]
    fig["overlap_cost_median"] = fig["stall_overlap_median"] + max(0.0, fig["overlap_fwd_bwd_extra"])
    k = fig["interval_k"] = max(2, math.ceil(10 * fig["commit_latency"] / fig["step_time"]))  # commit <= 1/10

    def interval(checkpoint: bool) -> float:
        start = time.perf_counter()
        if checkpoint:
            ck.save(next(steps), work.state)
        for _ in range(k):
            work.step()
        ck.wait()  # a commit spilling past the interval is a cost of checkpointing too
        return time.perf_counter() - start

    without, with_ck = zip(*((interval(False), interval(True)) for _ in range(reps)), strict=True)
    ck.close()
    fig["throughput_none"], fig["throughput_ckpt"] = k / statistics.median(without), k / statistics.median(with_ck)
    fig["slowdown"] = 100 * (1 - fig["throughput_ckpt"] / fig["throughput_none"])
    return fig


def measure_flush(work: Workload, limits: Limits, root: Path, local: Path, reps: int) -> dict[str, float]:
    """Flush from a node-local tier to the target directory, and a raw write + fsync there, alternately."""
    ck = Checkpointer([local, root / "flush-shared"], keep=KEEP)
    rows = []
    for i in range(reps + KEEP):
        row, before = {"write_fsync_time": limits.write(root / "raw.bin")}, ck.stats.bytes_written
        ck.save(i, work.state)
        ck.wait()
        row["flush_time"] = ck.stats.last_persist_latency - ck.stats.last_commit_latency
        row["flush_throughput"] = (ck.stats.bytes_written - before) / row["flush_time"] / GiB
        rows.append(row)
    ck.close()
    fig = medians(rows, KEEP)
    fig["write_bandwidth"] = work.nbytes / fig["write_fsync_time"] / GiB
    return fig


def measure_saves(work: Workload, root: Path, reps: int) -> dict[str, float]:
    """torch.save (and fsync), DCP save and async_save of the same model and optimizer state."""
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # no_dist=True: one process
    rows = []
    for i in range(reps + 1):
        path, target, row = root / "torch.pt", root / f"dcp-{i}", {}
        start = time.perf_counter()
        with open(path, "wb") as out:
            torch.save(work.state_dict(), out)
            row["torch_save_time"] = time.perf_counter() - start
            out.flush()
            os.fsync(out.fileno())
        row["torch_save_fsync_time"] = time.perf_counter() - start
        path.unlink()
        start = time.perf_counter()
        dcp.save(work.state_dict(), checkpoint_id=target, no_dist=True)
        row["dcp_save_time"] = time.perf_counter() - start
        shutil.rmtree(target)
        start = time.perf_counter()
        future = dcp.async_save(work.state_dict(), checkpoint_id=target, no_dist=True)
        row["dcp_async_stall"] = time.perf_counter() - start
        future.result()
        row["dcp_async_total"] = time.perf_counter() - start
        shutil.rmtree(target)
        rows.append(row)
    return medians(rows, warmup=1)


def measure_loads(work: Workload, root: Path, reps: int) -> dict[str, float]:
    """Our restore against torch.load, in the same rounds, each into fresh pages as after a restart.

    Once large blocks have been freed, glibc raises its mmap threshold and keeps freed memory for
    reuse, so whichever load ran second would fill pages the first one had touched. Fixing the
    threshold (glibc only) gives every large tensor fresh memory. Restores the newest checkpoint
    that measure_engine left in ``root / "engine"``.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD = 1 MiB, no longer raised by frees
    path = root / "torch.pt"
    torch.save(work.state_dict(), path)
    ck = Checkpointer(root / "engine", keep=KEEP)

    def restore() -> float:
        fresh = work.fresh()
        return timed(lambda: ck.restore(fresh))

    def load_into_state() -> float:
        fresh = work.fresh()
        start = time.perf_counter()
        loaded = torch.load(path, weights_only=True)
        fresh.model.load_state_dict(loaded["model"])
        fresh.optimizer.load_state_dict(loaded["optimizer"])
        return time.perf_counter() - start

    def one_round() -> dict[str, float]:
        load = timed(lambda: torch.load(path, weights_only=True))
        return {"restore_time": restore(), "torch_load_time": load, "torch_load_sd_time": load_into_state()}

    fig = rounds(reps, one_round, warmup=1)
    ck.close()
    return fig


def measure_mpi(nbytes: int, root: Path, reps: int) -> dict[str, float]:
    """Run the two-rank part under mpiexec; what rank 0 collected, or nothing if it failed."""
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        console.print("[yellow]mpiexec not found: skipping the MPI part")
        return {}
    out = root / "mpi.json"
    cmd = [mpiexec, "-n", "2", sys.executable, __file__, "--mpi-worker", "--size", f"{nbytes // MiB}MiB"]
    cmd += ["--reps", str(reps), "--dir", str(root / "mpi"), "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        console.print(f"[red]MPI part failed ({done.returncode}):[/red]\n{done.stderr[-2000:]}")
        return {}
    result = json.loads(out.read_text())
    figures = {"mpi_state_bytes": result["nbytes"] / MiB}
    for rows in result["ranks"]:
        figures |= medians(rows, KEEP)
    return figures


def mpi_worker(nbytes: int, root: Path, reps: int, out: Path) -> None:
    """One rank: checkpoints over a 2-rank comm, then by rank 0 alone (comm=None), alternately."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)  # the two ranks share the cores

    def barrier() -> None:  # MPICH's blocking Barrier spins a core, which rank 0 needs while alone
        request = comm.Ibarrier()
        while not request.Test():
            time.sleep(0.001)

    work = Workload(nbytes)  # the same seed on every rank: replicated state
    pair = Checkpointer(root / "two-ranks", comm=comm, keep=KEEP)
    single = Checkpointer(root / "single", keep=KEEP) if comm.rank == 0 else None
    rows = []
    for i in range(reps + KEEP):
        before = pair.stats.bytes_written
        pair.save(i, work.state)
        pair.wait()
        row = {f"mpi_rank{comm.rank}_bytes": (pair.stats.bytes_written - before) / MiB}
        barrier()
        if single is not None:
            before = single.stats.bytes_written
            single.save(i, work.state)
            single.wait()
            row["mpi_single_bytes"] = (single.stats.bytes_written - before) / MiB
            row["mpi_commit_2ranks"] = pair.stats.last_commit_latency
            row["mpi_commit_single"] = single.stats.last_commit_latency
        barrier()
        rows.append(row)
    pair.close()
    if single is not None:
        single.close()
    gathered = comm.gather(rows, root=0)
    if comm.rank == 0:
        out.write_text(json.dumps({"nbytes": work.nbytes, "ranks": gathered}))


def ratios(figures: dict[str, float]) -> dict[str, dict]:
    """Every ratio of RATIOS whose figures exist, with its verdict."""
    result = judge(figures, RATIOS)
    if figures["fwd_bwd_time"] <= figures["copy_time"]:
        result["overlap_vs_copy"]["result"] = "n/a: forward/backward shorter than the copy"
    return result


def main(argv: list[str] | None = None) -> None:
    parser, sizes = options(
        __doc__, quick=f"{SIZES['quick'] // MiB} MiB state, under a minute", full=f"{SIZES['full'] // GiB} GiB state"
    )
    sizes.add_argument(
        "--size", type=parse_size, help=f"state size, e.g. 256MiB (default {SIZES['default'] // MiB}MiB)"
    )
    parser.add_argument("--dir", type=Path, help="target directory (default: a temporary one in ./bench-results)")
    parser.add_argument("--json", type=Path, help="write every figure, ratio and the configuration here")
    parser.add_argument(
        "--local-dir", type=Path, help="where the flush's node-local tier lives (default: the system's temp dir)"
    )
    parser.add_argument("--skip-mpi", action="store_true", help="leave out the mpiexec -n 2 part")
    parser.add_argument("--reps", type=int, help=f"rounds per median, >= 5 (default {REPS['default']}, quick 5)")
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    size = args.size or SIZES[size_of(args)]
    reps = args.reps or REPS["quick" if args.quick else "default"]
    if reps < 5:
        parser.error("--reps must be at least 5")
    if args.mpi_worker:
        mpi_worker(size, args.dir, reps, args.json)
        return

    clock = Clock(console)
    threads = max(1, len(os.sched_getaffinity(0)) - 1)
    torch.set_num_threads(threads)
    figures: dict[str, float] = {}
    local_tier = tempfile.TemporaryDirectory(
        prefix="checkpoint-bench-local-", dir=args.local_dir, ignore_cleanup_errors=True
    )
    with scratch("checkpoint-bench-", args.dir) as root, local_tier as local_name:
        local = Path(local_name)
        work = Workload(size)
        limits = Limits(work)
        figures["state_bytes"] = work.nbytes / MiB
        clock.phase("engine stalls, commit, throughput")
        figures |= measure_engine(work, limits, root, reps)
        clock.phase("flush")
        figures |= measure_flush(work, limits, root, local, reps)
        del limits
        clock.phase("torch.save and DCP")
        figures |= measure_saves(work, root, reps)
        interval = figures["interval_k"] * figures["step_time"]
        figures["torch_save_slowdown"] = (
            100 * figures["torch_save_fsync_time"] / (interval + figures["torch_save_fsync_time"])
        )
        clock.phase("restore and torch.load")
        figures |= measure_loads(work, root, reps)
        if not args.skip_mpi:
            clock.phase("mpiexec -n 2")
            figures |= measure_mpi(min(size, MPI_MAX), root, reps)
    base = root.parent
    checks = ratios(figures)
    print_figures(console, figures, FIGURES)
    print_checks(console, checks, heading="ratio", value_format=".3f")
    wall = clock.elapsed()
    console.print(
        f"wall time {wall:.1f} s, torch threads {threads}, {reps} rounds per median, target {base}, "
        f"node-local tier {local.parent}"
    )
    if args.json:
        config = {"state_bytes": work.nbytes, "width": work.width, "depth": DEPTH, "batch": BATCH, "reps": reps}
        config |= {"torch_threads": threads, "target_dir": str(base), "local_dir": str(local.parent)}
        config |= {"wall_s": wall, "torch": torch.__version__}
        write_json(args.json, {"figures": with_units(figures, FIGURES), "ratios": checks, "config": config})


if __name__ == "__main__":
    main()
