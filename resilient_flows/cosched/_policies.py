"""Policies that answer an on-demand request: wait, preempt whom, or both; one entry point, :func:`decide`.

``"dp"`` is exact. For a fixed start time ``t`` the objective is a minimum-cost covering knapsack
(victims whose nodes, with those free at ``t``, cover the request); over ``t`` it only changes
slope where a job checkpoints or ends, and between two such times it grows (the wait costs more,
every victim loses more), so the optimum starts at ``now`` or at one of those times. The knapsack
is solved exactly by dynamic programming over node counts divided by their gcd, the jobs grouped by
node count: within a group the cheapest victims come first, so a group contributes a count, not a
subset. Start times are scanned in order and the scan stops once the wait alone costs more than
the best decision found; a start time whose fractional (LP) bound cannot beat it skips the DP.

The baselines take the same arguments and are judged by the same objective: ``"wait"`` never
preempts and starts when enough jobs have ended (possibly beyond ``max_delay``); ``"greedy"``
(least lost work per node first), ``"youngest"`` (latest start first, as Slurm does), ``"largest"``
and ``"random"`` preempt at once, adding victims in their order until the request fits.
``"exhaustive"`` tries every subset at every candidate start time: the reference for tests, for at
most :data:`EXHAUSTIVE_MAX_JOBS` running jobs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from resilient_flows.cosched._jobs import (
    TIME_SLACK,
    Decision,
    OnDemandRequest,
    RunningJob,
    check_inputs,
    decision_cost,
    nodes_free_at,
)
from resilient_flows.errors import InvalidJobError

BASELINES = ("wait", "greedy", "youngest", "largest", "random")
POLICIES = ("dp", *BASELINES, "exhaustive")
EXHAUSTIVE_MAX_JOBS = 16


def decide(
    policy: str,
    *,
    now: float,
    free_nodes: int,
    running: Sequence[RunningJob],
    request: OnDemandRequest,
    alpha: float = 1.0,
    beta: float = 1.0,
    max_delay: float = 1800.0,
    seed: int | None = None,
) -> Decision:
    """Decide when ``request`` starts and which of the ``running`` jobs it preempts.

    Parameters
    ----------
    policy:
        One of :data:`POLICIES`.
    now:
        The current time, in the same seconds as the jobs' times.
    free_nodes:
        Nodes idle now and not promised to anyone else.
    running:
        The batch jobs that may be preempted.
    request:
        The on-demand job.
    alpha, beta:
        Weights of the request's wait (per node-second) and of the victims' lost work and restart
        (per node-second).
    max_delay:
        The longest ``"dp"`` may make the request wait; the preempting baselines never wait, and
        ``"wait"`` waits as long as it takes.
    seed:
        Seeds ``"random"``'s order.

    Raises
    ------
    InvalidJobError
        An unknown policy, or an input that makes no sense (the message names the field): a request
        larger than the machine, negative sizes or times, duplicate job ids.
    """
    if policy not in POLICIES:
        raise InvalidJobError(f"policy: unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    check_inputs(
        now=now, free_nodes=free_nodes, running=running, request=request, alpha=alpha, beta=beta, max_delay=max_delay
    )
    if policy == "exhaustive" and len(running) > EXHAUSTIVE_MAX_JOBS:
        raise InvalidJobError(
            f"running: the exhaustive search takes {EXHAUSTIVE_MAX_JOBS} jobs at most, got {len(running)}"
        )
    problem = _Problem(now, free_nodes, tuple(running), request, alpha, beta, max_delay)
    if problem.need_at(now) <= 0:
        return Decision(policy, 0.0, (), 0.0)
    if policy == "dp":
        return _dp(problem)
    if policy == "exhaustive":
        return _exhaustive(problem)
    if policy == "wait":
        return _wait(problem)
    return _preempt_in_order(problem, policy, _ORDERS[policy](problem, seed))


def candidate_starts(now: float, running: Sequence[RunningJob], max_delay: float) -> list[float]:
    """Start times where the objective can be smallest: now, and every checkpoint or end until ``now + max_delay``."""
    return _Arrays(running).candidate_starts(now, now + max_delay).tolist()


def covering_knapsack(nodes: np.ndarray, costs: np.ndarray, need: int) -> tuple[float, np.ndarray]:
    """The cheapest subset of items whose ``nodes`` sum to at least ``need``: (its cost, its indices).

    Exact dynamic programming over node counts in units of their gcd. Items of one node count are
    interchangeable but for their cost, so each count contributes its ``k`` cheapest items and the
    table is built over counts, ``k`` bounded by what covering ``need`` alone could use.
    """
    if need <= 0:
        return 0.0, np.zeros(0, dtype=np.intp)
    unit = math.gcd(*(int(n) for n in np.unique(nodes)))
    units = nodes // unit
    target = -(-need // unit)
    table = np.full(target + 1, np.inf)
    table[0] = 0.0
    groups, choices = [], []
    for size in np.unique(units):
        members = np.flatnonzero(units == size)
        members = members[np.argsort(costs[members], kind="stable")]
        most = min(len(members), -(-target // int(size)))
        prefix = np.concatenate(([0.0], np.cumsum(costs[members[:most]])))
        best, chosen = table.copy(), np.zeros(target + 1, dtype=np.int32)
        for k in range(1, most + 1):
            shift = k * int(size)
            head = min(shift, target)
            better = prefix[k] < best[1 : head + 1]  # covered by these k alone (table[0] == 0)
            best[1 : head + 1][better] = prefix[k]
            chosen[1 : head + 1][better] = k
            if shift < target:
                candidate = table[: target + 1 - shift] + prefix[k]
                better = candidate < best[shift:]
                best[shift:][better] = candidate[better]
                chosen[shift:][better] = k
        table = best
        groups.append((members, int(size)))
        choices.append(chosen)
    picked, remaining = [], target
    for (members, size), chosen in zip(reversed(groups), reversed(choices), strict=True):
        k = int(chosen[remaining])
        picked.append(members[:k])
        remaining = max(0, remaining - k * size)
    return float(table[target]), np.concatenate(picked) if picked else np.zeros(0, dtype=np.intp)


@dataclass(frozen=True)
class _Problem:
    now: float
    free_nodes: int
    running: tuple[RunningJob, ...]
    request: OnDemandRequest
    alpha: float
    beta: float
    max_delay: float

    def need_at(self, t: float) -> int:
        return self.request.nodes - nodes_free_at(t, self.free_nodes, self.running)

    def decision(self, policy: str, t: float, victims: Sequence[RunningJob]) -> Decision:
        delay = t - self.now
        cost = decision_cost(delay, victims, now=self.now, request=self.request, alpha=self.alpha, beta=self.beta)
        return Decision(policy, delay, tuple(job.id for job in victims), cost)


class _Arrays:
    """The running jobs as columns, so that a start time costs a few vector operations."""

    def __init__(self, running: Sequence[RunningJob]) -> None:
        self.nodes = np.array([job.nodes for job in running], dtype=np.int64)
        self.end = np.array([job.end for job in running], dtype=float)
        self.base = np.array(
            [job.start if job.last_checkpoint is None else job.last_checkpoint for job in running], dtype=float
        )
        periodic = [job.checkpoint_interval is not None for job in running]
        self.periodic = np.array(periodic, dtype=bool)
        self.interval = np.array([job.checkpoint_interval or 1.0 for job in running], dtype=float)
        self.restart = np.array([job.restart_cost for job in running], dtype=float)

    def candidate_starts(self, now: float, horizon: float) -> np.ndarray:
        """``now``, the ends until ``horizon`` and the checkpoints in ``(now, horizon]``, sorted, unique."""
        ends = self.end[self.end <= horizon]
        base, interval = self.base[self.periodic], self.interval[self.periodic]
        first = np.maximum(1, np.floor((now - base) / interval) + 1)
        last = np.floor((np.minimum(horizon, self.end[self.periodic]) - base) / interval + TIME_SLACK)
        count = np.maximum(0, last - first + 1).astype(np.int64)
        rows = np.repeat(np.arange(len(base)), count)
        offsets = np.arange(len(rows)) - np.repeat(np.cumsum(count) - count, count)
        checkpoints = base[rows] + (first[rows] + offsets) * interval[rows]
        return np.unique(np.concatenate(([now], ends, checkpoints)))

    def lost_at(self, t: float, rows: np.ndarray) -> np.ndarray:
        """Per-node cost of preempting ``rows`` at ``t``; the same arithmetic as :meth:`RunningJob.lost_at`."""
        base, interval = self.base[rows], self.interval[rows]
        periods = np.where(self.periodic[rows] & (t > base), np.floor((t - base) / interval + TIME_SLACK), 0.0)
        newest = np.minimum(t, base + periods * interval)
        return np.maximum(0.0, t - newest) + self.restart[rows]


def _dp(problem: _Problem) -> Decision:
    cols = _Arrays(problem.running)
    demand, per_second = problem.request.nodes, problem.alpha * problem.request.nodes
    best_cost, best_t, best_rows = math.inf, problem.now, np.zeros(0, dtype=np.intp)
    for t in cols.candidate_starts(problem.now, problem.now + problem.max_delay).tolist():
        waiting = per_second * (t - problem.now)
        if waiting >= best_cost:
            break
        alive = np.flatnonzero(cols.end > t)
        need = demand - problem.free_nodes - int(cols.nodes.sum() - cols.nodes[alive].sum())
        if need <= 0:
            best_cost, best_t, best_rows = waiting, t, np.zeros(0, dtype=np.intp)
            break  # nobody to preempt: any later start only waits longer
        nodes = cols.nodes[alive]
        per_node = problem.beta * cols.lost_at(t, alive)
        if waiting + _fractional_cover(nodes, per_node, need) >= best_cost:
            continue
        cost, rows = covering_knapsack(nodes, nodes * per_node, need)
        if waiting + cost < best_cost:
            best_cost, best_t, best_rows = waiting + cost, t, alive[rows]
    victims = [problem.running[i] for i in sorted(best_rows)]
    return problem.decision("dp", best_t, victims)


def _fractional_cover(nodes: np.ndarray, per_node: np.ndarray, need: int) -> float:
    """The LP relaxation of the covering knapsack: a lower bound on its cost."""
    order = np.argsort(per_node, kind="stable")
    covered = np.cumsum(nodes[order])
    last = int(np.searchsorted(covered, need))
    full = float(np.dot(nodes[order[:last]], per_node[order[:last]]))
    rest = need - (int(covered[last - 1]) if last else 0)
    return full + rest * float(per_node[order[last]])


def _exhaustive(problem: _Problem) -> Decision:
    """Every subset of the jobs alive at every candidate start, as one matrix product per start."""
    best_cost, best_t, best_victims = math.inf, problem.now, ()
    for t in candidate_starts(problem.now, problem.running, problem.max_delay):
        alive = [job for job in problem.running if job.end > t]
        subsets = (np.arange(1 << len(alive))[:, None] >> np.arange(len(alive))) & 1
        nodes = subsets @ np.array([job.nodes for job in alive], dtype=np.int64).reshape(-1)
        lost = subsets @ np.array([job.nodes * job.lost_at(t) for job in alive], dtype=float).reshape(-1)
        waiting = problem.alpha * problem.request.nodes * (t - problem.now)
        costs = np.where(nodes >= problem.need_at(t), waiting + problem.beta * lost, np.inf)
        row = int(np.argmin(costs))
        if costs[row] < best_cost:
            best_cost, best_t = float(costs[row]), t
            best_victims = tuple(job for job, taken in zip(alive, subsets[row], strict=True) if taken)
    return problem.decision("exhaustive", best_t, best_victims)


def _wait(problem: _Problem) -> Decision:
    for t in sorted({problem.now, *(job.end for job in problem.running)}):
        if problem.need_at(t) <= 0:
            return problem.decision("wait", t, ())
    raise AssertionError("every job ends, and the request fits the machine")


def _preempt_in_order(problem: _Problem, policy: str, order: Sequence[RunningJob]) -> Decision:
    need, victims = problem.need_at(problem.now), []
    for job in order:
        if need <= 0:
            break
        victims.append(job)
        need -= job.nodes
    return problem.decision(policy, problem.now, victims)


def _by_lost_work(problem: _Problem, _seed: int | None) -> list[RunningJob]:
    return sorted(problem.running, key=lambda job: (job.lost_at(problem.now), job.id))


def _youngest(problem: _Problem, _seed: int | None) -> list[RunningJob]:
    return sorted(problem.running, key=lambda job: (-job.start, job.id))


def _largest(problem: _Problem, _seed: int | None) -> list[RunningJob]:
    return sorted(problem.running, key=lambda job: (-job.nodes, job.id))


def _shuffled(problem: _Problem, seed: int | None) -> list[RunningJob]:
    order = np.random.default_rng(seed).permutation(len(problem.running))
    return [problem.running[i] for i in order]


_ORDERS: dict[str, Callable[[_Problem, int | None], list[RunningJob]]] = {
    "greedy": _by_lost_work,
    "youngest": _youngest,
    "largest": _largest,
    "random": _shuffled,
}
