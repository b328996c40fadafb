"""Replay one trace under several policies and compare them: the work behind ``resilient-flows cosim``.

Every policy sees the same trace and the same on-demand stream, so that a row of the table differs
from another only by the policy. The plot sweeps ``beta / alpha`` for the policies whose choice
depends on it; the baselines preempt at once or never, which no weighting changes, so each is one
point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from rich.status import Status
from rich.table import Table

from resilient_flows.cosched._policies import BASELINES
from resilient_flows.cosched._simulator import METRIC_UNITS, OnDemandStream, SimConfig, TraceSimResult, simulate_trace
from resilient_flows.cosched._swf import SwfJob, SwfTrace

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


def run_policies(
    jobs: Sequence[SwfJob],
    base: SimConfig,
    policies: Sequence[str],
    stream: OnDemandStream,
    ondemand_queue: int | None = None,
    status: Status | None = None,
) -> list[TraceSimResult]:
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
        results.append(simulate_trace(jobs, replace(base, policy=policy), requests, ondemand_queue=ondemand_queue))
    return results


def plot_tradeoff(results: Sequence[TraceSimResult], sweep: Sequence[TraceSimResult], path: str | Path) -> None:
    """Mean on-demand wait against lost node-hours: a curve per swept policy, a point per baseline.

    The lower left is better; a sweep shows what each increment of ``beta / alpha`` buys in batch
    work saved for the on-demand wait it costs.
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.add_subplot()
    curves: dict[str, list[TraceSimResult]] = {}
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


def comparison_table(results: Sequence[TraceSimResult], caption: str) -> Table:
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


def comparison_caption(trace: SwfTrace, jobs: int, result: TraceSimResult, stream: OnDemandStream) -> str:
    """What was compared: the trace, the machine, the on-demand stream and the weights, for the table's foot."""
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


def comparison_document(
    trace: SwfTrace,
    jobs: int,
    results: Sequence[TraceSimResult],
    sweep: Sequence[TraceSimResult],
    stream: OnDemandStream,
    ondemand_queue: int | None,
) -> dict:
    """Every figure with its unit, and the settings that produced them, as JSON-ready data."""
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
            "trace_queue": ondemand_queue,
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


def _metrics(result: TraceSimResult) -> dict:
    return {name: _v(value, METRIC_UNITS[name]) for name, value in asdict(result.metrics).items()}


def _v(value: object, unit: str) -> dict:
    return {"value": value, "unit": unit}
