"""Checkpoint interval tuning: the learned recommender against the formulas, measured by the simulator.

Held-out parameter sets are drawn from the training range (:mod:`resilient_flows.mlc._dataset`)
with a seed the shipped model never saw (``--seed``, default 1; training used 0). For each, the
simulator's search gives the optimum; then the optimum, the learned recommendation, Young's and
Daly's intervals (for all failures together, every checkpoint flushed, as the engine's default
``persist_every: 1``), Benoit's first-order two-level optimum and the first-order interval with
flush interference (:func:`~resilient_flows.mlc._analytic.async_interval`) are simulated on the same failures
(common random numbers, ``--trials`` runs each). Regret is the optimum's simulated efficiency minus
a method's, in percentage points. Targets: learned median regret <= 0.5 pp and 95th percentile
<= 2 pp, below every formula's at the p95; a recommendation >= 1000x faster than a search. The
share of sets whose optimum flushes less often than every checkpoint (``l2_every > 1``) is
reported: it says how much the configuration's second number matters over this range.

Run ``python benchmarks/mlc_bench.py [--quick | --full] [--json PATH] [--model PATH]``.
``--quick``: 24 sets, 150 trials (under a minute). Default: 200 sets, 400 trials (about 22 minutes
on 2 cores: flushes that block and slow compute made the search slower). ``--full``: 500 sets,
1000 trials.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import harness
import numpy as np
from harness import failed, options, size_of, write_json
from report import print_verdicts
from rich.table import Table

from resilient_flows.mlc import MLCConfig, MLCParams, search, simulate_failures
from resilient_flows.mlc._dataset import sample_params
from resilient_flows.mlc._recommender import Recommender
from resilient_flows.mlc._tune import candidates

SIZES = {"quick": (24, 150), "default": (200, 400), "full": (500, 1000)}
METHODS = ("learned", "Young", "Daly", "two-level (Benoit)", "async (interference)")


def optimum(task: tuple[MLCParams, int]) -> tuple[MLCConfig, float]:
    """The search's answer and how long it took (in a worker process)."""
    params, trials = task
    started = time.perf_counter()
    config = search(params, trials=trials, seed=0)
    return config, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser, _ = options(__doc__, quick="24 held-out sets, 150 trials", full="500 held-out sets, 1000 trials")
    parser.add_argument("--seed", type=int, default=1, help="draws the held-out sets (training used 0)")
    parser.add_argument("--model", type=Path, help="a model from 'resilient-flows mlc train' (default: shipped)")
    parser.add_argument("--json", type=Path, help="write every figure with its unit")
    args = parser.parse_args(argv)
    size = size_of(args)
    count, trials = SIZES[size]
    console = harness.console()
    recommender = Recommender.load(args.model) if args.model else Recommender.default()

    params = sample_params(count, seed=args.seed)
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        searched = list(pool.map(optimum, [(p, trials) for p in params]))
    console.print(f"{count} searches in {time.perf_counter() - started:.0f} s")

    regrets: dict[str, list[float]] = {m: [] for m in METHODS}
    recommend_s = []
    for p, (best, _) in zip(params, searched, strict=True):
        tic = time.perf_counter()
        recommender.recommend(p)
        recommend_s.append(time.perf_counter() - tic)
        configs = candidates(p, recommender)
        reference = simulate_failures(p, best, trials=trials, seed=7).efficiency
        for method in METHODS:
            regrets[method].append(
                100 * (reference - simulate_failures(p, configs[method], trials=trials, seed=7).efficiency)
            )

    figures: dict[str, dict[str, Any]] = {}
    table = Table(title=f"efficiency regret against the simulator's optimum, {count} held-out sets (pp)")
    for column in ("method", "median", "p95", "max", "mean"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for method, values in regrets.items():
        arr = np.array(values)
        row = {"median": float(np.median(arr)), "p95": float(np.percentile(arr, 95)), "max": float(arr.max())}
        row["mean"] = float(arr.mean())
        for key, value in row.items():
            figures[f"regret_{method}_{key}"] = {"value": value, "unit": "percentage points"}
        table.add_row(method, *(f"{row[k]:.3f}" for k in ("median", "p95", "max", "mean")))
    console.print(table)
    spaced = sum(1 for best, _ in searched if (best.l2_every or 1) > 1) / count
    figures["optimum_l2_every_above_1_share"] = {"value": spaced, "unit": "fraction of held-out sets"}
    console.print(f"the optimum flushes less often than every checkpoint (l2_every > 1) in {spaced:.0%} of sets")
    search_s = statistics.median(t for _, t in searched)
    recommend = statistics.median(recommend_s)
    speedup = search_s / recommend
    figures["search_median_s"] = {"value": search_s, "unit": "s"}
    figures["recommend_median_s"] = {"value": recommend, "unit": "s"}
    figures["recommend_speedup"] = {"value": speedup, "unit": "ratio"}
    console.print(
        f"time per configuration: search {search_s:.3f} s (median, {trials} trials), "
        f"recommendation {1e6 * recommend:.1f} us: {speedup:,.0f}x faster"
    )
    learned = figures["regret_learned_median"]["value"], figures["regret_learned_p95"]["value"]
    verdicts = {
        "learned median regret <= 0.5 pp": learned[0] <= 0.5,
        "learned p95 regret <= 2 pp": learned[1] <= 2.0,
        "learned p95 below every formula's": all(learned[1] < figures[f"regret_{m}_p95"]["value"] for m in METHODS[1:]),
        "recommendation >= 1000x faster than search": speedup >= 1000,
    }
    print_verdicts(console, verdicts)
    if args.json:
        write_json(args.json, {"size": size, "figures": figures, "verdicts": verdicts}, indent=2)
    return int(failed(verdicts))


if __name__ == "__main__":
    sys.exit(main())
