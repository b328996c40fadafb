"""Checkpointed array loops: what ``resilience.Context`` costs a numpy stencil, against ``np.save``.

A 2-D Jacobi heat stencil on two float64 arrays (``u`` and the next ``v``, swapped in place each
iteration), run three ways side by side, alternating their order in each round:

- ``none``: the loop alone;
- ``ours``: the same loop body through ``Context.checkpoint`` with ``every(k)``: the arrays are
  found, copied into the engine's host buffers, and written, checksummed and committed in the
  background;
- ``baseline``: the hand-written way: every ``k`` iterations ``np.save`` each array to a file and
  ``fsync`` it, synchronously.

Overhead per checkpoint is (loop time - ``none``'s loop time in the same round) / checkpoints, the
median over rounds of these paired differences (``spread``: their median absolute deviation). The
reference is a memory copy of the same arrays into preallocated buffers (``np.copyto``), the least
any snapshot must cost. Each ``ours`` run is a fresh process-level start for the engine: its first
checkpoint allocates and first touches the host buffers, which later ones reuse; the engine's
stall per checkpoint is printed for the first and for the later ones, and the steady overhead
(the first checkpoint's extra stall taken out) is what a long loop converges to. Targets: ours
<= 1.5x a memory copy per checkpoint, and >= 3x less than the baseline's overhead. Every run
starts from the same initial arrays and must end with bitwise equal arrays (checked).

``python benchmarks/resilience_bench.py [--quick | --full] [--json PATH] [--dir DIR]``:
``--quick`` 2048 x 2048 (64 MiB of state), 100 iterations, 5 rounds; default 4096 x 4096
(256 MiB), 100 iterations, 5 rounds; ``--full`` 8192 x 8192 (1 GiB), 60 iterations, 3 rounds;
``k`` = 10.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np
from harness import failed, median_time, options, size_of, spread, write_json
from report import print_verdicts
from rich.table import Table

from resilient_flows.resilience import Context, every

SIZES = {"quick": (2048, 100, 5), "default": (4096, 100, 5), "full": (8192, 60, 3)}
EVERY = 10
#: How long each of ours' ``checkpoint`` calls blocked beyond the iteration, in order (engine stats).
STALLS: list[float] = []


def initial(n: int) -> tuple[np.ndarray, np.ndarray]:
    u = np.zeros((n, n))
    u[0, :] = 100.0  # a hot edge
    u[n // 2, n // 2] = 1000.0
    return u, u.copy()


def step(u: np.ndarray, v: np.ndarray) -> None:
    """One Jacobi sweep into ``v``, then ``u`` takes it: the arrays keep their identity."""
    v[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])
    u[1:-1, 1:-1] = v[1:-1, 1:-1]


def run_none(n: int, iterations: int, _: Path) -> tuple[float, np.ndarray]:
    u, v = initial(n)
    started = time.perf_counter()
    for _i in range(iterations):
        step(u, v)
    return time.perf_counter() - started, u


def run_ours(n: int, iterations: int, directory: Path) -> tuple[float, np.ndarray]:
    u, v = initial(n)
    started = time.perf_counter()
    with Context(directory, filter=every(EVERY)) as ctx:
        for i in range(iterations):
            ctx.checkpoint("heat", i, lambda: step(u, v))
            if (i + 1) % EVERY == 0:
                STALLS.append(ctx.stats("heat").last_stall)
        elapsed = time.perf_counter() - started  # the loop's time; close() waits for the last write
    return elapsed, u


def run_baseline(n: int, iterations: int, directory: Path) -> tuple[float, np.ndarray]:
    u, v = initial(n)
    directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for i in range(iterations):
        step(u, v)
        if (i + 1) % EVERY == 0:
            for name, array in (("u", u), ("v", v)):
                path = directory / f"{name}-{i:06d}.npy"
                with path.open("wb") as f:
                    np.save(f, array)
                    f.flush()
                    os.fsync(f.fileno())
    return time.perf_counter() - started, u


def memory_copy(n: int, reps: int = 5) -> float:
    u, v = initial(n)
    out_u, out_v = np.empty_like(u), np.empty_like(v)
    np.copyto(out_u, u)
    np.copyto(out_v, v)  # first touch of the destination, as a reused buffer has had
    return median_time(lambda: (np.copyto(out_u, u), np.copyto(out_v, v)), reps)


def measure(n: int, iterations: int, rounds: int, where: Path) -> tuple[dict[str, list[float]], dict[str, np.ndarray]]:
    """Each run's loop time per round, in an order reversed every other round so that drift on a
    shared machine spreads evenly; and each run's final arrays (from its first round)."""
    root = Path(tempfile.mkdtemp(prefix="resilience-bench-", dir=where))
    runners = {"none": run_none, "ours": run_ours, "baseline": run_baseline}
    times: dict[str, list[float]] = {name: [] for name in runners}
    finals = {}
    try:
        for r in range(rounds):
            order = list(runners) if r % 2 == 0 else list(reversed(runners))
            for name in order:
                directory = root / f"{name}-{r}"
                elapsed, final = runners[name](n, iterations, directory)
                times[name].append(elapsed)
                finals.setdefault(name, final)
                shutil.rmtree(directory, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return times, finals


def main(argv: list[str] | None = None) -> int:
    parser, _ = options(__doc__, quick="64 MiB of state, under a minute", full="1 GiB of state")
    parser.add_argument("--dir", type=Path, help="where checkpoints go (default: a temporary directory here)")
    parser.add_argument("--json", type=Path, help="write every figure with its unit")
    args = parser.parse_args(argv)
    size = size_of(args)
    n, iterations, rounds = SIZES[size]
    console = harness.console()
    checkpoints = iterations // EVERY
    times, finals = measure(n, iterations, rounds, args.dir or Path.cwd())
    same = all(np.array_equal(finals["none"], finals[k]) for k in finals)
    copy = memory_copy(n)
    base = statistics.median(times["none"])
    paired = {
        k: [(t - t_none) / checkpoints for t, t_none in zip(times[k], times["none"], strict=True)]
        for k in ("ours", "baseline")
    }
    per_ckpt = {k: statistics.median(v) for k, v in paired.items()}
    spreads = {k: spread(v, per_ckpt[k]) for k, v in paired.items()}
    first_stall = statistics.median(STALLS[::checkpoints])
    later_stall = statistics.median(x for j, x in enumerate(STALLS) if j % checkpoints)
    steady = per_ckpt["ours"] - (first_stall - later_stall) / checkpoints
    state_mib = 2 * n * n * 8 / 2**20
    table = Table(title=f"{n} x {n} stencil, {state_mib:.0f} MiB of state, {iterations} iterations, every {EVERY}")
    for column in ("run", "loop s (median)", "overhead per checkpoint", "spread", "vs memory copy"):
        table.add_column(column, justify="left" if column == "run" else "right")
    table.add_row("none", f"{base:.3f}", "-", "-", "-")
    for name in ("ours", "baseline"):
        table.add_row(
            name,
            f"{statistics.median(times[name]):.3f}",
            f"{per_ckpt[name]:.4f} s",
            f"{spreads[name]:.4f} s",
            f"{per_ckpt[name] / copy:.2f}x",
        )
    table.add_row("memory copy of the arrays", "-", f"{copy:.4f} s", "-", "1.00x")
    for label, value in (
        ("ours: stall of a run's first checkpoint", first_stall),
        ("ours: stall of later checkpoints", later_stall),
        ("ours, steady (first's extra removed)", steady),
    ):
        table.add_row(label, "-", f"{value:.4f} s", "-", f"{value / copy:.2f}x")
    console.print(table)
    ratio = per_ckpt["baseline"] / per_ckpt["ours"] if per_ckpt["ours"] > 0 else float("inf")
    verdicts = {
        "ours <= 1.5x a memory copy per checkpoint": per_ckpt["ours"] <= 1.5 * copy,
        "ours >= 3x less overhead than np.save": ratio >= 3,
        "every run ends with the same arrays": same,
    }
    console.print(f"baseline overhead / ours: {ratio:.1f}x")
    print_verdicts(console, verdicts)
    if args.json:
        figures = {
            "none_loop_s": {"value": base, "unit": "s"},
            "ours_overhead_per_checkpoint_s": {"value": per_ckpt["ours"], "unit": "s"},
            "baseline_overhead_per_checkpoint_s": {"value": per_ckpt["baseline"], "unit": "s"},
            "ours_overhead_spread_s": {"value": spreads["ours"], "unit": "s"},
            "baseline_overhead_spread_s": {"value": spreads["baseline"], "unit": "s"},
            "memory_copy_s": {"value": copy, "unit": "s"},
            "ours_first_stall_s": {"value": first_stall, "unit": "s"},
            "ours_later_stall_s": {"value": later_stall, "unit": "s"},
            "ours_steady_overhead_per_checkpoint_s": {"value": steady, "unit": "s"},
            "ours_steady_over_memory_copy": {"value": steady / copy, "unit": "ratio"},
            "ours_over_memory_copy": {"value": per_ckpt["ours"] / copy, "unit": "ratio"},
            "baseline_over_ours": {"value": ratio, "unit": "ratio"},
            "state_mib": {"value": state_mib, "unit": "MiB"},
        }
        write_json(args.json, {"size": size, "figures": figures, "verdicts": verdicts}, indent=2)
    return int(failed(verdicts))


if __name__ == "__main__":
    sys.exit(main())
