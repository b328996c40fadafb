"""Closed-form checkpoint intervals: Young, Daly, the exact optimum of Daly's model, and first-order multi-level.

These answer in microseconds and are the baselines the simulator and the learned model are judged
against. What each one assumes:

- :func:`young_interval` (Young 1974) and :func:`daly_interval` (Daly 2006, the higher-order
  estimate) are expansions in ``C / M`` of the optimum for one level.
- :func:`daly_wall_time` is Daly's exact expected wall time for one level: failures arrive as a
  Poisson process of rate ``1 / M`` in wall-clock time and may strike during compute, during a
  checkpoint (which is then lost) and during a restart (which begins again); every failure costs
  the work since the newest checkpoint plus a restart ``R``; the job is ``T_s / tau`` segments of
  ``tau`` seconds of compute, each followed by a checkpoint of ``C`` seconds.
- :func:`optimal_interval` minimises that wall time exactly. ``R`` only scales it by
  ``exp(R / M)``, so the optimum does not depend on it. Setting the derivative to zero gives
  ``(1 - tau / M) * exp((tau + C) / M) = 1``, that is ``tau = M * (1 + W0(-exp(-1 - C / M)))`` with
  Lambert's ``W0``; it is solved here in the equivalent form ``y + log(1 - y) + C / M = 0``,
  ``y = tau / M`` in ``(0, 1)``, by safeguarded Newton steps, without SciPy.
- :func:`multilevel_optimum` is the first-order optimum of Benoit, Cavelan, Le Fèvre, Robert and
  Sun ("Towards optimal multi-level checkpointing", IEEE TC 2017): level ``l`` costs ``C_l`` and is
  needed after failures of rate ``lambda_l``; ``n_l`` checkpoints of level ``l`` per pattern are
  proportional to ``sqrt(lambda_l / C_l)``, so level ``l`` comes every ``sqrt(2 C_l / lambda_l)``
  seconds, and the overhead (fraction of the time wasted) is ``sum_l sqrt(2 lambda_l C_l)``.
  :func:`two_level_optimum` applies it to our two levels, :func:`three_level_optimum` to three.
- :func:`async_interval` is the first-order interval when checkpoints have a blocking part ``C``
  and a background part (the flush) of latency ``L`` that slows compute by a fraction ``s``.
  A flush that ends within its period costs ``s * L`` seconds of wall time, so each period of
  ``tau`` seconds of compute wastes ``C + s * L`` plus, on average, ``tau / 2`` of rework per
  failure. The waste per unit of time, ``(C + s L) / tau + tau / (2 M)``, is least at ``tau =
  sqrt(2 (C + s L) M)``, where it is ``sqrt(2 (C + s L) / M)``: Young's formula with the flush's
  interference added to the checkpoint's cost. Aupy, Benoit, Hérault, Robert and Dongarra
  ("Optimal checkpointing period: time vs. energy", PMBS 2013, arXiv:1310.8456) model a
  non-blocking checkpoint of duration ``C`` during which work goes on at rate ``omega``, and find,
  to first order, the period ``sqrt(2 (1 - omega) C M)``: the same with ``s = 1 - omega`` and no
  blocking part. The sum of both parts is derived here. LLNL's asynchronous multi-level
  checkpointing work (SCR project, "Asynchronous checkpointing research",
  computing.llnl.gov/projects/scr/asynchronous-checkpointing-research) is what the interference
  term stands for: the flush to the parallel file system competes with the application. The
  formula ignores a flush that outlasts its period (the writer then blocks) and the delay before a
  flush protects anything; :func:`async_optimum` applies it to a job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from resilient_flows.mlc._params import InvalidParameterError, MLCConfig, MLCParams, check_number


def young_interval(checkpoint_cost: float, mtbf: float) -> float:
    """Young's first-order checkpoint interval ``sqrt(2 * C * M)``, in seconds of compute.

    Parameters
    ----------
    checkpoint_cost:
        ``C``, seconds one checkpoint blocks compute (``>= 0``).
    mtbf:
        ``M``, mean time between failures (``> 0``; ``math.inf`` gives an infinite interval).

    Returns
    -------
    float
        0 when ``C`` is 0 (checkpoints are free: take them all the time).
    """
    c = check_number("checkpoint_cost", checkpoint_cost)
    m = check_number("mtbf", mtbf, positive=True, allow_inf=True)
    if c == 0:
        return 0.0
    return math.sqrt(2.0 * c * m)


def daly_interval(checkpoint_cost: float, mtbf: float) -> float:
    """Daly's higher-order estimate of the optimal checkpoint interval (Daly 2006, eq. 37).

    ``sqrt(2CM) * (1 + sqrt(C / (2M)) / 3 + C / (18M)) - C`` when ``C < 2M``, else ``M``.
    Parameters as for :func:`young_interval`.
    """
    c = check_number("checkpoint_cost", checkpoint_cost)
    m = check_number("mtbf", mtbf, positive=True, allow_inf=True)
    if c == 0:
        return 0.0
    if c >= 2.0 * m:
        return m
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(c / (2.0 * m)) / 3.0 + c / (18.0 * m)) - c


def daly_wall_time(
    interval: float, checkpoint_cost: float, restart_cost: float, mtbf: float, solve_time: float
) -> float:
    """Daly's expected wall time ``M * exp(R / M) * (exp((tau + C) / M) - 1) * T_s / tau`` for one level.

    Parameters
    ----------
    interval:
        ``tau``, seconds of compute between checkpoints (``> 0``; ``math.inf``: none).
    checkpoint_cost:
        ``C``, seconds one checkpoint blocks compute.
    restart_cost:
        ``R``, seconds to restart after each failure (the restart itself can fail and begins again).
    mtbf:
        ``M``, mean time between failures; with ``math.inf`` the result is ``T_s * (tau + C) / tau``.
    solve_time:
        ``T_s``, seconds of compute the job needs.

    Returns
    -------
    float
        Expected seconds of wall-clock time; ``math.inf`` when it overflows.
    """
    tau = check_number("interval", interval, positive=True, allow_inf=True)
    c = check_number("checkpoint_cost", checkpoint_cost)
    r = check_number("restart_cost", restart_cost)
    m = check_number("mtbf", mtbf, positive=True, allow_inf=True)
    ts = check_number("solve_time", solve_time, positive=True)
    if math.isinf(m):
        return ts * (1.0 + c / tau)
    exponent = (tau + c) / m
    if exponent + r / m > 700.0:  # exp() would overflow; the job practically never finishes
        return math.inf
    return m * math.exp(r / m) * math.expm1(exponent) * ts / tau


def optimal_interval(checkpoint_cost: float, restart_cost: float, mtbf: float) -> float:
    """The interval that minimises :func:`daly_wall_time` exactly (to about 1e-15 relative).

    The restart cost does not move the optimum (it scales the wall time by ``exp(R / M)``); it is
    taken, and checked, so that the three costs read as in Daly's model.

    Returns
    -------
    float
        ``tau = M * y`` with ``y + log(1 - y) + C / M = 0``; 0 when ``C`` is 0, ``math.inf`` when
        ``M`` is. Always below ``M``: a checkpoint never waits longer than the mean time to failure.
    """
    c = check_number("checkpoint_cost", checkpoint_cost)
    check_number("restart_cost", restart_cost)
    m = check_number("mtbf", mtbf, positive=True, allow_inf=True)
    if c == 0:
        return 0.0
    if math.isinf(m):
        return math.inf
    return m * _solve_stationary(c / m)


def _solve_stationary(ratio: float) -> float:
    """The root ``y`` in ``(0, 1)`` of ``h(y) = y + log(1 - y) + ratio``, ``ratio > 0``.

    ``h(0) = ratio > 0`` and ``h' = -y / (1 - y) < 0``: exactly one root. Newton steps from the
    series ``y ~ sqrt(2 ratio) - 2 ratio / 3`` (or from ``1 - exp(-1 - ratio)`` for large ratios),
    kept inside a bracket that shrinks with every evaluation.
    """
    if ratio > 700.0:  # 1 - y = exp(-1 - ratio - ...) underflows: y is 1 to double precision
        return 1.0
    lo, hi = 0.0, 1.0
    s = math.sqrt(2.0 * ratio)
    y = s - 2.0 * ratio / 3.0 if s < 0.5 else 1.0 - math.exp(-1.0 - ratio)
    if not lo < y < hi:
        y = 0.5
    for _ in range(200):
        h = _h(y, ratio)
        if h > 0:
            lo = y
        elif h < 0:
            hi = y
        else:
            return y
        step = h * (1.0 - y) / y  # -h / h'
        new = y + step
        if not lo < new < hi:
            new = 0.5 * (lo + hi)
        if abs(new - y) <= 1e-15 * y or hi - lo <= 1e-15 * hi:
            return new
        y = new
    return y


def _h(y: float, ratio: float) -> float:
    """``y + log(1 - y) + ratio``, without cancellation for small ``y`` (series ``-sum y^n / n``, ``n >= 2``)."""
    if y >= 0.1:
        return y + math.log1p(-y) + ratio
    total, term, n = 0.0, y, 1
    while True:
        n += 1
        term *= y
        total += term / n
        if term / n < 1e-18 * total:
            return ratio - total


class MultilevelOptimum(NamedTuple):
    """What :func:`multilevel_optimum` returns.

    ``periods[l]``: seconds of compute between two checkpoints of level ``l`` (``inf`` where no
    failure needs that level); ``every[l - 1]``: level-``(l - 1)`` checkpoints per level-``l`` one
    (each level-``l`` checkpoint is also one of every level below), ``None`` where level ``l`` is
    never needed; ``overhead``: the first-order fraction of wall time lost, ``sum sqrt(2 lambda C)``.
    """

    periods: tuple[float, ...]
    every: tuple[int | None, ...]
    overhead: float


def multilevel_optimum(costs: Sequence[float], rates: Sequence[float]) -> MultilevelOptimum:
    """First-order optimal multi-level pattern (Benoit et al. 2017).

    Parameters
    ----------
    costs:
        ``C_l``, the cost of a checkpoint of level ``l`` (seconds, ``>= 0``), cheapest level first.
    rates:
        ``lambda_l``, the rate of failures that need level ``l`` to recover (per second, ``>= 0``).

    Returns
    -------
    MultilevelOptimum
        Level ``l`` every ``sqrt(2 C_l / lambda_l)`` seconds; ``round(sqrt(lambda_{l-1} C_l /
        (lambda_l C_{l-1})))`` (at least 1) checkpoints of level ``l - 1`` per one of level ``l``.
    """
    if len(costs) != len(rates):
        raise InvalidParameterError(f"costs and rates must have the same length, got {len(costs)} and {len(rates)}")
    if not costs:
        raise InvalidParameterError("costs must name at least one level, got none")
    cs = [check_number(f"costs[{i}]", c) for i, c in enumerate(costs)]
    ls = [check_number(f"rates[{i}]", r) for i, r in enumerate(rates)]
    periods = tuple(math.inf if lam == 0 else math.sqrt(2.0 * c / lam) for c, lam in zip(cs, ls, strict=True))
    every: list[int | None] = []
    for level in range(1, len(cs)):
        below, above = ls[level - 1] * cs[level], ls[level] * cs[level - 1]
        if ls[level] == 0:
            every.append(None)
        elif above == 0:  # the level below is free or never needed: every one of its checkpoints goes up
            every.append(1)
        else:
            every.append(max(1, round(math.sqrt(below / above))))
    overhead = sum(math.sqrt(2.0 * lam * c) for c, lam in zip(cs, ls, strict=True))
    return MultilevelOptimum(periods, tuple(every), overhead)


def two_level_optimum(p: MLCParams) -> MLCConfig:
    """First-order optimum for our two levels: :func:`multilevel_optimum` with ``C_2 = l2_latency``.

    An L2 flush blocks nothing, so its cost in Benoit's sense is not time taken from compute. What
    it does cost is protection: a flush protects the state it started from only ``l2_latency``
    seconds later. We take that latency as ``C_2``, as the issue asks. This is a heuristic.
    Benoit's model charges ``C_2`` to every L2 checkpoint, so it flushes too rarely when flushes are
    free. :func:`~resilient_flows.mlc._search.search` gives the simulator's answer.

    Returns
    -------
    MLCConfig
        ``interval = sqrt(2 l1_cost l1_mtbf)`` (Young's interval for L1 failures), capped at
        ``solve_time``; ``l2_every`` rounded to an integer >= 1, or ``None`` when L2 failures never
        happen; ``predicted_efficiency = 1 - overhead`` (at least 0). When only L2 failures happen
        the model has one level: every L1 checkpoint is flushed, at Young's interval for
        ``l1_cost`` and ``l2_mtbf`` (the L1 checkpoint is what blocks compute).

    Raises
    ------
    InvalidParameterError
        ``l1_cost`` is 0 while failures happen: the first-order optimum checkpoints continuously.
    """
    opt = multilevel_optimum((p.l1_cost, p.l2_latency), (p.l1_rate, p.l2_rate))
    if p.l1_rate == 0 and p.l2_rate == 0:
        return MLCConfig(interval=p.solve_time, l2_every=None, predicted_efficiency=1.0 - _no_failure_waste(p))
    if p.l1_cost == 0:
        raise InvalidParameterError("l1_cost must be > 0 for a first-order optimum, got 0 (checkpoint continuously)")
    if p.l1_rate == 0:  # one level after all: L2, reached through L1 checkpoints, which are what blocks
        return MLCConfig(
            interval=min(young_interval(p.l1_cost, p.l2_mtbf), p.solve_time),
            l2_every=1,
            predicted_efficiency=max(0.0, 1.0 - math.sqrt(2.0 * p.l2_rate * p.l1_cost)),
        )
    return MLCConfig(
        interval=min(opt.periods[0], p.solve_time),
        l2_every=opt.every[0],
        predicted_efficiency=max(0.0, 1.0 - opt.overhead),
    )


def _no_failure_waste(p: MLCParams) -> float:
    """Fraction of wall time spent in the one checkpoint a failure-free job takes (at its end)."""
    return p.l1_cost / (p.solve_time + p.l1_cost)


def three_level_optimum(p: MLCParams) -> MLCConfig:
    """First-order optimum for three levels: :func:`multilevel_optimum` with ``C_2``, ``C_3`` the flush latencies.

    The same heuristic as :func:`two_level_optimum`: a flush's latency stands for its cost. When no
    failure needs L2, L3 checkpoints still go through it, so every L2 checkpoint goes on to L3 and
    ``l2_every`` comes from L1 against L3 alone.

    Raises
    ------
    InvalidParameterError
        ``p`` has no third level, or ``l1_cost`` is 0 while failures happen.
    """
    if not p.three_level:
        raise InvalidParameterError("three_level_optimum needs a third level (l3_mtbf), got none")
    if p.l1_cost == 0:
        raise InvalidParameterError("l1_cost must be > 0 for a first-order optimum, got 0 (checkpoint continuously)")
    lat2, lat3 = p.flush_latencies
    if p.l2_rate == 0:
        opt = multilevel_optimum((p.l1_cost, lat2 + lat3), (p.l1_rate, p.l3_rate))
        every, deep = opt.every[0], 1
    else:
        opt = multilevel_optimum((p.l1_cost, lat2, lat3), (p.l1_rate, p.l2_rate, p.l3_rate))
        every, deep = opt.every
    rate = p.l1_rate + p.l2_rate + p.l3_rate
    interval = opt.periods[0] if p.l1_rate > 0 else young_interval(p.l1_cost, 1.0 / rate)
    return MLCConfig(
        interval=min(interval, p.solve_time),
        l2_every=every or 1,
        predicted_efficiency=max(0.0, 1.0 - opt.overhead),
        l3_every=deep or 1,
    )


def async_interval(checkpoint_cost: float, flush_latency: float, slowdown: float, mtbf: float) -> float:
    """First-order interval ``sqrt(2 * (C + s * L) * M)`` for checkpoints with a slowing background flush.

    Parameters
    ----------
    checkpoint_cost:
        ``C``, seconds each checkpoint blocks compute.
    flush_latency:
        ``L``, seconds the background flush of each checkpoint takes.
    slowdown:
        ``s``, the fraction of compute speed lost while it runs, in ``[0, 1)``.
    mtbf:
        ``M``, mean time between failures (``math.inf`` gives an infinite interval).

    Returns
    -------
    float
        0 when ``C + s * L`` is 0 (checkpoints are free). See the module docstring for the derivation
        and the literature.
    """
    c = check_number("checkpoint_cost", checkpoint_cost)
    latency = check_number("flush_latency", flush_latency)
    s = check_number("slowdown", slowdown)
    if s >= 1:
        raise InvalidParameterError(f"slowdown must be in [0, 1), got {slowdown!r}")
    return young_interval(c + s * latency, mtbf)


def async_optimum(p: MLCParams) -> MLCConfig:
    """:func:`async_interval` for the job ``p``, every checkpoint flushed to every level.

    The failures are all failures (``1 / M`` the sum of the rates) and the flush is all of it, L2
    and L3 parts. Without failures that need a flush (two levels and no L2 failures) nothing is
    flushed and the interval is Young's. ``predicted_efficiency`` is ``1 - sqrt(2 (C + s L) / M)``
    (at least 0).
    """
    rate = p.l1_rate + p.l2_rate + p.l3_rate
    if rate == 0:
        return MLCConfig(interval=p.solve_time, l2_every=None, predicted_efficiency=1.0 - _no_failure_waste(p))
    flush = p.three_level or p.l2_rate > 0
    cost = p.l1_cost + (p.l2_slowdown * sum(p.flush_latencies) if flush else 0.0)
    interval = async_interval(p.l1_cost, sum(p.flush_latencies) if flush else 0.0, p.l2_slowdown, 1.0 / rate)
    return MLCConfig(
        interval=min(interval, p.solve_time) or p.solve_time * 1e-4,
        l2_every=1 if flush else None,
        predicted_efficiency=max(0.0, 1.0 - math.sqrt(2.0 * cost * rate)),
        l3_every=1 if p.three_level else None,
    )
