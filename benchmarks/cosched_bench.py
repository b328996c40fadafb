"""Co-scheduling: how fast ``"dp"`` decides, and what it saves over the baselines on Theta's month.

Decision latency (section ``decide``)
    Random machines of 4392 nodes (Theta's size) with ``m`` = 10, 100, 1000 running jobs: the busy
    nodes cut into ``m`` jobs at random points (every size 1 to thousands occurs, so the node
    counts share no divisor: the hardest case for the knapsack), 0 to 64 nodes free, started up to
    six hours ago, each checkpointing every 10 to 60 minutes with its newest checkpoint up to one
    interval old, restarting in 30 s to 5 min, expected to end in 1 minute to 6 hours; a request
    for 128, 256, 512 or 1024 nodes, ``alpha = beta = 1``, ``max_delay`` 30 minutes. Every policy
    decides the same instances, one after the other; the figure is the median time of one
    ``decide`` call. At ``m`` = 10 the exhaustive search (every subset at every candidate start)
    decides them too, and ``"dp"``'s cost must equal its cost on every instance; at every ``m``
    ``"dp"``'s cost must be at most every baseline's (``"wait"`` only where it waits no longer
    than ``max_delay``). Targets: median <= 5 ms at ``m`` = 100 and <= 50 ms at ``m`` = 1000.

Theta's month (section ``month``)
    ``../shared/traces/theta-2022-01.swf`` (3119 jobs on 4392 nodes) replayed once per policy by
    :func:`resilient_flows.cosched.simulate_trace`: FCFS with EASY backfilling, every batch job
    checkpointing hourly and restarting in 2 minutes, on-demand requests of 128 nodes for 30
    minutes arriving at 2 an hour (seeded: the same requests for every policy), ``alpha = beta =
    1``, ``max_delay`` 30 minutes. Then ``"dp"`` again with ``beta / alpha`` swept from 0.001 to
    100: its trade-off between the requests' mean wait and the batch work lost. "At equal
    on-demand wait" compares each baseline with ``"dp"``'s curve interpolated at the baseline's
    mean wait; the baselines that preempt at once wait 0 s, where ``"dp"`` is its point at the
    smallest ``beta / alpha`` (it, too, then waits almost never). ``"wait"`` waits longer than
    ``"dp"`` ever does (``max_delay``), so it has no such point: compare its row instead. Target: the whole month with
    ``"dp"`` in under 60 s here.

Run ``python benchmarks/cosched_bench.py [--quick | --full] [--json PATH] [--trace SWF]``.
``--quick`` (under a minute): 20 instances per ``m``, the month's first week, a 4-point sweep.
Default: 100 instances per ``m``, the whole month, an 8-point sweep. ``--full``: 300 instances
per ``m`` and all of the month's five siblings in ``../shared/traces`` (January to May).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import harness
import numpy as np
from harness import failed, options, size_of, write_json
from report import print_verdicts
from rich.table import Table

from resilient_flows.cosched import (
    BASELINES,
    OnDemandRequest,
    OnDemandStream,
    RunningJob,
    SimConfig,
    TraceSimResult,
    decide,
    read_swf,
    simulate_trace,
)

MACHINE = 4392
TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
SIZES = {"quick": (20, 7 * 86400.0, (0.01, 0.1, 1.0, 10.0)), "default": (100, None, None), "full": (300, None, None)}
SWEEP = (0.001, 0.01, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)
TARGET_MS = {100: 5.0, 1000: 50.0}
MONTH_TARGET_S = 60.0


def instance(m: int, rng: random.Random) -> dict[str, Any]:
    """One random machine state with ``m`` running jobs (see the module docstring)."""
    now = 86400.0
    free = rng.randint(0, 64)
    busy = MACHINE - free
    cuts = sorted(rng.sample(range(1, busy), m - 1))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, busy], strict=True)]
    jobs = []
    for j, nodes in enumerate(sizes):
        start = now - rng.uniform(0, 6 * 3600)
        interval = rng.uniform(600, 3600)
        last = max(start, now - rng.uniform(0, interval))
        end = now + rng.uniform(60, 6 * 3600)
        jobs.append(RunningJob(f"j{j}", nodes, start, end, last, interval, rng.uniform(30, 300)))
    request = OnDemandRequest(rng.choice([128, 256, 512, 1024]), now, 1800.0)
    return {"now": now, "free_nodes": free, "running": jobs, "request": request, "max_delay": 1800.0}


def measure_decisions(count: int, seed: int = 0) -> tuple[dict[str, float], list[str]]:
    """Median latency per (policy, m); the exactness checks that failed, if any."""
    figures: dict[str, float] = {}
    problems: list[str] = []
    rng = random.Random(seed)
    for m in (10, 100, 1000):
        policies = ["dp", *BASELINES] + (["exhaustive"] if m <= 10 else [])
        times: dict[str, list[float]] = {p: [] for p in policies}
        for i in range(count):
            problem = instance(m, rng)
            costs = {}
            for policy in policies:
                started = time.perf_counter()
                decision = decide(policy, **problem, seed=i)
                times[policy].append(time.perf_counter() - started)
                costs[policy] = decision
            best = costs["dp"].cost
            if "exhaustive" in costs and abs(best - costs["exhaustive"].cost) > 1e-9 * max(1.0, best):
                problems.append(f"m={m} instance {i}: dp {best} != exhaustive {costs['exhaustive'].cost}")
            for policy in BASELINES:
                if policy == "wait" and costs[policy].delay > problem["max_delay"]:
                    continue
                if best > costs[policy].cost * (1 + 1e-12) + 1e-9:
                    problems.append(f"m={m} instance {i}: dp {best} > {policy} {costs[policy].cost}")
        for policy, samples in times.items():
            figures[f"decide_{policy}_m{m}_ms"] = 1000 * statistics.median(samples)
        if "exhaustive" in times:
            figures[f"exhaustive_over_dp_m{m}"] = figures[f"decide_exhaustive_m{m}_ms"] / figures[f"decide_dp_m{m}_ms"]
    return figures, problems


def simulate_month(trace: Path, until: float | None, sweep: tuple[float, ...]) -> tuple[list[TraceSimResult], list]:
    swf = read_swf(trace)
    jobs = [j for j in swf.jobs if until is None or j.submit_time < until]
    submits = [j.submit_time for j in jobs]
    requests = OnDemandStream(rate_per_hour=2.0, nodes=(128,), durations=(1800.0,), seed=0).requests(
        min(submits), max(submits)
    )
    base = SimConfig(nodes=swf.max_nodes or MACHINE, alpha=1.0, beta=1.0, max_delay=1800.0, seed=0)
    results = [simulate_trace(jobs, replace(base, policy=p), requests) for p in ("dp", *BASELINES)]
    curve = [(ratio, simulate_trace(jobs, replace(base, beta=ratio), requests)) for ratio in sweep]
    return results, curve


def lost_at_equal_wait(curve: list, wait: float) -> float | None:
    """``"dp"``'s lost node-hours interpolated at mean wait ``wait`` along its sweep.

    Below the sweep's smallest wait (a baseline that never waits), its least-waiting point, whose
    wait the sweep table shows; above its largest, None.
    """
    points = sorted((r.metrics.wait_mean, r.metrics.lost_node_hours) for _, r in curve)
    waits = np.array([p[0] for p in points])
    if wait > waits[-1]:
        return None
    return float(np.interp(wait, waits, [p[1] for p in points]))


def month_figures(name: str, results: list[TraceSimResult], curve: list) -> tuple[dict[str, float], list[list[str]]]:
    figures: dict[str, float] = {}
    rows = []
    dp = results[0]
    figures[f"{name}_dp_seconds"] = dp.metrics.elapsed
    for result in results:
        m, policy = result.metrics, result.config.policy
        for key in ("wait_mean", "wait_p95", "lost_node_hours", "objective", "bounded_slowdown", "utilization"):
            figures[f"{name}_{policy}_{key}"] = getattr(m, key)
        figures[f"{name}_{policy}_finished"] = m.jobs_finished / m.jobs_total
        lost_dp = lost_at_equal_wait(curve, m.wait_mean)
        row = [
            policy,
            f"{m.wait_mean:.0f}",
            f"{m.wait_p95:.0f}",
            f"{m.lost_node_hours:,.0f}",
            f"{m.objective:,.0f}",
            f"{m.bounded_slowdown:.1f}",
            f"{m.utilization:.3f}",
            f"{m.elapsed:.2f}",
        ]
        if policy != "dp":
            objective_ratio = m.objective / dp.metrics.objective
            figures[f"{name}_{policy}_objective_over_dp"] = objective_ratio
            row.append(f"{objective_ratio:.2f}x")
            if lost_dp:
                lost_ratio = m.lost_node_hours / lost_dp
                figures[f"{name}_{policy}_lost_over_dp_at_equal_wait"] = lost_ratio
                row.append(f"{lost_ratio:.2f}x")
            else:
                row.append("-")
        else:
            row += ["1.00x", "1.00x"]
        rows.append(row)
    for ratio, result in curve:
        figures[f"{name}_sweep_{ratio:g}_wait_mean"] = result.metrics.wait_mean
        figures[f"{name}_sweep_{ratio:g}_lost_node_hours"] = result.metrics.lost_node_hours
    return figures, rows


UNITS = {
    "_ms": "ms",
    "_seconds": "s",
    "wait_mean": "s",
    "wait_p95": "s",
    "lost_node_hours": "node-h",
    "objective": "node-h",
    "bounded_slowdown": "1",
    "utilization": "1",
    "finished": "1",
    "_over_": "ratio",
}


def unit_of(key: str) -> str:
    return next((unit for suffix, unit in UNITS.items() if key.endswith(suffix) or suffix in key), "1")


def main(argv: list[str] | None = None) -> int:
    parser, _ = options(
        __doc__, quick="under a minute: 20 instances, one week", full="300 instances per m, all five months"
    )
    parser.add_argument("--trace", type=Path, help="an SWF trace (default: Theta, January 2022)")
    parser.add_argument("--json", type=Path, help="write every figure with its unit")
    args = parser.parse_args(argv)
    size = size_of(args)
    count, until, sweep = SIZES[size]
    sweep = sweep or SWEEP
    console = harness.console(140)

    figures, problems = measure_decisions(count)
    table = Table(title=f"decide: median ms per call, {count} random instances per m on {MACHINE} nodes")
    table.add_column("policy")
    for m in (10, 100, 1000):
        table.add_column(f"m = {m}", justify="right")
    for policy in ("dp", "exhaustive", *BASELINES):
        table.add_row(policy, *(_ms(figures.get(f"decide_{policy}_m{m}_ms")) for m in (10, 100, 1000)))
    console.print(table)
    console.print(f"exhaustive / dp at m = 10: {figures['exhaustive_over_dp_m10']:.1f}x the time, the same cost")
    verdicts = {
        f"dp median at m = {m} <= {limit} ms": figures[f"decide_dp_m{m}_ms"] <= limit for m, limit in TARGET_MS.items()
    }
    verdicts["dp exact (= exhaustive) and never costlier than a baseline"] = not problems
    for problem in problems[:10]:
        console.print(f"[red]{problem}[/]")

    traces = [args.trace] if args.trace else sorted(TRACES.glob("theta-2022-*.swf"))
    if not args.full and not args.trace:
        traces = traces[:1]
    if not traces:
        console.print(f"no trace in {TRACES}: the month section is skipped")
    for trace in traces:
        name = trace.stem
        results, curve = simulate_month(trace, until, sweep)
        month, rows = month_figures(name, results, curve)
        figures.update(month)
        span = "first week" if until else "whole trace"
        table = Table(title=f"{name} ({span}, {results[0].metrics.jobs_total} jobs, 2 requests/h of 128 nodes)")
        for column in ("policy", "wait mean s", "wait p95 s", "lost node-h", "objective node-h", "bsld", "util"):
            table.add_column(column, justify="left" if column == "policy" else "right")
        for column in ("sim s", "objective / dp", "lost / dp at equal wait"):
            table.add_column(column, justify="right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
        sweep_table = Table(title=f"{name}: dp across beta / alpha")
        for column in ("beta / alpha", "wait mean s", "lost node-h", "preemptions"):
            sweep_table.add_column(column, justify="right")
        for ratio, result in curve:
            m = result.metrics
            sweep_table.add_row(f"{ratio:g}", f"{m.wait_mean:.0f}", f"{m.lost_node_hours:,.0f}", str(m.preemptions))
        console.print(sweep_table)
        fast = month[f"{name}_dp_seconds"] <= MONTH_TARGET_S
        verdicts[f"{name}: dp simulates it in <= {MONTH_TARGET_S:.0f} s"] = fast
        verdicts[f"{name}: every job finishes under every policy"] = all(
            r.metrics.jobs_finished == r.metrics.jobs_total for r in results
        )

    print_verdicts(console, verdicts)
    if args.json:
        document = {
            "size": size,
            "figures": {k: {"value": v, "unit": unit_of(k)} for k, v in figures.items()},
            "verdicts": verdicts,
            "problems": problems,
        }
        write_json(args.json, document, indent=2, allow_nan=False)
        console.print(f"figures written to {args.json}")
    return int(failed(verdicts))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())
