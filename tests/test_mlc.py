"""Checkpoint interval tuning: the formulas by hand, the simulator against Daly's model and a step-by-step
reference, the search against a dense grid, and the checks on inputs."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from resilient_flows.errors import ResilientFlowsError
from resilient_flows.mlc import (
    InvalidParameterError,
    MLCConfig,
    MLCParams,
    daly_interval,
    daly_wall_time,
    multilevel_optimum,
    optimal_interval,
    search,
    simulate,
    simulate_many,
    two_level_optimum,
    young_interval,
)
from resilient_flows.mlc.simulator import _Arrivals

EXAMPLE = MLCParams(
    l1_cost=10,
    l2_latency=300,
    l1_restart=10,
    l2_restart=300,
    l1_mtbf=6 * 3600,
    l2_mtbf=48 * 3600,
    solve_time=100 * 3600,
)


# ---------------------------------------------------------------- formulas


def test_young_and_daly_by_hand() -> None:
    # Young: sqrt(2 * 50 * 10000) = sqrt(1e6) = 1000
    assert young_interval(50, 10_000) == pytest.approx(1000.0, rel=1e-15)
    # Daly, C < 2M: sqrt(C / 2M) = sqrt(50 / 20000) = 0.05; C / 18M = 50 / 180000 = 2.777...e-4
    # 1000 * (1 + 0.05 / 3 + 2.777...e-4) - 50 = 1000 * 1.0169444... - 50 = 966.9444...
    assert daly_interval(50, 10_000) == pytest.approx(966.944444444, rel=1e-10)
    # Daly, C >= 2M: the MTBF itself
    assert daly_interval(300, 100) == 100.0
    # free checkpoints: take them all the time; no failures: never
    assert young_interval(0, 3600) == 0.0 and daly_interval(0, math.inf) == 0.0
    assert young_interval(10, math.inf) == math.inf and daly_interval(10, math.inf) == math.inf


def test_daly_wall_time_by_hand() -> None:
    # M e^(R/M) (e^((tau + C)/M) - 1) T_s / tau with tau=1000, C=50, R=100, M=10000, T_s=10000:
    # e^0.01 = 1.0100501671, e^0.105 - 1 = 0.1107106104
    # 10000 * 1.0100501671 * 0.1107106104 * 10 = 11182.32705
    assert daly_wall_time(1000, 50, 100, 10_000, 10_000) == pytest.approx(11182.32705, rel=1e-9)
    # no failures: T_s (tau + C) / tau = 10000 * 1050 / 1000 = 10500
    assert daly_wall_time(1000, 50, 100, math.inf, 10_000) == pytest.approx(10_500.0, rel=1e-15)
    # the exponent overflows: never finishes
    assert daly_wall_time(1e6, 50, 100, 10, 10_000) == math.inf


@pytest.mark.parametrize(
    ("cost", "restart", "mtbf"),
    [
        (10, 10, 6 * 3600),
        (50, 100, 10_000),
        (60, 120, 3600),
        (30, 60, 600),
        (10, 30, 60),
        (1e-3, 5, 86_400),
        (900, 0, 60),
    ],
)
def test_optimal_interval_minimises_daly_wall_time(cost: float, restart: float, mtbf: float) -> None:
    tau = optimal_interval(cost, restart, mtbf)
    # a fine scan on log tau, 1e-4 decades apart, around the optimum
    scan = tau * 10.0 ** np.linspace(-1, 1, 20_001)
    walls = np.array([daly_wall_time(x, cost, restart, mtbf, 1e6) for x in scan])
    assert scan[walls.argmin()] == pytest.approx(tau, rel=3e-4)
    assert daly_wall_time(tau, cost, restart, mtbf, 1e6) <= walls.min() * (1 + 1e-12)
    # the stationarity condition, (1 - tau/M) e^((tau + C)/M) = 1, holds to rounding (of 1 - tau/M, when tau ~ M)
    tol = 1e-12 * mtbf / (mtbf - tau)
    assert (1 - tau / mtbf) * math.exp((tau + cost) / mtbf) == pytest.approx(1.0, abs=tol)
    # the restart cost scales the wall time and does not move the optimum
    assert optimal_interval(cost, restart + 1000, mtbf) == tau
    # Daly's estimate is close to it when C << M
    if cost < 0.01 * mtbf:
        assert daly_interval(cost, mtbf) == pytest.approx(tau, rel=1e-3)


def test_optimal_interval_limits() -> None:
    assert optimal_interval(0, 10, 3600) == 0.0
    assert optimal_interval(10, 10, math.inf) == math.inf
    assert 0 < optimal_interval(1e9, 0, 1.0) <= 1.0  # C >> M: just below M


def test_two_level_optimum_by_hand() -> None:
    c = two_level_optimum(EXAMPLE)
    # L1 period sqrt(2 C1 / lambda1) = sqrt(2 * 10 * 21600) = sqrt(432000) = 657.267
    assert c.interval == pytest.approx(657.2670690, rel=1e-9)
    # L1 per L2: sqrt(lambda1 C2 / (lambda2 C1)) = sqrt((172800 / 21600) * (300 / 10)) = sqrt(8 * 30) = 15.49 -> 15
    assert c.l2_every == 15
    # overhead sqrt(2 * 10 / 21600) + sqrt(2 * 300 / 172800) = 0.0304290 + 0.0589256 = 0.0893546
    assert c.predicted_efficiency == pytest.approx(1 - 0.0893546, abs=1e-7)
    # one level: no L2 failures, no flushes; the interval is Young's
    one = two_level_optimum(MLCParams(l1_cost=10, l1_restart=10, l1_mtbf=21_600, solve_time=360_000))
    assert one.l2_every is None and one.interval == pytest.approx(657.2670690, rel=1e-9)
    # no failures at all: one checkpoint at the end
    none = two_level_optimum(MLCParams(l1_cost=10, l1_restart=10, l1_mtbf=math.inf, solve_time=3600))
    assert none.interval == 3600 and none.l2_every is None


def test_multilevel_optimum_by_hand() -> None:
    opt = multilevel_optimum([2, 20, 200], [1e-2, 1e-3, 1e-5])
    # periods sqrt(2 C / lambda): sqrt(400) = 20, sqrt(40000) = 200, sqrt(4e7) = 6324.555
    assert opt.periods == pytest.approx((20.0, 200.0, 6324.555320), rel=1e-9)
    # sqrt(1e-2 * 20 / (1e-3 * 2)) = sqrt(100) = 10; sqrt(1e-3 * 200 / (1e-5 * 20)) = sqrt(1000) = 31.6 -> 32
    assert opt.every == (10, 32)
    # sqrt(2 * 1e-2 * 2) + sqrt(2 * 1e-3 * 20) + sqrt(2 * 1e-5 * 200) = 0.2 + 0.2 + 0.0632456 = 0.4632456
    assert opt.overhead == pytest.approx(0.4632456, abs=1e-7)
    # a level whose failures never happen is never used
    assert multilevel_optimum([2, 20], [1e-2, 0]).every == (None,)


# ---------------------------------------------------------------- simulator


def test_no_failures_efficiency_is_exact() -> None:
    # every segment, the last included, ends with a committed checkpoint: 600 x (600 s + 10 s) = 366000 s
    p = MLCParams(l1_cost=10, l2_latency=300, l1_restart=10, l2_restart=300, l1_mtbf=math.inf, solve_time=360_000)
    for every in (None, 1, 7):
        r = simulate(p, MLCConfig(600, every), trials=20)
        assert r.efficiency == 600 / (600 + 10)
        assert r.wall_time == 366_000.0 and r.wall_time_ci == (366_000.0, 366_000.0)
        assert r.l1_failures == r.l2_failures == 0 and r.stopped == 0
    # a solve time that is not a multiple: ceil(1000 / 300) = 4 checkpoints
    q = MLCParams(l1_cost=10, l1_restart=0, l1_mtbf=math.inf, solve_time=1000)
    assert simulate(q, MLCConfig(300), trials=2).wall_time == 1040.0
    assert simulate(q, MLCConfig(5000), trials=2).wall_time == 1010.0  # longer than the job: one, at the end


@pytest.mark.parametrize(
    ("mtbf", "cost", "restart"),
    [(6 * 3600, 10, 10), (3600, 60, 120), (600, 30, 60), (60, 10, 30)],
    ids=["6h", "1h", "10min", "1min"],
)
def test_one_level_matches_daly(mtbf: float, cost: float, restart: float) -> None:
    # Daly's model is the simulator's one-level case (failures in checkpoints and restarts, R after
    # every failure), so they agree to sampling error when the interval divides the solve time.
    for tau in (optimal_interval(cost, restart, mtbf), 0.3 * optimal_interval(cost, restart, mtbf)):
        p = MLCParams(l1_cost=cost, l1_restart=restart, l1_mtbf=mtbf, solve_time=200 * tau)
        r = simulate(p, MLCConfig(tau), trials=10_000, seed=1)
        expected = daly_wall_time(tau, cost, restart, mtbf, p.solve_time)
        assert r.wall_time == pytest.approx(expected, rel=0.02)
        assert r.wall_time_ci[0] * 0.995 <= expected <= r.wall_time_ci[1] * 1.005
        assert r.stopped == 0


def _reference(p: MLCParams, c: MLCConfig, trials: int, seed: int) -> tuple[list[float], list[int], list[int]]:
    """The simulator's model played out one segment and one flush at a time, on the same failures."""
    arrivals = (_Arrivals(p.l1_mtbf, trials, seed, 1), _Arrivals(p.l2_mtbf, trials, seed, 2))

    def gap(level: int, trial: int, j: int) -> float:
        return float(arrivals[level].gap(np.array([trial]), np.array([j]))[0])

    nseg = max(1, math.ceil(p.solve_time / c.interval * (1 - 1e-12)))
    walls, fails1, fails2 = [], [], []
    for trial in range(trials):
        j = [0, 0]
        nf = [gap(0, trial, 0), gap(1, trial, 0)]
        t, k, l2, local, count, restart = 0.0, 0, 0, True, 0, None
        flight: tuple[float, int] | None = None  # (end, state)
        waiting: int | None = None
        failures = [0, 0]

        def settle(now: float) -> None:
            nonlocal flight, waiting, l2
            while flight is not None and flight[0] <= now:
                l2 = max(l2, flight[1])
                flight = (flight[0] + p.l2_latency, waiting) if waiting is not None else None
                waiting = None

        while True:
            seg = min(c.interval, p.solve_time - k * c.interval) if k < nseg - 1 else p.solve_time - k * c.interval
            end = t + (restart if restart is not None else seg + p.l1_cost)
            first = min(nf)
            if first >= end:
                t = end
                if restart is not None:
                    restart = None
                    continue
                k, count, local = k + 1, count + 1, True
                if k == nseg:
                    break
                settle(t)
                if c.l2_every and count % c.l2_every == 0:
                    if flight is None:
                        flight = (t + p.l2_latency, k)
                    else:
                        waiting = k
                continue
            t = first
            settle(t)
            flight, waiting, count = None, None, 0
            level = 0 if nf[0] < nf[1] else 1
            failures[level] += 1
            if level == 1:
                k, local, restart = l2, False, p.l2_restart
            else:
                restart = p.l1_restart if local else p.l2_restart
            j[level] += 1
            nf[level] += gap(level, trial, j[level])
        walls.append(t)
        fails1.append(failures[0])
        fails2.append(failures[1])
    return walls, fails1, fails2


@pytest.mark.parametrize(
    ("params", "config"),
    [
        (EXAMPLE, MLCConfig(600, 10)),
        (EXAMPLE, MLCConfig(600, None)),  # L2 failures roll back to the start
        # flushes asked for faster than they finish (3 x 130 s < 1001.7 s): one runs, the newest waits
        (MLCParams(l1_cost=10, l2_latency=1001.7, l1_restart=20, l2_restart=150, l1_mtbf=3000, l2_mtbf=5000,
                   solve_time=20_000), MLCConfig(120, 3)),
        # frequent lost nodes, often during restarts; a solve time that is not a multiple of the interval
        (MLCParams(l1_cost=7, l2_latency=95.3, l1_restart=40, l2_restart=400, l1_mtbf=1500, l2_mtbf=900,
                   solve_time=10_003), MLCConfig(170, 2)),
    ],
    ids=["example", "never-flush", "busy-flusher", "lost-nodes"],
)  # fmt: skip
def test_simulator_matches_step_by_step_reference(params: MLCParams, config: MLCConfig) -> None:
    trials = 30
    p = params if params is not EXAMPLE else MLCParams(**{**EXAMPLE.__dict__, "solve_time": 20 * 3600})
    r = simulate(p, config, trials=trials, seed=3)
    walls, fails1, fails2 = _reference(p, config, trials, seed=3)
    np.testing.assert_allclose(r.wall_times, walls, rtol=1e-9)
    assert r.l1_failures == np.mean(fails1) and r.l2_failures == np.mean(fails2)
    assert sum(fails2) > 0


def test_common_random_numbers() -> None:
    p = MLCParams(**{**EXAMPLE.__dict__, "solve_time": 20 * 3600})
    configs = [MLCConfig(600, 10), MLCConfig(900, 2), MLCConfig(450, None)]
    together = simulate_many(p, configs, trials=200, seed=5)
    alone = [simulate(p, c, trials=200, seed=5) for c in configs]
    for a, b in zip(together, alone, strict=True):
        np.testing.assert_array_equal(a.wall_times, b.wall_times)
    assert not np.array_equal(simulate(p, configs[0], trials=200, seed=6).wall_times, alone[0].wall_times)
    # the same failures: the first L1 failure arrives at the same time in every configuration, so a
    # trial whose first failure comes after the job would have finished is failure-free in both
    first = _Arrivals(p.l1_mtbf, 200, 5, 1).gap(np.arange(200), np.zeros(200, dtype=np.int64))
    first = np.minimum(first, _Arrivals(p.l2_mtbf, 200, 5, 2).gap(np.arange(200), np.zeros(200, dtype=np.int64)))
    for r in alone:
        clean = first > r.wall_times
        assert np.all(r.wall_times[clean] == r.wall_times.min())


def test_guard_stops_hopeless_jobs() -> None:
    # restart 100 s, MTBF 1 s: a restart succeeds with probability e^-100; never finishes
    p = MLCParams(l1_cost=1, l1_restart=100, l1_mtbf=1, solve_time=100)
    r = simulate(p, MLCConfig(10), trials=50, max_events=2000)
    assert r.stopped == 50 and r.efficiency < 0.1
    r = simulate(p, MLCConfig(10), trials=50, max_wall_factor=5)
    assert r.stopped == 50 and np.all(r.wall_times >= 500)


# ---------------------------------------------------------------- search


def test_search_beats_a_dense_grid() -> None:
    p = MLCParams(**{**EXAMPLE.__dict__, "solve_time": 50 * 3600})
    trials, seed = 200, 0
    best = search(p, trials=trials, seed=seed)
    found = simulate(p, best, trials=trials, seed=seed)
    assert best.predicted_efficiency == found.efficiency
    young = young_interval(p.l1_cost, 1 / (p.l1_rate + p.l2_rate))
    grid = [MLCConfig(tau, e) for tau in young * 10.0 ** np.linspace(-1, 1, 41) for e in (1, 2, 3, 4, 6, 10, 20, 50)]
    dense = max(r.efficiency for r in simulate_many(p, grid, trials=trials, seed=seed))
    # the same failures everywhere, so "at least as good" is meant to within rounding of the optimum
    assert found.efficiency >= dense - 2e-4
    # and better than the first-order formula, which flushes too rarely when flushes are free
    assert found.efficiency > simulate(p, two_level_optimum(p), trials=trials, seed=seed).efficiency


def test_search_cap_on_hopeless_candidates_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # lost nodes every 8 h and a day of compute: candidates that flush rarely roll back to the start
    # and are stopped early; the answer is the one found when every candidate runs in full
    p = MLCParams(
        l1_cost=30, l2_latency=600, l1_restart=60, l2_restart=600, l1_mtbf=2 * 3600, l2_mtbf=8 * 3600, solve_time=86_400
    )
    capped = search(p, trials=100)
    module = sys.modules["resilient_flows.mlc.search"]  # the package's `search` is the function
    monkeypatch.setattr(module._Search, "CAP_MARGIN", 1e12)
    assert search(p, trials=100) == capped


def test_search_one_level_and_no_failures() -> None:
    p = MLCParams(l1_cost=30, l1_restart=60, l1_mtbf=3600, solve_time=24 * 3600)
    best = search(p, trials=200)
    assert best.l2_every is None
    tau = optimal_interval(30, 60, 3600)
    # the simulator's optimum is Daly's optimum, up to the flat top of the curve
    assert best.interval == pytest.approx(tau, rel=0.25)
    exact = simulate(p, MLCConfig(tau), trials=200).efficiency
    assert best.predicted_efficiency >= exact - 1e-9
    calm = MLCParams(l1_cost=30, l1_restart=60, l1_mtbf=math.inf, solve_time=3600)
    assert search(calm) == MLCConfig(3600, None, predicted_efficiency=3600 / 3630)


# ---------------------------------------------------------------- inputs


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("l1_cost", -1, "l1_cost must be >= 0, got -1"),
        ("l2_latency", -0.5, "l2_latency must be >= 0"),
        ("l1_restart", math.nan, "l1_restart must be a number"),
        ("l2_restart", "ten", "l2_restart must be a number"),
        ("l1_mtbf", 0, "l1_mtbf must be > 0, got 0"),
        ("l2_mtbf", -3600, "l2_mtbf must be > 0"),
        ("solve_time", 0, "solve_time must be > 0"),
        ("solve_time", math.inf, "solve_time must be finite"),
    ],
)
def test_invalid_params_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message) as info:
        MLCParams(**{**EXAMPLE.__dict__, field: value})
    assert isinstance(info.value, ValueError) and isinstance(info.value, ResilientFlowsError)


def test_invalid_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="interval must be > 0, got 0"):
        MLCConfig(0)
    with pytest.raises(ValueError, match="interval must be > 0"):
        MLCConfig(-600, 10)
    with pytest.raises(ValueError, match="l2_every must be >= 1, got 0"):
        MLCConfig(600, 0)
    with pytest.raises(ValueError, match="l2_every must be a whole number"):
        MLCConfig(600, 2.5)
    with pytest.raises(ValueError, match="trials must be >= 1, got 0"):
        simulate(EXAMPLE, MLCConfig(600), trials=0)
    with pytest.raises(ValueError, match="trials must be >= 1"):
        search(EXAMPLE, trials=0)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        simulate(EXAMPLE, MLCConfig(600), seed=-1)
    with pytest.raises(ValueError, match="mtbf must be > 0, got 0"):
        young_interval(10, 0)
    with pytest.raises(ValueError, match="checkpoint_cost must be >= 0"):
        daly_interval(-1, 3600)
    with pytest.raises(ValueError, match="solve_time must be > 0"):
        daly_wall_time(600, 10, 10, 3600, 0)
    with pytest.raises(ValueError, match="restart_cost must be >= 0"):
        optimal_interval(10, -1, 3600)
    with pytest.raises(ValueError, match=r"rates\[1\] must be >= 0"):
        multilevel_optimum([1, 2], [0.1, -0.1])
    with pytest.raises(ValueError, match="l1_cost must be > 0"):
        two_level_optimum(MLCParams(l1_cost=0, l1_restart=10, l1_mtbf=3600, solve_time=3600))
    assert MLCConfig(np.int64(600), np.int64(3)).l2_every == 3
