"""``resilient-flows tune``: every way we have to pick a checkpoint configuration, side by side.

Each candidate (:func:`resilient_flows.mlc._tune.candidates`) is simulated on the same failures
(common random numbers), so that the efficiency column compares configurations, not luck; the
traffic column says what each sends to the shared tier.

The options past the two-level ones are parsed here rather than by ``argparse``, so that a bad value
is one line naming the field, like every other parameter error, with exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any

from rich.table import Table

from resilient_flows.cli._console import console, print_document
from resilient_flows.mlc import InvalidParameterError, MLCParams, Objective
from resilient_flows.units import duration_argument, parse_duration, parse_size

if TYPE_CHECKING:
    from resilient_flows.mlc import FailureSimResult

#: The version of the ``tune --json`` document; README.md ("Output for scripts") lists its fields.
TUNE_VERSION = 1


def add_parsers(commands: argparse._SubParsersAction) -> None:
    tune = commands.add_parser("tune", help="compare checkpoint intervals: formulas, the learned model, search")
    duration = duration_argument
    tune.add_argument("--l1-cost", type=duration, required=True, help="node-local checkpoint stall, e.g. 10s")
    tune.add_argument("--l1-latency", type=duration, default=0.0, help="node-local write after the stall, e.g. 2s")
    tune.add_argument("--l2-latency", type=duration, default=0.0, help="flush to L2, e.g. 5m (or give bytes)")
    tune.add_argument("--l1-mtbf", type=duration, required=True, help="mean time between process failures, e.g. 6h")
    tune.add_argument("--l2-mtbf", type=duration, default=math.inf, help="mean time between lost nodes, e.g. 2d")
    tune.add_argument("--l1-restart", type=duration, help="restart from node-local (default: --l1-cost)")
    tune.add_argument("--l2-restart", type=duration, help="restart from L2 (default: the L2 flush's latency)")
    tune.add_argument("--solve-time", type=duration, default=100 * 3600.0, help="compute needed (default 100h)")
    tune.add_argument("--l2-slowdown", default="0", help="fraction of compute speed lost while a flush runs, e.g. 0.2")
    tune.add_argument("--checkpoint-bytes", default="0", help="bytes per node per checkpoint, e.g. 64GiB")
    tune.add_argument("--nodes", default="1", help="nodes of the job (default 1)")
    tune.add_argument("--node-bandwidth", default="inf", help="bytes/s one node sends, e.g. 10GB/s")
    tune.add_argument("--pfs-bandwidth", default="inf", help="bytes/s of the shared file system, e.g. 250GB/s")
    tune.add_argument("--concurrent-flushers", help="nodes flushing at once, other jobs' included (default: --nodes)")
    tune.add_argument("--l3-latency", default="0", help="flush from L2 to L3 (three levels), e.g. 10m")
    tune.add_argument("--l3-restart", help="restart from L3 (default: the L3 flush's latency)")
    tune.add_argument("--l3-mtbf", default="inf", help="mean time between failures that need L3; sets a third level")
    tune.add_argument("--traffic-cap", help="search: most shared-tier bytes per hour per node, e.g. 1TB")
    tune.add_argument("--byte-price", default="0", help="search: efficiency given up per byte/hour/node, e.g. 1e-14")
    tune.add_argument("--search", action="store_true", help="also run the simulator's search (seconds)")
    tune.add_argument("--model", help="a model file from 'mlc train' (default: the one shipped)")
    tune.add_argument("--trials", type=int, default=2000, help="simulated runs per candidate (default 2000)")
    tune.add_argument(
        "--json", action="store_true", help="print a JSON document for scripts instead (README: Output for scripts)"
    )
    tune.set_defaults(handler=run_tune)


def params_from_args(args: argparse.Namespace) -> MLCParams:
    """The job described by the ``tune`` options; a bad value raises :class:`InvalidParameterError` naming it.

    Unset restart times default to the latency of the flush that wrote what they read back.
    """
    three = _duration("l3_mtbf", args.l3_mtbf)
    p = MLCParams(
        l1_cost=args.l1_cost,
        l1_latency=args.l1_latency,
        l1_restart=args.l1_cost if args.l1_restart is None else args.l1_restart,
        l1_mtbf=args.l1_mtbf,
        solve_time=args.solve_time,
        l2_latency=args.l2_latency,
        l2_mtbf=args.l2_mtbf,
        l2_slowdown=_number("l2_slowdown", args.l2_slowdown),
        checkpoint_bytes=_size("checkpoint_bytes", args.checkpoint_bytes),
        nodes=_count("nodes", args.nodes),
        node_bandwidth=_bandwidth("node_bandwidth", args.node_bandwidth),
        pfs_bandwidth=_bandwidth("pfs_bandwidth", args.pfs_bandwidth),
        concurrent_flushers=None
        if args.concurrent_flushers is None
        else _count("concurrent_flushers", args.concurrent_flushers),
        l3_latency=_duration("l3_latency", args.l3_latency),
        l3_mtbf=three,
    )
    lat2, lat3 = p.flush_latencies
    restarts = {"l2_restart": lat2 if args.l2_restart is None else args.l2_restart}
    if p.three_level:
        restarts["l3_restart"] = lat3 if args.l3_restart is None else _duration("l3_restart", args.l3_restart)
    elif args.l3_restart is not None:
        restarts["l3_restart"] = _duration("l3_restart", args.l3_restart)
    return dataclasses.replace(p, **restarts)


def objective_from_args(args: argparse.Namespace) -> Objective:
    cap = None if args.traffic_cap is None else _size("traffic_cap", args.traffic_cap)
    return Objective(traffic_cap=cap, byte_price=_number("byte_price", args.byte_price))


def run_tune(args: argparse.Namespace) -> int:
    from resilient_flows.mlc import Recommender, candidates, search, simulate_failures

    p = params_from_args(args)
    objective = objective_from_args(args)
    objective.check(p)
    recommender = Recommender.load(args.model) if args.model else Recommender.default()
    chosen = candidates(p, recommender)
    search_s = None
    if args.search:
        started = time.perf_counter()
        chosen["search"] = search(p, trials=args.trials, objective=objective)
        search_s = time.perf_counter() - started
    results = {name: simulate_failures(p, config, trials=args.trials, seed=1) for name, config in chosen.items()}
    if args.json:
        print_document(_document(p, args.trials, results, search_s))
        return 0
    table = Table(title="checkpoint configurations, simulated on the same failures")
    columns = ["method", "interval", "flush every", "efficiency", "95% interval", "shared-tier traffic"]
    if p.three_level:
        columns.insert(3, "L3 every")
    for column in columns:
        table.add_column(column, justify="left" if column == "method" else "right")
    for name, result in results.items():
        config = result.config
        low, high = result.efficiency_ci
        row = [
            name if name != "search" or search_s is None else f"search ({search_s:.1f} s)",
            f"{config.interval:.0f} s",
            "never" if config.l2_every is None else str(config.l2_every),
            f"{result.efficiency:.4f}",
            f"{low:.4f}-{high:.4f}",
            _traffic(result),
        ]
        if p.three_level:
            row.insert(3, "never" if config.l3_every is None else str(config.l3_every))
        table.add_row(*row)
    console().print(table)
    return 0


def _document(
    p: MLCParams, trials: int, results: dict[str, FailureSimResult], search_s: float | None
) -> dict[str, Any]:
    """``tune --json``: each method's configuration and what the simulator measured of it, on the
    same failures; ``search_seconds`` is how long ``--search`` took (null without it)."""
    return {
        "version": TUNE_VERSION,
        "three_level": p.three_level,
        "trials": trials,
        "search_seconds": search_s,
        "candidates": [
            {
                "method": name,
                "interval_s": result.config.interval,
                "l2_every": result.config.l2_every,
                "l3_every": result.config.l3_every,
                "efficiency": result.efficiency,
                "efficiency_ci": list(result.efficiency_ci),
                "traffic_bytes_per_hour_per_node": result.traffic,
                "shared_flushes_per_hour": result.shared_flushes / result.wall_time * 3600.0,
            }
            for name, result in results.items()
        ],
    }


def _traffic(result: FailureSimResult) -> str:
    """Bytes per hour per node when the bytes are known, else flushes per hour."""
    if result.traffic is not None:
        return f"{result.traffic / 1e9:.1f} GB/h/node"
    return f"{result.shared_flushes / result.wall_time * 3600.0:.2f} flushes/h"


def _number(field: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidParameterError(f"{field} must be a number, got {text!r}") from None


def _count(field: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidParameterError(f"{field} must be a whole number, got {text!r}") from None


def _duration(field: str, text: str) -> float:
    if text.strip().lower() == "inf":
        return math.inf
    try:
        return parse_duration(text, field)
    except ValueError as exc:
        raise InvalidParameterError(str(exc)) from None


def _size(field: str, text: str) -> float:
    try:
        return float(parse_size(text, field))
    except ValueError as exc:
        raise InvalidParameterError(str(exc)) from None


def _bandwidth(field: str, text: str) -> float:
    """Bytes per second from ``250GB/s``, ``250GB`` or a plain number (``inf``: unlimited, ``nan``: an error)."""
    plain = text.strip().removesuffix("/s")
    try:
        return float(plain)
    except ValueError:
        return _size(field, plain)
