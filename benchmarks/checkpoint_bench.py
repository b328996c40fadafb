"""Checkpoint engine against the machine's limits and PyTorch's own checkpointing, in one run.

Every figure is measured on the same training state: an MLP and its Adam moments (parameters are
a third of the bytes), trained on one fixed batch. Each figure is the median of at least five
checkpoints (the first save of a Checkpointer, which allocates its host arena, is left out).

Sections of the first table:

* ``limits``: copying the state into reused, already-touched buffers (what a stall cannot beat)
  and writing + fsyncing as many bytes to the target directory (what a commit cannot beat);
* ``engine``: how long ``save`` blocks training (plain, and overlap mode, where the copy runs
  behind the next forward/backward and ``optimizer.step`` waits for it), time to a durable
  commit, flush throughput from a node-local tier to the target directory, restore into a fresh
  state, and training throughput with a checkpoint every k steps against none;
* ``baselines``: ``torch.save`` (synchronous: its stall is its whole time), DCP ``save`` and
  ``async_save`` (stall: until it returns), ``torch.load`` alone and followed by ``load_state_dict``;
* ``mpi``: under ``mpiexec -n 2``, bytes each rank writes and time to commit, against one writer.

The second table divides figures by their references; PASS means the target holds on this
machine. Restore and ``torch.load`` both read files that the page cache still holds, so they
compare software overhead, not disks.

Threads: training gets every core but one (``torch.set_num_threads``). The engine's copy, writer
and flush threads need a core, as they have on a GPU node whose host cores idle during a step;
sharing all cores would measure contention between training and checkpoint I/O instead. The
``limits`` copy runs with the same thread count as the engine's copy.

Run ``python benchmarks/checkpoint_bench.py [--quick | --full | --size 256MiB] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from rich.console import Console
from rich.table import Table

from resilient_flows.checkpoint import Checkpointer, TrainState

MiB = 1 << 20
GiB = 1 << 30
DEPTH = 8  # linear layers: enough tensors that per-tensor overheads show, few enough to stay compute-bound
BATCH = 32  # forward/backward takes a few times the state copy, so overlap mode has something to hide behind
REPS = 5
CHUNK = 16 * MiB
SIZES = {"quick": 128 * MiB, "default": 512 * MiB, "full": GiB}
MPI_MAX = 256 * MiB  # two ranks hold a state each on a small machine
console = Console()


class Workload:
    """An MLP and its Adam state of about ``nbytes``, trained on one fixed batch."""

    def __init__(self, nbytes: int, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.width = max(8, int(math.sqrt(nbytes / 12 / DEPTH)))  # params = nbytes/3, 4 bytes each
        self.model = _mlp(self.width)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-5)
        self.state = TrainState(self.model, self.optimizer, extra={"epoch": 0})
        self.x, self.y = torch.randn(BATCH, self.width), torch.randn(BATCH, self.width)
        self.fwd_bwd = 0.0
        self.step()  # Adam creates its moments on the first step
        self.nbytes = sum(t.numel() * t.element_size() for t in self.tensors())

    def step(self) -> float:
        """One training step; returns its time and keeps the forward/backward part in ``fwd_bwd``."""
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=False)  # reused gradient buffers: steadier step times
        torch.nn.functional.mse_loss(self.model(self.x), self.y).backward()
        self.fwd_bwd = time.perf_counter() - start
        self.optimizer.step()
        return time.perf_counter() - start

    def tensors(self) -> list[torch.Tensor]:
        moments = [v for per_param in self.optimizer.state.values() for v in per_param.values()]
        return [p.detach() for p in self.model.parameters()] + moments

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def fresh(self) -> TrainState:
        """A state of the same shapes in untouched memory, as a restarted process has it."""
        with torch.device("meta"):
            model = _mlp(self.width)
        model.to_empty(device="cpu")
        return TrainState(model, torch.optim.Adam(model.parameters(), lr=1e-5), extra={"epoch": 0})


def _mlp(width: int) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


class Report:
    """Every figure with its unit, in print order, and the ratios against targets."""

    def __init__(self) -> None:
        self.figures: dict[str, dict] = {}
        self.ratios: dict[str, dict] = {}

    def add(self, section: str, key: str, label: str, value: float, unit: str) -> float:
        self.figures[key] = {"value": value, "unit": unit, "section": section, "label": label}
        return value

    def ratio(self, key: str, label: str, num: str, den: str, target: float, at_most: bool, note: str = "") -> None:
        if num not in self.figures or den not in self.figures:
            return
        value = self.figures[num]["value"] / self.figures[den]["value"]
        ok = value <= target if at_most else value >= target
        verdict = "n/a" if note else ("PASS" if ok else "FAIL")
        target_text = f"{'<=' if at_most else '>='} {target:g}"
        self.ratios[key] = {"label": label, "value": value, "target": target_text, "result": verdict, "note": note}


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_of(fn: Callable[[], float], reps: int) -> float:
    return statistics.median(fn() for _ in range(reps))


def measure_limits(work: Workload, root: Path, report: Report) -> None:
    """Reused-buffer copy (memory bandwidth) and write + fsync of as many bytes (disk bandwidth)."""
    buffer = torch.empty(work.nbytes, dtype=torch.uint8)
    views, offset = [], 0
    for t in work.tensors():
        size = t.numel() * t.element_size()
        views.append(buffer[offset : offset + size].view(t.dtype).view(t.shape))
        offset += size

    def copy() -> float:
        return timed(lambda: [v.copy_(t) for v, t in zip(views, work.tensors(), strict=True)])

    copy()  # touch the buffers
    copy_s = report.add("limits", "copy_time", "copy into reused buffers", median_of(copy, REPS), "s")
    report.add("limits", "copy_bandwidth", "memory bandwidth (copy)", work.nbytes / copy_s / GiB, "GiB/s")

    data = memoryview(buffer.numpy())

    def write() -> float:
        path = root / "raw.bin"
        start = time.perf_counter()
        with open(path, "wb") as out:
            for at in range(0, len(data), CHUNK):
                out.write(data[at : at + CHUNK])
            out.flush()
            os.fsync(out.fileno())
        elapsed = time.perf_counter() - start
        path.unlink()
        return elapsed

    write_s = report.add("limits", "write_fsync_time", "sequential write + fsync", median_of(write, REPS), "s")
    report.add("limits", "write_bandwidth", "disk bandwidth (write + fsync)", work.nbytes / write_s / GiB, "GiB/s")


def measure_engine(work: Workload, root: Path, local: Path, report: Report) -> None:
    """Stalls, commit, flush, restore and throughput of the Checkpointer, on the same state."""
    step_s = report.add("engine", "step_time", "training step, no checkpoint", median_of(work.step, REPS), "s")
    report.add("engine", "fwd_bwd_time", "  of which forward/backward", work.fwd_bwd, "s")

    ck = Checkpointer(root / "plain", keep=2)
    stalls, commits = [], []
    for i in range(REPS + 1):
        work.step()
        stall = timed(lambda i=i: ck.save(i, work.state))
        ck.wait()
        if i == 0:
            report.add("engine", "stall_first", "plain save stall, first (allocates arena)", stall, "s")
        else:
            stalls.append(stall)
            commits.append(ck.stats.last_commit_latency)
    report.add("engine", "stall_plain_median", "plain save stall", statistics.median(stalls), "s")
    commit_s = report.add("engine", "commit_latency", "save -> durable commit", statistics.median(commits), "s")
    report.add("engine", "staging_bytes", "host arena", ck.stats.staging_bytes / MiB, "MiB")

    def restore() -> float:
        fresh = work.fresh()
        return timed(lambda: ck.restore(fresh))

    report.add("engine", "restore_time", "restore into a fresh state", median_of(restore, REPS), "s")
    ck.close()

    measure_overlap(work, root, report)

    ck = Checkpointer(root / "flush-shared", local_dir=local, keep=2)
    flushes = []
    for i in range(REPS + 1):
        before = ck.stats.bytes_written
        ck.save(i, work.state)
        ck.wait()
        flushes.append((ck.stats.bytes_written - before, ck.stats.last_persist_latency - ck.stats.last_commit_latency))
    ck.close()
    flush_bytes, flush_s = (statistics.median(x) for x in zip(*flushes[1:], strict=True))
    report.add("engine", "flush_time", "local -> shared flush", flush_s, "s")
    report.add("engine", "flush_throughput", "flush throughput", flush_bytes / flush_s / GiB, "GiB/s")

    k = max(2, math.ceil(4 * commit_s / step_s))  # a commit takes at most a quarter of the interval
    report.add("engine", "interval_k", "checkpoint interval k (4 x commit / step)", k, "steps")
    ck = Checkpointer(root / "throughput", keep=2)
    ck.save(0, work.state)  # allocate the arena outside the timed blocks
    ck.wait()
    plain, with_ck = [], []
    for i in range(REPS):
        plain.append(timed(lambda: [work.step() for _ in range(k)]))

        def block(i: int = i) -> None:
            ck.save(i + 1, work.state)
            for _ in range(k):
                work.step()
            ck.wait()  # a commit spilling past the interval is a cost of checkpointing too

        with_ck.append(timed(block))
    ck.close()
    none_rate = report.add(
        "engine", "throughput_none", "throughput, no checkpoints", k / statistics.median(plain), "steps/s"
    )
    ck_rate = report.add(
        "engine", "throughput_ckpt", "throughput, checkpoint every k", k / statistics.median(with_ck), "steps/s"
    )
    report.add("engine", "slowdown", "slowdown from checkpoints", 100 * (1 - ck_rate / none_rate), "%")


def measure_overlap(work: Workload, root: Path, report: Report) -> None:
    """Overlap stall: save's blocking time plus how much longer the next step takes than one without."""
    ck = Checkpointer(root / "overlap", keep=2)
    marks: dict[str, float] = {}
    before = work.optimizer.register_step_pre_hook(lambda *_: marks.__setitem__("in", time.perf_counter()))
    blocked, with_save, without, hook_waits = [], [], [], []
    for i in range(REPS + 1):
        ck.wait()
        base = work.step()
        save_s = timed(lambda i=i: ck.save(i, work.state, overlap=True))
        if i == 0:  # the engine's hook now exists; one registered after it sees when it returns
            after = work.optimizer.register_step_pre_hook(lambda *_: marks.__setitem__("out", time.perf_counter()))
        step_s = work.step()
        if i:
            blocked.append(save_s)
            with_save.append(step_s)
            without.append(base)
            hook_waits.append(marks["out"] - marks["in"])
    ck.close()
    before.remove()
    after.remove()
    block_s = report.add("engine", "overlap_save_block", "overlap save: save() blocks", statistics.median(blocked), "s")
    extra = max(0.0, statistics.median(with_save) - statistics.median(without))
    report.add("engine", "overlap_step_extra", "overlap save: next step slower by", extra, "s")
    report.add("engine", "overlap_hook_wait", "  of which optimizer.step waits", statistics.median(hook_waits), "s")
    report.add("engine", "stall_overlap_median", "overlap save stall (block + extra)", block_s + extra, "s")


def measure_baselines(work: Workload, root: Path, report: Report) -> None:
    """torch.save, DCP save / async_save, torch.load on the same model and optimizer state."""
    path = root / "torch.pt"
    saves, durable = [], []
    for _ in range(REPS):
        start = time.perf_counter()
        with open(path, "wb") as out:
            torch.save(work.state_dict(), out)
            saves.append(time.perf_counter() - start)
            out.flush()
            os.fsync(out.fileno())
        durable.append(time.perf_counter() - start)
    report.add("baselines", "torch_save_time", "torch.save stall", statistics.median(saves), "s")
    report.add("baselines", "torch_save_fsync_time", "torch.save + fsync", statistics.median(durable), "s")

    def load() -> float:
        return timed(lambda: torch.load(path, weights_only=True))

    def load_into_state() -> float:
        fresh = work.fresh()
        start = time.perf_counter()
        loaded = torch.load(path, weights_only=True)
        fresh.model.load_state_dict(loaded["model"])
        fresh.optimizer.load_state_dict(loaded["optimizer"])
        return time.perf_counter() - start

    report.add("baselines", "torch_load_time", "torch.load", median_of(load, REPS), "s")
    report.add(
        "baselines", "torch_load_state_time", "torch.load + load_state_dict", median_of(load_into_state, REPS), "s"
    )
    path.unlink()

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # no_dist=True on purpose
    sync_s, stalls, totals = [], [], []
    for i in range(REPS):
        target = root / f"dcp-{i}"
        sync_s.append(timed(lambda target=target: dcp.save(work.state_dict(), checkpoint_id=target, no_dist=True)))
        shutil.rmtree(target)
        start = time.perf_counter()
        future = dcp.async_save(work.state_dict(), checkpoint_id=target, no_dist=True)
        stalls.append(time.perf_counter() - start)
        future.result()
        totals.append(time.perf_counter() - start)
        shutil.rmtree(target)
    report.add("baselines", "dcp_save_time", "DCP save stall", statistics.median(sync_s), "s")
    report.add("baselines", "dcp_async_stall", "DCP async_save stall", statistics.median(stalls), "s")
    report.add("baselines", "dcp_async_total", "DCP async_save -> done", statistics.median(totals), "s")


def measure_mpi(nbytes: int, root: Path, report: Report) -> None:
    """Run the two-rank part under mpiexec and report what rank 0 collected."""
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        console.print("[yellow]mpiexec not found: skipping the MPI part")
        return
    out = root / "mpi.json"
    cmd = [mpiexec, "-n", "2", sys.executable, __file__, "--mpi-worker"]
    cmd += ["--size", f"{nbytes // MiB}MiB", "--dir", str(root / "mpi"), "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        console.print(f"[red]MPI part failed ({done.returncode}):[/red]\n{done.stderr[-2000:]}")
        return
    result = json.loads(out.read_text())
    report.add("mpi", "mpi_state_bytes", "state per rank", result["nbytes"] / MiB, "MiB")
    for rank, rows in enumerate(result["ranks"]):
        median_bytes = statistics.median(r["bytes"] for r in rows)
        report.add("mpi", f"mpi_rank{rank}_bytes", f"2 ranks: rank {rank} writes", median_bytes / MiB, "MiB")
    commit = statistics.median(r["commit"] for r in result["ranks"][0])
    report.add("mpi", "mpi_commit_2ranks", "2 ranks: save -> commit", commit, "s")
    single_rows = result["ranks"][0]
    report.add(
        "mpi",
        "mpi_single_bytes",
        "1 writer writes",
        statistics.median(r["single_bytes"] for r in single_rows) / MiB,
        "MiB",
    )
    report.add(
        "mpi",
        "mpi_commit_single",
        "1 writer: save -> commit",
        statistics.median(r["single_commit"] for r in single_rows),
        "s",
    )


def mpi_worker(nbytes: int, root: Path, out: Path) -> None:
    """One rank: checkpoints with a 2-rank comm, then rank 0 alone (comm=None), alternately."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)  # two ranks share the cores
    work = Workload(nbytes)  # same seed on every rank: replicated state
    pair = Checkpointer(root / "two-ranks", comm=comm, keep=2)
    single = Checkpointer(root / "single", keep=2) if comm.rank == 0 else None
    rows = []
    for i in range(REPS + 1):
        before = pair.stats.bytes_written
        pair.save(i, work.state)
        pair.wait()
        row = {"bytes": pair.stats.bytes_written - before, "commit": pair.stats.last_commit_latency}
        comm.Barrier()
        if single is not None:
            before = single.stats.bytes_written
            single.save(i, work.state)
            single.wait()
            row |= {
                "single_bytes": single.stats.bytes_written - before,
                "single_commit": single.stats.last_commit_latency,
            }
        comm.Barrier()
        if i:
            rows.append(row)
    pair.close()
    if single is not None:
        single.close()
    gathered = comm.gather(rows, root=0)
    if comm.rank == 0:
        out.write_text(json.dumps({"nbytes": work.nbytes, "ranks": gathered}))


def add_ratios(report: Report) -> None:
    compute_hides_copy = report.figures["fwd_bwd_time"]["value"] > report.figures["copy_time"]["value"]
    overlap_note = "" if compute_hides_copy else "forward/backward shorter than the copy"
    report.ratio("stall_vs_copy", "plain stall / reused-buffer copy", "stall_plain_median", "copy_time", 1.5, True)
    report.ratio(
        "dcp_vs_stall", "DCP async_save stall / our plain stall", "dcp_async_stall", "stall_plain_median", 1.0, False
    )
    report.ratio(
        "overlap_vs_copy",
        "overlap stall / reused-buffer copy",
        "stall_overlap_median",
        "copy_time",
        0.3,
        True,
        overlap_note,
    )
    report.ratio(
        "flush_vs_disk", "flush throughput / write+fsync bandwidth", "flush_throughput", "write_bandwidth", 0.8, False
    )
    report.ratio(
        "throughput", "throughput with / without checkpoints", "throughput_ckpt", "throughput_none", 0.95, False
    )
    report.ratio("restore_vs_load", "our restore / torch.load", "restore_time", "torch_load_time", 1.0, True)
    report.ratio(
        "restore_vs_load_state",
        "our restore / torch.load + load_state_dict",
        "restore_time",
        "torch_load_state_time",
        1.0,
        True,
    )


def print_report(report: Report) -> None:
    figures = Table(title="Figures (medians)")
    for column in ("section", "quantity", "value", "unit"):
        figures.add_column(column, justify="right" if column == "value" else "left")
    for fig in report.figures.values():
        value = fig["value"]
        figures.add_row(fig["section"], fig["label"], f"{value:.4g}", fig["unit"])
    console.print(figures)
    ratios = Table(title="Ratios against targets")
    for column in ("ratio", "value", "target", "result"):
        ratios.add_column(column, justify="right" if column == "value" else "left")
    for r in report.ratios.values():
        style = {"PASS": "green", "FAIL": "red"}.get(r["result"], "yellow")
        result = f"[{style}]{r['result']}[/{style}]" + (f" ({r['note']})" if r["note"] else "")
        ratios.add_row(r["label"], f"{r['value']:.3f}", r["target"], result)
    console.print(ratios)


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(MiB|GiB)\s*", text, re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(f"size must look like 256MiB or 1GiB, got {text!r}")
    return int(float(match.group(1)) * (GiB if match.group(2).lower() == "gib" else MiB))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help=f"{SIZES['quick'] // MiB} MiB state, under a minute")
    mode.add_argument("--full", action="store_true", help=f"{SIZES['full'] // GiB} GiB state")
    mode.add_argument("--size", type=parse_size, help=f"state size, e.g. 256MiB (default {SIZES['default'] // MiB}MiB)")
    parser.add_argument("--dir", type=Path, help="target directory (default: a temporary one in ./bench-results)")
    parser.add_argument("--json", type=Path, help="write every figure, ratio and the configuration here")
    parser.add_argument("--skip-mpi", action="store_true", help="leave out the mpiexec -n 2 part")
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    size = args.size or SIZES["quick" if args.quick else "full" if args.full else "default"]
    if args.mpi_worker:
        mpi_worker(size, args.dir, args.json)
        return

    threads = max(1, len(os.sched_getaffinity(0)) - 1)
    torch.set_num_threads(threads)
    base = args.dir or Path.cwd() / "bench-results"
    made_base = not base.exists()
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="checkpoint-bench-", dir=base))
    local = Path(tempfile.mkdtemp(prefix="checkpoint-bench-local-"))
    report = Report()
    started = time.perf_counter()
    try:
        work = Workload(size)
        report.add("limits", "state_bytes", f"state (MLP {DEPTH}x{work.width}^2 + Adam)", work.nbytes / MiB, "MiB")
        for name, phase in [("limits", measure_limits), ("baselines", measure_baselines)]:
            console.print(f"[dim]measuring {name}...")
            phase(work, root, report)
        console.print("[dim]measuring engine...")
        measure_engine(work, root, local, report)
        if not args.skip_mpi:
            console.print("[dim]measuring mpiexec -n 2...")
            measure_mpi(min(size, MPI_MAX), root, report)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)
        if made_base:
            base.rmdir()
    add_ratios(report)
    print_report(report)
    wall = time.perf_counter() - started
    console.print(f"wall time {wall:.1f} s, torch threads {threads}, target {base}")
    if args.json:
        config = {"state_bytes": work.nbytes, "width": work.width, "depth": DEPTH, "batch": BATCH, "reps": REPS}
        config |= {"torch_threads": threads, "target_dir": str(base), "wall_s": wall, "torch": torch.__version__}
        args.json.write_text(
            json.dumps({"figures": report.figures, "ratios": report.ratios, "config": config}, indent=1)
        )


if __name__ == "__main__":
    main()
