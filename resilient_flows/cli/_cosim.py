"""``resilient-flows cosim``: replay one trace under several policies and compare them
(:mod:`resilient_flows.cosched._cosim` does the comparing)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from resilient_flows.cli._console import console
from resilient_flows.cosched import (
    BASELINES,
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_POLICIES,
    DEFAULT_RESTART_COST,
    DEFAULT_SWEEP,
    POLICIES,
    OnDemandStream,
    SimConfig,
    TraceSimResult,
    comparison_caption,
    comparison_document,
    comparison_table,
    plot_tradeoff,
    read_swf,
    run_policies,
)
from resilient_flows.errors import InvalidJobError
from resilient_flows.units import duration_argument as _duration


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Add the ``cosim`` command to ``resilient-flows``' subcommands; its handler is :func:`run_cosim`."""
    text = "replay a job trace with on-demand requests under co-scheduling policies and compare them"
    cosim = commands.add_parser("cosim", help=text, description=text + ".")
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


def run_cosim(args: argparse.Namespace, out: Console | None = None) -> int:
    """Run the comparison that ``args`` describe, print the table, write ``--json`` and ``--plot``."""
    out = out or console()
    trace = read_swf(args.trace)
    base = _sim_config(args, args.nodes or trace.max_nodes)
    stream = OnDemandStream(
        rate_per_hour=args.ondemand_rate,
        nodes=args.ondemand_nodes,
        durations=args.ondemand_duration,
        mean_duration=args.ondemand_mean_duration,
        seed=args.seed,
    )
    policies = tuple(dict.fromkeys(args.policy or DEFAULT_POLICIES))
    jobs = [job for job in trace.jobs if args.until is None or job.submit_time < args.until]
    with out.status("simulating") as status:
        results = run_policies(jobs, base, policies, stream, args.ondemand_queue, status=status)
        sweep: list[TraceSimResult] = []
        if args.plot is not None:
            for policy in (p for p in policies if p not in BASELINES):
                for ratio in args.sweep:
                    config = replace(base, policy=policy, alpha=1.0, beta=ratio)
                    status.update(f"sweep: {policy} at beta/alpha = {ratio:g}")
                    sweep.extend(run_policies(jobs, config, (policy,), stream, args.ondemand_queue))
    out.print(comparison_table(results, comparison_caption(trace, len(jobs), results[0], stream)))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = comparison_document(trace, len(jobs), results, sweep, stream, args.ondemand_queue)
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        out.print(f"figures written to {args.json}")
    if args.plot is not None:
        plot_tradeoff(results, sweep, args.plot)
        out.print(f"trade-off plotted in {args.plot}")
    return 0 if all(r.metrics.jobs_finished == r.metrics.jobs_total for r in results) else 1


def _sim_config(args: argparse.Namespace, nodes: int | None) -> SimConfig:
    """The simulation's settings; the options that only make sense together are checked here."""
    if nodes is None:
        raise InvalidJobError(f"{args.trace}: the header gives no MaxNodes; pass --nodes")
    if (args.checkpoint_cost is None) != (args.mtbf is None):
        raise InvalidJobError("--checkpoint-cost and --mtbf: give both (Young's interval) or neither")
    if args.checkpoint_cost is not None and args.checkpoint_interval is not None:
        raise InvalidJobError("--checkpoint-interval: give it, or --checkpoint-cost and --mtbf, not both")
    return SimConfig(
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
