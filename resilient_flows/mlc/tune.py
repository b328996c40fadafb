"""``resilient-flows tune``: every way we have to pick a checkpoint configuration, side by side.

Each candidate is simulated on the same failures (common random numbers), so that the efficiency
column compares configurations, not luck. The formulas see the job as one level whose failures are
all failures (``1 / M = 1 / l1_mtbf + 1 / l2_mtbf``) and flush every checkpoint, which is what the
engine does by default (``persist_every: 1``).
"""

from __future__ import annotations

import argparse
import math
import time

from rich.console import Console
from rich.table import Table

from resilient_flows.mlc.analytic import daly_interval, two_level_optimum, young_interval
from resilient_flows.mlc.params import MLCConfig, MLCParams
from resilient_flows.mlc.recommender import Recommender
from resilient_flows.mlc.search import search
from resilient_flows.mlc.simulator import simulate
from resilient_flows.units import duration_argument

__all__ = ["add_tune_parser", "candidates", "combined_mtbf"]


def combined_mtbf(p: MLCParams) -> float:
    """The mean time between failures of either kind."""
    rate = p.l1_rate + p.l2_rate
    return math.inf if rate == 0 else 1.0 / rate


def candidates(p: MLCParams, recommender: Recommender | None = None) -> dict[str, MLCConfig]:
    """The formulas' configurations and, given a ``recommender``, the learned one."""
    mtbf = combined_mtbf(p)
    every = None if math.isinf(p.l2_mtbf) else 1
    out = {
        "Young": MLCConfig(min(young_interval(p.l1_cost, mtbf), p.solve_time), every),
        "Daly": MLCConfig(min(daly_interval(p.l1_cost, mtbf), p.solve_time), every),
    }
    if every is not None:
        out["two-level (Benoit)"] = two_level_optimum(p)
    if recommender is not None:
        out["learned"] = recommender.recommend(p)
    return out


def add_tune_parser(subparsers: argparse._SubParsersAction) -> None:
    tune = subparsers.add_parser("tune", help="compare checkpoint intervals: formulas, the learned model, search")
    duration = duration_argument
    tune.add_argument("--l1-cost", type=duration, required=True, help="node-local checkpoint stall, e.g. 10s")
    tune.add_argument("--l2-latency", type=duration, default=0.0, help="flush to the shared tier, e.g. 5m")
    tune.add_argument("--l1-mtbf", type=duration, required=True, help="mean time between process failures, e.g. 6h")
    tune.add_argument("--l2-mtbf", type=duration, default=math.inf, help="mean time between lost nodes, e.g. 2d")
    tune.add_argument("--l1-restart", type=duration, help="restart from node-local (default: --l1-cost)")
    tune.add_argument("--l2-restart", type=duration, help="restart from the shared tier (default: --l2-latency)")
    tune.add_argument("--solve-time", type=duration, default=100 * 3600.0, help="compute needed (default 100h)")
    tune.add_argument("--search", action="store_true", help="also run the simulator's search (seconds)")
    tune.add_argument("--model", help="a model file from 'mlc train' (default: the one shipped)")
    tune.add_argument("--trials", type=int, default=2000, help="simulated runs per candidate (default 2000)")
    tune.set_defaults(handler=run_tune)


def run_tune(args: argparse.Namespace) -> int:
    p = MLCParams(
        l1_cost=args.l1_cost,
        l1_restart=args.l1_cost if args.l1_restart is None else args.l1_restart,
        l1_mtbf=args.l1_mtbf,
        solve_time=args.solve_time,
        l2_latency=args.l2_latency,
        l2_restart=args.l2_latency if args.l2_restart is None else args.l2_restart,
        l2_mtbf=args.l2_mtbf,
    )
    recommender = Recommender.load(args.model) if args.model else Recommender.default()
    chosen = candidates(p, recommender)
    if args.search:
        started = time.perf_counter()
        best = search(p, trials=args.trials)
        chosen[f"search ({time.perf_counter() - started:.1f} s)"] = best
    table = Table(title="checkpoint configurations, simulated on the same failures")
    for column in ("method", "interval", "flush every", "efficiency", "95% interval"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for name, config in chosen.items():
        result = simulate(p, config, trials=args.trials, seed=1)
        low, high = result.efficiency_ci
        table.add_row(
            name,
            f"{config.interval:.0f} s",
            "never" if config.l2_every is None else str(config.l2_every),
            f"{result.efficiency:.4f}",
            f"{low:.4f}-{high:.4f}",
        )
    Console().print(table)
    return 0
