"""The co-scheduling decision: ``"dp"`` is optimal (against exhaustive search), baselines do what they say."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from resilient_flows.cosched import OnDemandRequest, RunningJob, decide
from resilient_flows.cosched._jobs import decision_cost, nodes_free_at
from resilient_flows.cosched._policies import covering_knapsack
from resilient_flows.errors import InvalidJobError


def random_instance(rng: random.Random, max_jobs: int = 12) -> dict:
    now = rng.choice([0.0, 3000.0, 1234.5, 86400.0])
    jobs = []
    for j in range(rng.randint(0, max_jobs)):
        start = rng.uniform(0, now)
        interval = rng.choice([None, 300.0, 900.0, rng.uniform(50, 2000)])
        last = rng.choice([None, rng.uniform(start, now)])
        jobs.append(
            RunningJob(
                id=f"j{j}",
                nodes=rng.choice([1, 2, 3, 4, 8, 16, 128, 256, 384]),
                start=start,
                end=now + rng.uniform(1, 4000),
                last_checkpoint=last,
                checkpoint_interval=interval,
                restart_cost=rng.choice([0.0, 60.0, rng.uniform(0, 300)]),
            )
        )
    free = rng.randint(0 if jobs else 1, 64)
    request = OnDemandRequest(nodes=rng.randint(1, free + sum(j.nodes for j in jobs)), arrival=now, duration=600.0)
    return {
        "now": now,
        "free_nodes": free,
        "running": jobs,
        "request": request,
        "alpha": rng.choice([0.0, 0.1, 1.0, 3.0]),
        "beta": rng.choice([0.0, 1.0, 2.5]),
        "max_delay": rng.choice([0.0, 600.0, 1800.0, 7200.0]),
    }


def feasible(decision, problem: dict) -> bool:
    t = problem["now"] + decision.delay
    victims = [j for j in problem["running"] if j.id in decision.preempt]
    assert all(j.end > t for j in victims), "a victim must still be running when it is preempted"
    return (
        nodes_free_at(t, problem["free_nodes"], problem["running"]) + sum(j.nodes for j in victims)
        >= problem["request"].nodes
    )


def objective(problem: dict, delay: float, victims) -> float:
    keys = ("now", "request", "alpha", "beta")
    return decision_cost(delay, victims, **{k: problem[k] for k in keys})


def test_dp_equals_exhaustive_search_on_1000_random_instances() -> None:
    rng = random.Random(20261203)
    preempted = waited = 0
    for _ in range(1000):
        problem = random_instance(rng)
        dp, exhaustive = decide("dp", **problem), decide("exhaustive", **problem)
        assert dp.cost == pytest.approx(exhaustive.cost, rel=1e-9, abs=1e-9), problem
        assert feasible(dp, problem) and 0.0 <= dp.delay <= problem["max_delay"]
        victims = [j for j in problem["running"] if j.id in dp.preempt]
        assert dp.cost == pytest.approx(objective(problem, dp.delay, victims), rel=1e-12)
        preempted += bool(dp.preempt)
        waited += dp.delay > 0
    assert preempted > 300 and waited > 50  # the instances exercise both kinds of decision


def test_no_start_time_between_the_candidates_beats_dp() -> None:
    """Every subset at 200 start times spread over [now, now + max_delay]: none is cheaper than dp."""
    rng = random.Random(7)
    for _ in range(60):
        problem = random_instance(rng, max_jobs=6)
        best = decide("dp", **problem).cost
        now, running = problem["now"], problem["running"]
        for delay in np.linspace(0.0, problem["max_delay"], 200):
            t = now + float(delay)
            alive = [j for j in running if j.end > t]
            for size in range(len(alive) + 1):
                for victims in itertools.combinations(alive, size):
                    free = nodes_free_at(t, problem["free_nodes"], running) + sum(j.nodes for j in victims)
                    if free >= problem["request"].nodes:
                        assert objective(problem, float(delay), victims) >= best * (1 - 1e-9) - 1e-9


def test_the_covering_knapsack_is_exact() -> None:
    rng = np.random.default_rng(3)
    for _ in range(300):
        m = int(rng.integers(1, 10))
        nodes = rng.choice([2, 4, 6, 8, 12, 128], size=m).astype(np.int64)
        costs = rng.uniform(0, 100, size=m).round(rng.integers(0, 3))
        need = int(rng.integers(1, nodes.sum() + 1))
        cost, rows = covering_knapsack(nodes, costs, need)
        assert nodes[rows].sum() >= need and cost == pytest.approx(costs[rows].sum())
        brute = min(
            costs[list(s)].sum()
            for k in range(m + 1)
            for s in itertools.combinations(range(m), k)
            if nodes[list(s)].sum() >= need
        )
        assert cost == pytest.approx(brute, rel=1e-12, abs=1e-12)


@pytest.fixture
def three_jobs() -> dict:
    """Worked by hand: 64 nodes free, 256 requested, checkpoints every 900 s (j1) and 600 s (j3)."""
    return {
        "now": 3000.0,
        "free_nodes": 64,
        "running": [
            RunningJob("j1", 128, 0.0, 7200.0, last_checkpoint=1800.0, checkpoint_interval=900.0, restart_cost=60.0),
            RunningJob("j2", 128, start=1000.0, end=3300.0, restart_cost=60.0),  # no checkpoint at all
            RunningJob("j3", 64, start=2500.0, end=9000.0, checkpoint_interval=600.0, restart_cost=30.0),
        ],
        "request": OnDemandRequest(nodes=256, arrival=3000.0, duration=600.0),
        "max_delay": 1800.0,
    }


def test_dp_preempts_at_once_when_waiting_is_dear(three_jobs: dict) -> None:
    d = decide("dp", **three_jobs, alpha=1.0, beta=1.0)
    # j1 lost 300 s since 2700 + 60 s restart on 128 nodes; j3 lost 500 s since its start + 30 s on 64
    assert (d.delay, d.preempt, d.cost) == (0.0, ("j1", "j3"), 128 * 360 + 64 * 530)


def test_dp_waits_for_a_checkpoint_when_waiting_is_cheap(three_jobs: dict) -> None:
    d = decide("dp", **three_jobs, alpha=0.1, beta=1.0)
    # at 3700 j2 has ended (192 free) and j3 has just checkpointed: it only pays its restart
    assert (d.delay, d.preempt) == (700.0, ("j3",))
    assert d.cost == pytest.approx(0.1 * 256 * 700 + 64 * 30)


def test_baselines_follow_their_orders(three_jobs: dict) -> None:
    cheap = {**three_jobs, "alpha": 0.1, "beta": 1.0}
    assert decide("greedy", **cheap).preempt == ("j1", "j3")  # 360 and 530 s per node, then j2's 2060
    assert decide("youngest", **cheap).preempt == ("j3", "j2")
    assert decide("largest", **cheap).preempt == ("j1", "j2")
    wait = decide("wait", **cheap)  # j2's end frees 128: not enough; j1's at 7200 is
    assert (wait.delay, wait.preempt, wait.cost) == (4200.0, (), pytest.approx(0.1 * 256 * 4200))
    assert decide("random", **cheap, seed=1) == decide("random", **cheap, seed=1)
    for policy in ("greedy", "youngest", "largest", "random"):
        assert decide(policy, **cheap).delay == 0.0


def test_dp_is_never_worse_than_a_baseline() -> None:
    rng = random.Random(11)
    for _ in range(300):
        problem = random_instance(rng, max_jobs=30)
        best = decide("dp", **problem).cost
        for policy in ("greedy", "youngest", "largest", "random"):
            assert best <= decide(policy, **problem, seed=0).cost * (1 + 1e-12) + 1e-9
        wait = decide("wait", **problem)
        if wait.delay <= problem["max_delay"]:
            assert best <= wait.cost * (1 + 1e-12) + 1e-9


def test_a_request_that_fits_now_waits_for_nothing(three_jobs: dict) -> None:
    small = {**three_jobs, "request": OnDemandRequest(nodes=64, arrival=3000.0, duration=60.0)}
    for policy in ("dp", "wait", "greedy", "exhaustive"):
        assert decide(policy, **small) == type(decide("dp", **small))(policy, 0.0, (), 0.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"request": OnDemandRequest(nodes=1000, arrival=3000.0, duration=60.0)}, "request.nodes: 1000 is more than"),
        ({"request": OnDemandRequest(nodes=-4, arrival=3000.0, duration=60.0)}, "request.nodes must be a positive"),
        ({"request": OnDemandRequest(nodes=4, arrival=3000.0, duration=-1.0)}, "request.duration must be"),
        ({"free_nodes": -1}, "free_nodes must be a non-negative integer"),
        ({"max_delay": -5.0}, "max_delay must be a finite number >= 0"),
        ({"alpha": -1.0}, "alpha must be"),
        ({"running": [RunningJob("a", 4, 0.0, 4000.0), RunningJob("a", 4, 0.0, 4000.0)]}, "job 'a': duplicate id"),
        ({"running": [RunningJob("a", 0, 0.0, 4000.0)]}, "job 'a': nodes must be a positive"),
        ({"running": [RunningJob("a", 4, -10.0, 4000.0)]}, "job 'a': start must be a finite number >= 0"),
        ({"running": [RunningJob("a", 4, 0.0, 100.0)]}, "job 'a': end 100.0 is not after now"),
        ({"running": [RunningJob("a", 4, 0.0, 4000.0, last_checkpoint=3500.0)]}, "last_checkpoint 3500.0 is not"),
        ({"running": [RunningJob("a", 4, 0.0, 4000.0, checkpoint_interval=0.0)]}, "checkpoint_interval must be"),
    ],
)
def test_bad_inputs_name_the_field(three_jobs: dict, change: dict, message: str) -> None:
    with pytest.raises(InvalidJobError, match=message) as caught:
        decide("dp", **{**three_jobs, **change})
    assert isinstance(caught.value, ValueError)


def test_unknown_policies_and_oversized_exhaustive_searches_are_refused(three_jobs: dict) -> None:
    with pytest.raises(ValueError, match="unknown policy 'fifo'; choose one of dp, wait"):
        decide("fifo", **three_jobs)
    many = [RunningJob(f"j{i}", 1, 0.0, 9000.0) for i in range(40)]
    with pytest.raises(ValueError, match="exhaustive search takes 16 jobs at most"):
        decide("exhaustive", **{**three_jobs, "running": many, "request": OnDemandRequest(30, 3000.0, 1.0)})
