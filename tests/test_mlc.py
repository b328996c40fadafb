"""Checkpoint interval tuning: the formulas by hand, the simulator against Daly's model, a step-by-step
reference and failure-free schedules worked out by hand, the search against a dense grid and under
objectives, and the checks on inputs."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from resilient_flows.cli import main
from resilient_flows.errors import ResilientFlowsError
from resilient_flows.mlc import (
    InvalidParameterError,
    MLCConfig,
    MLCParams,
    Objective,
    async_interval,
    async_optimum,
    daly_interval,
    daly_wall_time,
    multilevel_optimum,
    optimal_interval,
    search,
    simulate_failures,
    simulate_failures_many,
    two_level_optimum,
    young_interval,
)
from resilient_flows.mlc._simulator import FailureArrivals

EXAMPLE = MLCParams(
    l1_cost=10,
    l2_latency=300,
    l1_restart=10,
    l2_restart=300,
    l1_mtbf=6 * 3600,
    l2_mtbf=48 * 3600,
    solve_time=100 * 3600,
)
GIB = 2**30
#: 64 GiB per node from 1024 nodes through a 250 GB/s file system: a flush takes 281 s
REALISTIC = MLCParams(
    l1_cost=10,
    l1_restart=30,
    l1_mtbf=6 * 3600,
    solve_time=24 * 3600,
    l2_restart=600,
    l2_mtbf=48 * 3600,
    l2_slowdown=0.2,
    checkpoint_bytes=64 * GIB,
    nodes=1024,
    pfs_bandwidth=250e9,
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


def test_async_interval_by_hand() -> None:
    # sqrt(2 * (10 + 0.2 * 300) * 21600) = sqrt(3024000) = 1738.9652
    assert async_interval(10, 300, 0.2, 21_600) == pytest.approx(1738.965210, rel=1e-9)
    assert async_interval(10, 300, 0.0, 21_600) == young_interval(10, 21_600)  # no interference: Young
    c = async_optimum(REALISTIC)
    # C + s L = 10 + 0.2 * 281.475 = 66.295; 1 / M = 1 / 21600 + 1 / 172800 = 1 / 19200
    assert c.interval == pytest.approx(math.sqrt(2 * 66.294995 * 19_200), rel=1e-6) and c.l2_every == 1
    assert c.predicted_efficiency == pytest.approx(1 - math.sqrt(2 * 66.294995 / 19_200), rel=1e-6)


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
        r = simulate_failures(p, MLCConfig(600, every), trials=20)
        assert r.efficiency == 600 / (600 + 10)
        assert r.wall_time == 366_000.0 and r.wall_time_ci == (366_000.0, 366_000.0)
        assert r.l1_failures == r.l2_failures == 0 and r.stopped == 0
    # a solve time that is not a multiple: ceil(1000 / 300) = 4 checkpoints
    q = MLCParams(l1_cost=10, l1_restart=0, l1_mtbf=math.inf, solve_time=1000)
    assert simulate_failures(q, MLCConfig(300), trials=2).wall_time == 1040.0
    assert simulate_failures(q, MLCConfig(5000), trials=2).wall_time == 1010.0  # longer than the job: one, at the end


def test_no_failures_a_slow_node_local_write_delays_every_checkpoint_and_the_last_commit() -> None:
    # 130 s writes behind 100 s segments: each checkpoint waits 30 s, and the job ends when the
    # tenth is written: 10 x (100 + 10 + 30) + 130 = 1530 s
    p = _calm(l1_latency=130)
    assert p.checkpoint_cost(100) == 40
    r = simulate_failures(p, MLCConfig(100), trials=2)
    assert r.wall_time == 1530.0 and r.efficiency == 1000 / 1530
    # a write shorter than a segment costs nothing but the wait for the last one: 10 x 110 + 60
    assert simulate_failures(_calm(l1_latency=60), MLCConfig(100, 1), trials=2).wall_time == 1160.0


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
        r = simulate_failures(p, MLCConfig(tau), trials=10_000, seed=1)
        expected = daly_wall_time(tau, cost, restart, mtbf, p.solve_time)
        assert r.wall_time == pytest.approx(expected, rel=0.02)
        assert r.wall_time_ci[0] * 0.995 <= expected <= r.wall_time_ci[1] * 1.005
        assert r.stopped == 0


def _reference(p: MLCParams, c: MLCConfig, trials: int, seed: int) -> tuple[list[float], list[int], list[int]]:
    """The simulator's model played out one segment and one flush at a time, on the same failures.

    Flushes are kept as a list of jobs (start, end of the L2 part, end of the L3 part or None,
    state) in the order the one flusher runs them; a request made while the previous one has not
    started yet (it waits in the one-slot queue) blocks the writer until it starts. ``copies`` holds
    when each checkpoint of the run was copied: it counts ``l1_latency`` later.
    """
    arrivals = [FailureArrivals(m, trials, seed, level) for level, m in enumerate((p.l1_mtbf, p.l2_mtbf, p.l3_mtbf), 1)]
    lat2, lat3 = p.flush_latencies
    slow = p.l2_slowdown

    def gap(level: int, trial: int, j: int) -> float:
        return float(arrivals[level].gap(np.array([trial]), np.array([j]))[0])

    nseg = max(1, math.ceil(p.solve_time / c.interval * (1 - 1e-12)))
    cost = p.l1_cost + max(0.0, p.l1_latency - min(c.interval, p.solve_time))
    walls, fails1, fails2 = [], [], []
    for trial in range(trials):
        j = [0, 0, 0]
        nf = [gap(level, trial, 0) for level in range(3)]
        t, k, local, restart, rfar = 0.0, 0, True, None, p.l2_restart
        l2 = l3 = 0
        far = False  # the newest state safe from L2 failures is only in L3
        count = sent = 0
        jobs: list[tuple[float, float, float | None, int]] = []
        copies: list[float] = []
        failures = [0, 0, 0]
        while True:
            first = min(nf)
            if restart is not None:
                if first >= t + restart:
                    t, restart, count, sent, jobs, copies = t + restart, None, 0, 0, [], []
                    continue
            else:
                seg = min(c.interval, p.solve_time - k * c.interval) if k < nseg - 1 else p.solve_time - k * c.interval
                busy = max([0.0] + [(job[2] or job[1]) - t for job in jobs])
                end = t + seg + slow * min(seg / (1 - slow), busy) + cost
                if first >= end + (p.l1_latency if k == nseg - 1 else 0.0):
                    t, k, count = end, k + 1, count + 1
                    copies.append(end)
                    if k == nseg:
                        t += p.l1_latency
                        break
                    if c.l2_every and count % c.l2_every == 0:
                        sent += 1
                        deep = bool(c.l3_every) and sent % c.l3_every == 0
                        if jobs and jobs[-1][0] > t:  # the slot is taken: wait until it frees
                            t = jobs[-1][0]
                        begin = max([t] + [job[2] or job[1] for job in jobs])
                        jobs.append((begin, begin + lat2, begin + lat2 + lat3 if deep else None, k))
                    continue
            t = first
            written = sum(1 for copied in copies if copied + p.l1_latency <= t)
            k -= len(copies) - written
            local = local or written > 0
            for _, end2, end3, state in jobs:
                if end2 <= t and state >= l2:
                    l2, far = state, False
                if end3 is not None and end3 <= t:
                    l3 = max(l3, state)
            level = int(np.argmin(nf))  # ties: the lower level, as the simulator
            failures[level] += 1
            if level == 2:
                k, l2, far, local, restart, rfar = l3, l3, True, False, p.l3_restart, p.l3_restart
            elif level == 1:
                restart = p.l3_restart if far else p.l2_restart
                k, local, rfar = l2, False, restart
            else:
                restart = p.l1_restart if local else rfar
            count, sent, jobs, copies = 0, 0, [], []
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
        # flushes asked for faster than they finish (3 x 130 s < 1001.7 s): one runs, one waits, the writer blocks
        (MLCParams(l1_cost=10, l2_latency=1001.7, l1_restart=20, l2_restart=150, l1_mtbf=3000, l2_mtbf=5000,
                   solve_time=20_000), MLCConfig(120, 3)),
        # frequent lost nodes, often during restarts; a solve time that is not a multiple of the interval
        (MLCParams(l1_cost=7, l2_latency=95.3, l1_restart=40, l2_restart=400, l1_mtbf=1500, l2_mtbf=900,
                   solve_time=10_003), MLCConfig(170, 2)),
        # flushes slow compute; one flush ends within its period
        (MLCParams(l1_cost=8, l2_latency=140, l1_restart=20, l2_restart=150, l1_mtbf=2500, l2_mtbf=4000,
                   solve_time=15_000, l2_slowdown=0.35), MLCConfig(110, 2)),
        # ... and flushes fall behind: the writer blocks, slowed all along
        (MLCParams(l1_cost=5, l1_restart=20, l1_mtbf=3000, l2_mtbf=3500, l2_restart=100, solve_time=12_000,
                   l2_slowdown=0.5, checkpoint_bytes=4e11, nodes=8, pfs_bandwidth=1e10), MLCConfig(60, 1)),
        # three levels: partner copies every 2nd checkpoint, every 3rd of those to the file system
        (MLCParams(l1_cost=6, l2_latency=40, l1_restart=15, l2_restart=60, l1_mtbf=2000, l2_mtbf=3000,
                   l3_latency=260, l3_restart=300, l3_mtbf=5000, solve_time=12_000, l2_slowdown=0.25),
         MLCConfig(90, 2, l3_every=3)),
        # three levels whose L3 flushes outlast their period
        (MLCParams(l1_cost=4, l2_latency=70, l1_restart=10, l2_restart=50, l1_mtbf=1800, l2_mtbf=2500,
                   l3_latency=500, l3_restart=400, l3_mtbf=4000, solve_time=9_000), MLCConfig(50, 1, l3_every=2)),
        # node-local writes of 160 s behind 100 s segments: each checkpoint waits 60 s for the one
        # before; a crash within 160 s of a copy finds that checkpoint unwritten
        (MLCParams(l1_cost=6, l1_latency=160, l2_latency=230, l1_restart=25, l2_restart=120, l1_mtbf=900,
                   l2_mtbf=4000, solve_time=8_000, l2_slowdown=0.2), MLCConfig(100, 2)),
        # ... and shorter than a segment: only the commit is later
        (MLCParams(l1_cost=6, l1_latency=40, l2_latency=90, l1_restart=25, l2_restart=120, l1_mtbf=700,
                   l2_mtbf=3000, solve_time=8_000), MLCConfig(130, 1)),
    ],
    ids=["example", "never-flush", "busy-flusher", "lost-nodes", "slowdown", "slowdown-blocked", "three-level",
         "three-level-blocked", "slow-local-write", "local-write-lag"],
)  # fmt: skip
def test_simulator_matches_step_by_step_reference(params: MLCParams, config: MLCConfig) -> None:
    trials = 30
    p = params if params is not EXAMPLE else MLCParams(**{**EXAMPLE.__dict__, "solve_time": 20 * 3600})
    r = simulate_failures(p, config, trials=trials, seed=3)
    walls, fails1, fails2 = _reference(p, config, trials, seed=3)
    np.testing.assert_allclose(r.wall_times, walls, rtol=1e-9)
    assert r.l1_failures == np.mean(fails1) and r.l2_failures == np.mean(fails2)
    assert sum(fails2) > 0


def _calm(**fields: float) -> MLCParams:
    """A failure-free job of ten 100 s segments with 10 s checkpoints, and the flush in ``fields``."""
    return MLCParams(**{"l1_cost": 10, "l1_restart": 0, "l1_mtbf": math.inf, "solve_time": 1000, **fields})


@pytest.mark.parametrize(
    ("params", "config", "wall"),
    [
        # 600 s segments, a 300 s flush after each: the first segment runs alone; in each later one
        # the flush slows 300 s of compute by 0.2, 60 s each: 10 x 610 + 9 x 60 = 6640
        (MLCParams(l1_cost=10, l1_restart=0, l1_mtbf=math.inf, solve_time=6000, l2_latency=300, l2_slowdown=0.2),
         MLCConfig(600, 1), 6640.0),
        # the same flush from bytes: 3e11 B at 1e10 B/s shared by 10 nodes is 300 s
        (MLCParams(l1_cost=10, l1_restart=0, l1_mtbf=math.inf, solve_time=6000, l2_slowdown=0.2,
                   checkpoint_bytes=3e11, nodes=10, pfs_bandwidth=1e10), MLCConfig(600, 1), 6640.0),
        # a 150 s flush every 2nd checkpoint, slowdown 0.5: it overlaps 150 s of compute (the first
        # segment's, stretched to 200 s), 75 s lost per pair of segments after the first pair:
        # 10 x 110 + 4 x 75 = 1400
        (_calm(l2_latency=150, l2_slowdown=0.5), MLCConfig(100, 2), 1400.0),
        # flushes of 250 s asked for every 110 s, no slowdown. Requests at 110 (runs to 360), 220
        # (waits in the slot, runs 360-610), 330: the slot is taken, the writer blocks until 360, then
        # every request blocks until the flush ahead of it starts, 250 s after the previous one:
        # resumes at 360, 610, ..., 1860 after the 9th; the 10th segment commits at 1970
        (_calm(l2_latency=250), MLCConfig(100, 1), 1970.0),
        # the same with slowdown 0.5: every segment after the first takes 210 s; the writer first
        # blocks at the 8th request (at 1580, the 7th flush starts at 1610), then at 1860; 1860 + 210
        (_calm(l2_latency=250, l2_slowdown=0.5), MLCConfig(100, 1), 2070.0),
    ],
    ids=["slowdown", "slowdown-from-bytes", "every-2nd", "blocked", "blocked-slowdown"],
)  # fmt: skip
def test_no_failures_efficiency_with_slowdown_and_blocking_is_exact(
    params: MLCParams, config: MLCConfig, wall: float
) -> None:
    r = simulate_failures(params, config, trials=3)
    np.testing.assert_allclose(r.wall_times, wall, rtol=1e-12)
    segments = params.solve_time / config.interval
    slowdown_cost = (wall - segments * (config.interval + params.l1_cost)) / segments
    expected = config.interval / (config.interval + params.l1_cost + slowdown_cost)
    assert r.efficiency == pytest.approx(expected, rel=1e-12)


def test_a_full_flush_queue_blocks_the_writer() -> None:
    # l2_every * (interval + l1_cost) = 110 s < 250 s of flush: the old shortcut (a newer request
    # replaced the waiting one) never delayed compute, 10 x 110 s; the one-slot queue does
    p = _calm(l2_latency=250)
    assert simulate_failures(p, MLCConfig(100, 1), trials=2).wall_time == 1970.0
    assert simulate_failures(p, MLCConfig(100, None), trials=2).wall_time == 1100.0
    assert simulate_failures(p, MLCConfig(100, 3), trials=2).wall_time == 1100.0  # 330 s >= 250 s: never blocks


def test_traffic_counts_the_flushes_that_reach_the_shared_tier() -> None:
    p = MLCParams(l1_cost=10, l1_restart=0, l1_mtbf=math.inf, solve_time=6000, l2_slowdown=0.2,
                  checkpoint_bytes=3e11, nodes=10, pfs_bandwidth=1e10)  # fmt: skip
    r = simulate_failures(p, MLCConfig(600, 1), trials=2)
    # nine flushes (the tenth checkpoint ends the job) of 3e11 B in 6640 s
    assert r.shared_flushes == 9 and r.traffic == pytest.approx(9 * 3e11 / 6640 * 3600, rel=1e-12)
    assert simulate_failures(EXAMPLE, MLCConfig(600, 1), trials=2).traffic is None  # a latency, not bytes


def test_new_fields_at_their_defaults_reproduce_the_old_model_exactly() -> None:
    # mean wall times and failures of the two-level model before flush interference, blocking and
    # the third level existed (same seed, same trials): nothing may move, not even in the last bit
    example = MLCParams(**{**EXAMPLE.__dict__, "solve_time": 20 * 3600})
    lost = MLCParams(l1_cost=7, l2_latency=95.3, l1_restart=40, l2_restart=400, l1_mtbf=1500, l2_mtbf=900,
                     solve_time=10_003)  # fmt: skip
    old = [
        (example, MLCConfig(600, 10), 76062.23045694282, 3.175, 0.4),
        (example, MLCConfig(600, None), 92364.59594970937, 3.845, 0.495),
        (example, MLCConfig(450, 1), 74685.27907200325, 3.115, 0.4),
        (lost, MLCConfig(170, 2), 26969.829364881796, 17.395, 29.445),
    ]
    explicit = {"l2_slowdown": 0.0, "checkpoint_bytes": 0.0, "nodes": 1, "node_bandwidth": math.inf,
                "pfs_bandwidth": math.inf, "l3_latency": 0.0, "l3_restart": 0.0, "l3_mtbf": math.inf}  # fmt: skip
    for p, c, wall, f1, f2 in old:
        for params in (p, MLCParams(**{**p.__dict__, **explicit})):
            r = simulate_failures(params, c, trials=200, seed=7)
            assert (r.wall_time, r.l1_failures, r.l2_failures, r.l3_failures) == (wall, f1, f2, 0.0)


def test_three_levels_without_upper_failures_equal_two_levels() -> None:
    # no L2 failures and L3 failures that never come: only the flushes' cost is left, and a flush
    # of l2_latency then l3_latency is one flush of their sum (here it falls behind and blocks)
    common = {"l1_cost": 5, "l1_restart": 20, "l1_mtbf": 900, "solve_time": 8000, "l2_slowdown": 0.3}
    three = MLCParams(**common, l2_latency=40, l3_latency=95, l3_restart=100, l3_mtbf=1e300)
    two = MLCParams(**common, l2_latency=40 + 95)
    for config in (MLCConfig(60, 1), MLCConfig(45, 3)):
        deep = MLCConfig(config.interval, config.l2_every, l3_every=1)
        r3, r2 = simulate_failures(three, deep, trials=50, seed=2), simulate_failures(two, config, trials=50, seed=2)
        np.testing.assert_array_equal(r3.wall_times, r2.wall_times)
        assert r3.l3_failures == 0 and r3.l1_failures == r2.l1_failures > 0


def test_common_random_numbers() -> None:
    p = MLCParams(**{**EXAMPLE.__dict__, "solve_time": 20 * 3600})
    configs = [MLCConfig(600, 10), MLCConfig(900, 2), MLCConfig(450, None)]
    together = simulate_failures_many(p, configs, trials=200, seed=5)
    alone = [simulate_failures(p, c, trials=200, seed=5) for c in configs]
    for a, b in zip(together, alone, strict=True):
        np.testing.assert_array_equal(a.wall_times, b.wall_times)
    assert not np.array_equal(simulate_failures(p, configs[0], trials=200, seed=6).wall_times, alone[0].wall_times)
    # the same failures: the first L1 failure arrives at the same time in every configuration, so a
    # trial whose first failure comes after the job would have finished is failure-free in both
    first = FailureArrivals(p.l1_mtbf, 200, 5, 1).gap(np.arange(200), np.zeros(200, dtype=np.int64))
    first = np.minimum(first, FailureArrivals(p.l2_mtbf, 200, 5, 2).gap(np.arange(200), np.zeros(200, dtype=np.int64)))
    for r in alone:
        clean = first > r.wall_times
        assert np.all(r.wall_times[clean] == r.wall_times.min())


def test_guard_stops_hopeless_jobs() -> None:
    # restart 100 s, MTBF 1 s: a restart succeeds with probability e^-100; never finishes
    p = MLCParams(l1_cost=1, l1_restart=100, l1_mtbf=1, solve_time=100)
    r = simulate_failures(p, MLCConfig(10), trials=50, max_events=2000)
    assert r.stopped == 50 and r.efficiency < 0.1
    r = simulate_failures(p, MLCConfig(10), trials=50, max_wall_factor=5)
    assert r.stopped == 50 and np.all(r.wall_times >= 500)


# ---------------------------------------------------------------- search


def test_search_beats_a_dense_grid() -> None:
    p = MLCParams(**{**EXAMPLE.__dict__, "solve_time": 50 * 3600})
    trials, seed = 200, 0
    best = search(p, trials=trials, seed=seed)
    found = simulate_failures(p, best, trials=trials, seed=seed)
    assert best.predicted_efficiency == found.efficiency
    young = young_interval(p.l1_cost, 1 / (p.l1_rate + p.l2_rate))
    grid = [MLCConfig(tau, e) for tau in young * 10.0 ** np.linspace(-1, 1, 41) for e in (1, 2, 3, 4, 6, 10, 20, 50)]
    dense = max(r.efficiency for r in simulate_failures_many(p, grid, trials=trials, seed=seed))
    # the same failures everywhere, so "at least as good" is meant to within rounding of the optimum
    assert found.efficiency >= dense - 2e-4
    # and better than the first-order formula, which flushes too rarely when flushes are free
    assert found.efficiency > simulate_failures(p, two_level_optimum(p), trials=trials, seed=seed).efficiency


def test_search_cap_on_hopeless_candidates_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # lost nodes every 8 h and a day of compute: candidates that flush rarely roll back to the start
    # and are stopped early; the answer is the one found when every candidate runs in full
    p = MLCParams(
        l1_cost=30, l2_latency=600, l1_restart=60, l2_restart=600, l1_mtbf=2 * 3600, l2_mtbf=8 * 3600, solve_time=86_400
    )
    capped = search(p, trials=100)
    module = sys.modules["resilient_flows.mlc._search"]  # the package's `search` is the function
    monkeypatch.setattr(module._Search, "CAP_MARGIN", 1e12)
    assert search(p, trials=100) == capped


def test_flush_interference_makes_rarer_flushes_optimal() -> None:
    # 64 GiB per node, 1024 nodes, 250 GB/s: a 281 s flush. Free, it is worth taking after every
    # checkpoint; slowing compute by 20 %, it is not
    assert REALISTIC.shared_latency == pytest.approx(64 * GIB * 1024 / 250e9)
    slowed = search(REALISTIC, trials=100)
    free = search(MLCParams(**{**REALISTIC.__dict__, "l2_slowdown": 0.0}), trials=100)
    assert free.l2_every == 1 and slowed.l2_every > 1
    assert slowed.predicted_traffic < free.predicted_traffic / 2
    every_one = simulate_failures(REALISTIC, MLCConfig(slowed.interval, 1), trials=100).efficiency
    assert slowed.predicted_efficiency > every_one + 0.01


def test_search_objectives_cap_or_charge_the_traffic() -> None:
    free = MLCParams(**{**REALISTIC.__dict__, "l2_slowdown": 0.0})  # flushing after every checkpoint is best
    best = search(free, trials=60)
    cap = best.predicted_traffic / 3
    capped = search(free, trials=60, objective=Objective(traffic_cap=cap))
    assert capped.predicted_traffic <= cap and capped.predicted_efficiency < best.predicted_efficiency
    priced = search(free, trials=60, objective=Objective(byte_price=1e-13))
    assert priced.predicted_traffic < best.predicted_traffic
    again = simulate_failures(free, capped, trials=60)  # the figures are the simulator's, on the same failures
    assert (again.efficiency, again.traffic) == (capped.predicted_efficiency, capped.predicted_traffic)


def test_search_three_levels() -> None:
    p = MLCParams(l1_cost=5, l1_restart=15, l1_mtbf=3600, solve_time=10 * 3600, l2_latency=20, l2_restart=40,
                  l2_mtbf=6 * 3600, l3_latency=300, l3_restart=400, l3_mtbf=24 * 3600, l2_slowdown=0.3)  # fmt: skip
    best = search(p, trials=40, max_l2_every=8, max_l3_every=16)
    assert best.l2_every is not None and best.l3_every is not None
    flat = simulate_failures(p, MLCConfig(best.interval, 1, l3_every=1), trials=40).efficiency
    assert best.predicted_efficiency >= flat


def test_search_one_level_and_no_failures() -> None:
    p = MLCParams(l1_cost=30, l1_restart=60, l1_mtbf=3600, solve_time=24 * 3600)
    best = search(p, trials=200)
    assert best.l2_every is None
    tau = optimal_interval(30, 60, 3600)
    # the simulator's optimum is Daly's optimum, up to the flat top of the curve
    assert best.interval == pytest.approx(tau, rel=0.25)
    exact = simulate_failures(p, MLCConfig(tau), trials=200).efficiency
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
        ("l2_slowdown", 1.0, r"l2_slowdown must be in \[0, 1\), got 1.0"),
        ("l2_slowdown", -0.1, "l2_slowdown must be >= 0"),
        ("l1_latency", -2, "l1_latency must be >= 0"),
        ("l1_latency", math.inf, "l1_latency must be finite"),
        ("node_bandwidth", -1e9, "node_bandwidth must be > 0"),
        ("pfs_bandwidth", math.nan, "pfs_bandwidth must be a number"),
        ("checkpoint_bytes", -1, "checkpoint_bytes must be >= 0"),
        ("nodes", 0, "nodes must be >= 1"),
        ("concurrent_flushers", 2.5, "concurrent_flushers must be a whole number"),
        ("l3_mtbf", 0, "l3_mtbf must be > 0"),
    ],
)
def test_invalid_params_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message) as info:
        MLCParams(**{**EXAMPLE.__dict__, field: value})
    assert isinstance(info.value, ValueError) and isinstance(info.value, ResilientFlowsError)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"l3_latency": 60}, "l3_latency is set but l3_mtbf is not"),
        ({"l3_restart": 60}, "l3_restart is set but l3_mtbf is not"),
        ({"checkpoint_bytes": 1e9, "pfs_bandwidth": 1e9}, "l2_latency and checkpoint_bytes both give"),
        ({"l2_latency": 0, "checkpoint_bytes": 1e9}, "checkpoint_bytes needs node_bandwidth or pfs_bandwidth"),
        ({"l3_mtbf": 86400, "l3_latency": 60, "checkpoint_bytes": 1e9, "node_bandwidth": 1e9},
         "l3_latency and checkpoint_bytes both give"),
    ],
)  # fmt: skip
def test_inconsistent_levels_name_the_fields(fields: dict, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        MLCParams(**{**EXAMPLE.__dict__, **fields})


def test_bad_objectives_and_configurations_name_the_field() -> None:
    with pytest.raises(InvalidParameterError, match="traffic_cap must be > 0"):
        Objective(traffic_cap=-1)
    with pytest.raises(InvalidParameterError, match="byte_price must be a number"):
        Objective(byte_price=math.nan)
    with pytest.raises(InvalidParameterError, match=r"traffic_cap must be at least one checkpoint's bytes"):
        search(REALISTIC, trials=10, objective=Objective(traffic_cap=GIB))
    with pytest.raises(InvalidParameterError, match="traffic_cap needs checkpoint_bytes"):
        search(EXAMPLE, trials=10, objective=Objective(traffic_cap=1e12))
    with pytest.raises(InvalidParameterError, match="l3_every needs l2_every"):
        MLCConfig(600, None, l3_every=2)
    with pytest.raises(InvalidParameterError, match=r"configs\[0\].l3_every is set, but the parameters have no third"):
        simulate_failures(EXAMPLE, MLCConfig(600, 1, l3_every=2))


@pytest.mark.parametrize(
    ("option", "value", "field"),
    [
        ("--pfs-bandwidth", "-5", "pfs_bandwidth"),
        ("--node-bandwidth", "nan", "node_bandwidth"),
        ("--l2-slowdown", "1.5", "l2_slowdown"),
        ("--nodes", "many", "nodes"),
        ("--l3-latency", "5m", "l3_latency"),
        ("--traffic-cap", "1GiB", "traffic_cap"),
    ],
)
def test_tune_reports_bad_input_in_one_line(capsys, option: str, value: str, field: str) -> None:
    job = ["--l1-cost", "10s", "--l1-mtbf", "6h", "--l2-mtbf", "2d", "--checkpoint-bytes", "64GiB"]
    job += ["--pfs-bandwidth", "250GB/s"] if option != "--pfs-bandwidth" else []
    assert main(["tune", *job, option, value, "--trials", "20"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err


def test_tune_prints_efficiency_and_traffic(capsys) -> None:
    job = ["--l1-cost", "10s", "--l1-mtbf", "6h", "--l2-mtbf", "2d", "--checkpoint-bytes", "64GiB", "--nodes", "1024"]
    assert main(["tune", *job, "--pfs-bandwidth", "250GB/s", "--l2-slowdown", "0.2", "--trials", "50"]) == 0
    out = capsys.readouterr().out
    for method in ("Young", "Daly", "async", "Benoit", "learned"):
        assert method in out
    assert out.count("GB/h/node") >= 5


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
        simulate_failures(EXAMPLE, MLCConfig(600), trials=0)
    with pytest.raises(ValueError, match="trials must be >= 1"):
        search(EXAMPLE, trials=0)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        simulate_failures(EXAMPLE, MLCConfig(600), seed=-1)
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
