"""``resilient-flows cosim``: replay one trace under several policies and compare them.

Every policy sees the same trace and the same on-demand stream, so that a row of the table differs
from another only by the policy. The plot sweeps ``beta / alpha`` for the policies whose choice
depends on it; the baselines preempt at once or never, which no weighting changes, so each is one
point.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console
from rich.status import Status
from rich.table import Table

from resilient_flows.cosched.policies import BASELINES, POLICIES
from resilient_flows.cosched.simulator import (
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_RESTART_COST,
    METRIC_UNITS,
    OnDemandStream,
    SimConfig,
    SimResult,
    simulate,
)
from resilient_flows.cosched.swf import SwfJob, SwfTrace, read_swf
from resilient_flows.errors import InvalidJobError
from resilient_flows.units import duration_argument as _duration

__all__ = ["DEFAULT_POLICIES", "DEFAULT_SWEEP", "add_cosim_parser", "plot_tradeoff", "run_cosim", "run_policies"]

DEFAULT_POLICIES = ("dp", *BASELINES)
#: Ratios ``beta / alpha`` of the plot's sweep: from "the request's wait is all that matters" to
#: "batch work is ten times dearer than the request's wait".
DEFAULT_SWEEP = (0.1, 0.3, 1.0, 3.0, 10.0)

# (attribute of SimMetrics, column heading with its unit)
_COLUMNS = (
    ("ondemand_requests", "requests"),
    ("wait_mean", "wait mean s"),
    ("wait_p95", "wait p95 s"),
    ("wait_max", "wait max s"),
    ("lost_node_hours", "lost node-h"),
    ("restart_node_hours", "restart node-h"),
    ("preemptions", "preempted"),
    ("bounded_slowdown", "batch bsld"),
    ("utilization", "util"),
    ("decisions_per_second", "decide /s"),
    ("objective", "objective node-h"),
    ("jobs_finished", "finished"),
    ("elapsed", "sim s"),
)


def add_cosim_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``cosim`` command to ``resilient-flows``' subcommands; its handler is :func:`run_cosim`."""
    text = "replay a job trace with on-demand requests under co-scheduling policies and compare them"
    cosim = subparsers.add_parser("cosim", help=text, description=text + ".")
    cosim.add_argument("trace", metavar="TRACE", help="a job trace in the Standard Workload Format (.swf)")
    cosim.add_argument("--nodes", type=_positive_int, help="nodes of the machine; default: the trace's MaxNodes")
    cosim.add_argument(
        "--policy",
        action="append",
        choices=POLICIES,
        metavar="POLICY",
        help=f"a policy to compare, repeatable; one of {', '.join(POLICIES)} (default: {', '.join(DEFAULT_POLICIES)})",
    )
    cosim.add_argument("--until", type=_duration, help="only jobs submitted this long after the trace starts, e.g. 7d")
    ondemand = cosim.add_argument_group("on-demand requests")
    ondemand.add_argument("--ondemand-rate", type=_rate, default=2.0, help="Poisson rate, e.g. 2/h, 30/d (default 2/h)")
    ondemand.add_argument(
        "--ondemand-nodes", type=_int_list, default=(128,), help="node counts drawn uniformly, e.g. 64,128 (128)"
    )
    durations = ondemand.add_mutually_exclusive_group()
    durations.add_argument(
        "--ondemand-duration", type=_duration_list, default=(1800.0,), help="durations drawn uniformly (default 30m)"
    )
    durations.add_argument("--ondemand-mean-duration", type=_duration, help="exponential durations of this mean")
    ondemand.add_argument("--ondemand-queue", type=int, help="trace jobs in this SWF queue are on-demand requests too")
    policy = cosim.add_argument_group("policy")
    policy.add_argument("--alpha", type=_weight, default=1.0, help="weight of the request's wait per node-s (1)")
    policy.add_argument("--beta", type=_weight, default=1.0, help="weight of lost and restart work per node-s (1)")
    policy.add_argument("--max-delay", type=_duration, default=1800.0, help="longest wait dp may choose (30m)")
    policy.add_argument("--seed", type=int, default=0, help="seeds the on-demand stream and 'random' (0)")
    jobs = cosim.add_argument_group("batch jobs")
    jobs.add_argument(
        "--checkpoint-interval",
        type=_duration,
        help=f"seconds between checkpoints (default {DEFAULT_CHECKPOINT_INTERVAL:.0f}s unless Young's is asked for)",
    )
    jobs.add_argument("--checkpoint-cost", type=_duration, help="with --mtbf: Young's interval sqrt(2 C MTBF_job)")
    jobs.add_argument("--mtbf", type=_duration, help="the machine's mean time between failures, for Young's interval")
    jobs.add_argument(
        "--restart-cost",
        type=_duration,
        default=DEFAULT_RESTART_COST,
        help=f"seconds a preempted job needs to resume (default {DEFAULT_RESTART_COST:.0f}s)",
    )
    output = cosim.add_argument_group("output")
    output.add_argument("--json", type=Path, help="write every figure, with its unit, to this JSON file")
    output.add_argument("--plot", type=Path, help="draw mean wait against lost node-hours over the sweep (PNG)")
    output.add_argument(
        "--sweep", type=_float_list, default=DEFAULT_SWEEP, help="beta/alpha ratios for --plot (0.1,0.3,1,3,10)"
    )
    cosim.set_defaults(handler=run_cosim)
    return cosim


def run_cosim(args: argparse.Namespace, console: Console | None = None) -> int:
    """Run the comparison that ``args`` describe, print the table, write ``--json`` and ``--plot``."""
    console = console or Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200, highlight=False)
    trace = read_swf(args.trace)
    nodes = args.nodes or trace.max_nodes
    if nodes is None:
        raise InvalidJobError(f"{args.trace}: the header gives no MaxNodes; pass --nodes")
    if (args.checkpoint_cost is None) != (args.mtbf is None):
        raise InvalidJobError("--checkpoint-cost and --mtbf: give both (Young's interval) or neither")
    if args.checkpoint_cost is not None and args.checkpoint_interval is not None:
        raise InvalidJobError("--checkpoint-interval: give it, or --checkpoint-cost and --mtbf, not both")
    base = SimConfig(
        nodes=nodes,
        alpha=args.alpha,
        beta=args.beta,
        max_delay=args.max_delay,
        seed=args.seed,
        checkpoint_interval=args.checkpoint_interval,
        checkpoint_cost=args.checkpoint_cost,
        mtbf=args.mtbf,
        restart_cost=args.restart_cost,
    )
    stream = OnDemandStream(
        rate_per_hour=args.ondemand_rate,
        nodes=args.ondemand_nodes,
        durations=args.ondemand_duration,
        mean_duration=args.ondemand_mean_duration,
        seed=args.seed,
    )
    policies = tuple(dict.fromkeys(args.policy or DEFAULT_POLICIES))
    jobs = [job for job in trace.jobs if args.until is None or job.submit_time < args.until]
    with console.status("simulating") as status:
        results = run_policies(jobs, base, policies, stream, args.ondemand_queue, status=status)
        sweep: list[SimResult] = []
        if args.plot is not None:
            for policy in (p for p in policies if p not in BASELINES):
                for ratio in args.sweep:
                    config = replace(base, policy=policy, alpha=1.0, beta=ratio)
                    status.update(f"sweep: {policy} at beta/alpha = {ratio:g}")
                    sweep.extend(run_policies(jobs, config, (policy,), stream, args.ondemand_queue))
    console.print(_table(results, _caption(trace, len(jobs), results[0], stream)))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = _document(args, trace, len(jobs), results, sweep, stream)
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        console.print(f"figures written to {args.json}")
    if args.plot is not None:
        plot_tradeoff(results, sweep, args.plot)
        console.print(f"trade-off plotted in {args.plot}")
    return 0 if all(r.metrics.jobs_finished == r.metrics.jobs_total for r in results) else 1


def run_policies(
    jobs: Sequence[SwfJob],
    base: SimConfig,
    policies: Sequence[str],
    stream: OnDemandStream,
    ondemand_queue: int | None = None,
    status: Status | None = None,
) -> list[SimResult]:
    """Simulate ``jobs`` once per policy, with ``base``'s settings and the same on-demand requests.

    The stream covers the submissions, from the first to the last, so that the load of on-demand
    work does not depend on how long a policy takes to drain the queue.
    """
    submits = [job.submit_time for job in jobs]
    requests = stream.requests(min(submits, default=0.0), max(submits, default=0.0))
    results = []
    for policy in policies:
        if status is not None:
            status.update(f"simulating {policy} ({len(jobs)} jobs, {len(requests)} on-demand requests)")
        results.append(simulate(jobs, replace(base, policy=policy), requests, ondemand_queue=ondemand_queue))
    return results


def plot_tradeoff(results: Sequence[SimResult], sweep: Sequence[SimResult], path: str | Path) -> None:
    """Mean on-demand wait against lost node-hours: a curve per swept policy, a point per baseline.

    The lower left is better; a sweep shows what each increment of ``beta / alpha`` buys in batch
    work saved for the on-demand wait it costs.
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.add_subplot()
    curves: dict[str, list[SimResult]] = {}
    for result in sweep:
        curves.setdefault(result.config.policy, []).append(result)
    for policy, points in curves.items():
        points = sorted(points, key=lambda r: r.config.beta / r.config.alpha)
        x = [r.metrics.lost_node_hours for r in points]
        y = [r.metrics.wait_mean / 60 for r in points]
        axes.plot(x, y, marker="o", label=f"{policy} (beta/alpha swept)")
        for r, xi, yi in zip(points, x, y, strict=True):
            axes.annotate(f"{r.config.beta / r.config.alpha:g}", (xi, yi), textcoords="offset points", xytext=(4, 4))
    for result in results:
        if result.config.policy not in curves:
            m = result.metrics
            axes.plot([m.lost_node_hours], [m.wait_mean / 60], marker="s", linestyle="none", label=result.config.policy)
    # Losses span orders of magnitude and "wait" loses nothing: logarithmic from the smallest loss, linear to 0.
    losses = [r.metrics.lost_node_hours for r in (*results, *sweep) if r.metrics.lost_node_hours > 0]
    if losses:
        axes.set_xscale("symlog", linthresh=10 ** math.floor(math.log10(min(losses))))
    axes.set_xlabel("progress lost to preemption (node-hours)")
    axes.set_ylabel("on-demand mean wait (minutes)")
    axes.set_title("on-demand wait against lost batch work")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def _table(results: Sequence[SimResult], caption: str) -> Table:
    table = Table(caption=caption)
    table.add_column("policy")
    for _, heading in _COLUMNS:
        table.add_column(heading, justify="right")
    for result in results:
        values = asdict(result.metrics)
        values["jobs_finished"] = f"{values['jobs_finished']}/{values['jobs_total']}"
        table.add_row(result.config.policy, *(_cell(name, values[name]) for name, _ in _COLUMNS))
    return table


def _cell(name: str, value: float | int | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int | str):
        return str(value)
    if name == "utilization":
        return f"{value:.3f}"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def _caption(trace: SwfTrace, jobs: int, result: SimResult, stream: OnDemandStream) -> str:
    config = result.config
    durations = (
        f"exp(mean {stream.mean_duration:g}s)"
        if stream.mean_duration is not None
        else ",".join(f"{d:g}" for d in stream.durations) + "s"
    )
    skipped = sum(result.skipped.values())
    return (
        f"{trace.path.name}: {jobs} jobs ({skipped} skipped) on {config.nodes} nodes; "
        f"{result.metrics.ondemand_requests} on-demand requests ({stream.rate_per_hour:g}/h, "
        f"{','.join(map(str, stream.nodes))} nodes, {durations}); alpha={config.alpha:g} beta={config.beta:g} "
        f"max delay {config.max_delay:g}s; seed {config.seed}"
    )


def _document(
    args: argparse.Namespace,
    trace: SwfTrace,
    jobs: int,
    results: Sequence[SimResult],
    sweep: Sequence[SimResult],
    stream: OnDemandStream,
) -> dict:
    config = results[0].config
    checkpoint = (
        {"young": {"checkpoint_cost": _v(config.checkpoint_cost, "s"), "mtbf": _v(config.mtbf, "s")}}
        if config.checkpoint_cost is not None
        else {"interval": _v(config.interval_for(1), "s")}
    )
    return {
        "trace": str(trace.path),
        "header": trace.header,
        "jobs": jobs,
        "skipped": results[0].skipped,
        "nodes": config.nodes,
        "ondemand": {
            "rate": _v(stream.rate_per_hour, "1/h"),
            "nodes": list(stream.nodes),
            "durations": _v(list(stream.durations), "s") if stream.mean_duration is None else None,
            "mean_duration": _v(stream.mean_duration, "s") if stream.mean_duration is not None else None,
            "trace_queue": args.ondemand_queue,
            "seed": stream.seed,
        },
        "settings": {
            "alpha": _v(config.alpha, "per node-s waited"),
            "beta": _v(config.beta, "per node-s lost or restarting"),
            "max_delay": _v(config.max_delay, "s"),
            "restart_cost": _v(config.restart_cost, "s"),
            "checkpoint": checkpoint,
        },
        "policies": {r.config.policy: _metrics(r) for r in results},
        "sweep": [
            {"policy": r.config.policy, "alpha": r.config.alpha, "beta": r.config.beta, "metrics": _metrics(r)}
            for r in sweep
        ],
    }


def _metrics(result: SimResult) -> dict:
    return {name: _v(value, METRIC_UNITS[name]) for name, value in asdict(result.metrics).items()}


def _v(value: object, unit: str) -> dict:
    return {"value": value, "unit": unit}


# -- argument types: a bad value is an argparse error naming the option ----------------------------


def _duration_list(text: str) -> tuple[float, ...]:
    return tuple(_duration(item) for item in text.split(","))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(_positive_int(item) for item in text.split(","))


def _weight(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
    return value


def _float_list(text: str) -> tuple[float, ...]:
    return tuple(_weight(item) for item in text.split(","))


def _rate(text: str) -> float:
    """Requests per hour from ``2/h``, ``30/d``, ``1/15m`` or a bare number (per hour)."""
    number, sep, per = text.partition("/")
    rate = _weight(number)
    if not sep:
        return rate
    per = per.strip()
    seconds = _duration(per if per[:1].isdigit() else f"1{per}")
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the period must be longer than 0")
    return rate * 3600.0 / seconds
