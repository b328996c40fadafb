"""The co-scheduling model: running batch jobs, an on-demand request, and the cost of a decision.

One decision is a delay ``x`` and a set of victims ``S``: at ``t = now + x`` the victims are
preempted (they lose the progress made since their newest checkpoint and pay their restart cost
when they resume) and the request starts on the nodes free at ``t`` plus the victims' nodes. Its
cost is ``alpha * request.nodes * x + beta * sum(job.nodes * (t - c_j(t) + job.restart_cost))``
over the victims, ``c_j(t)`` being the job's newest checkpoint at ``t``. Every policy is judged by
this one function, so that their costs compare.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from resilient_flows.errors import InvalidJobError

#: Slack for times computed as ``last_checkpoint + k * interval``: at that very instant, the
#: checkpoint counts as taken although floating point may place ``t`` a hair before it.
TIME_SLACK = 1e-9


@dataclass(frozen=True)
class RunningJob:
    """A batch job holding ``nodes`` nodes since ``start``, expected to finish at ``end``.

    ``last_checkpoint`` is the time of its newest committed checkpoint (None: none yet, its
    progress since ``start`` is at stake); ``checkpoint_interval`` the period of the next ones
    (None: it takes no more); ``restart_cost`` the seconds it needs to resume from a checkpoint.
    """

    id: str
    nodes: int
    start: float
    end: float
    last_checkpoint: float | None = None
    checkpoint_interval: float | None = None
    restart_cost: float = 0.0

    def checkpoint_at(self, t: float) -> float:
        """Time of the newest checkpoint taken by ``t``."""
        base = self.start if self.last_checkpoint is None else self.last_checkpoint
        if self.checkpoint_interval is None or t <= base:
            return base
        periods = math.floor((t - base) / self.checkpoint_interval + TIME_SLACK)
        return min(t, base + periods * self.checkpoint_interval)

    def lost_at(self, t: float) -> float:
        """Seconds of progress lost by preempting at ``t``, plus the restart: the per-node cost."""
        return max(0.0, t - self.checkpoint_at(t)) + self.restart_cost


@dataclass(frozen=True)
class OnDemandRequest:
    """An on-demand job (analytics, steering, interactive) that needs ``nodes`` nodes for ``duration`` s."""

    nodes: int
    arrival: float
    duration: float
    id: str = "on-demand"


@dataclass(frozen=True)
class Decision:
    """Start the request ``delay`` seconds from now, after preempting ``preempt`` (job ids)."""

    policy: str
    delay: float
    preempt: tuple[str, ...]
    cost: float


def nodes_free_at(t: float, free_nodes: int, running: Sequence[RunningJob]) -> int:
    """Nodes free at ``t``: free now plus those of the jobs expected to have ended by then."""
    return free_nodes + sum(job.nodes for job in running if job.end <= t)


def decision_cost(
    delay: float,
    victims: Sequence[RunningJob],
    *,
    now: float,
    request: OnDemandRequest,
    alpha: float,
    beta: float,
) -> float:
    """The objective of starting ``request`` at ``now + delay`` after preempting ``victims``."""
    t = now + delay
    return alpha * request.nodes * delay + beta * sum(job.nodes * job.lost_at(t) for job in victims)


def check_inputs(
    *,
    now: float,
    free_nodes: int,
    running: Sequence[RunningJob],
    request: OnDemandRequest,
    alpha: float,
    beta: float,
    max_delay: float,
) -> None:
    """Raise :class:`InvalidJobError` naming the first field that makes the problem meaningless."""
    _non_negative("now", now)
    _non_negative("alpha", alpha)
    _non_negative("beta", beta)
    _non_negative("max_delay", max_delay)
    if isinstance(free_nodes, bool) or not isinstance(free_nodes, numbers.Integral) or free_nodes < 0:
        raise InvalidJobError(f"free_nodes must be a non-negative integer, got {free_nodes!r}")
    _positive_nodes("request.nodes", request.nodes)
    _non_negative("request.arrival", request.arrival)
    _positive("request.duration", request.duration)
    seen: set[str] = set()
    for job in running:
        name = f"job {job.id!r}"
        if job.id in seen:
            raise InvalidJobError(f"{name}: duplicate id; every running job needs its own")
        seen.add(job.id)
        _positive_nodes(f"{name}: nodes", job.nodes)
        _non_negative(f"{name}: start", job.start)
        _non_negative(f"{name}: restart_cost", job.restart_cost)
        if job.start > now:
            raise InvalidJobError(f"{name}: start {job.start} is after now ({now}); it is not running yet")
        if not job.end > now:
            raise InvalidJobError(f"{name}: end {job.end} is not after now ({now}); a running job ends in the future")
        if job.last_checkpoint is not None:
            _non_negative(f"{name}: last_checkpoint", job.last_checkpoint)
            if not job.start <= job.last_checkpoint <= now:
                raise InvalidJobError(
                    f"{name}: last_checkpoint {job.last_checkpoint} is not between "
                    f"its start ({job.start}) and now ({now})"
                )
        if job.checkpoint_interval is not None:
            _positive(f"{name}: checkpoint_interval", job.checkpoint_interval)
    machine = free_nodes + sum(job.nodes for job in running)
    if request.nodes > machine:
        raise InvalidJobError(
            f"request.nodes: {request.nodes} is more than the whole machine "
            f"({free_nodes} free + {machine - free_nodes} running = {machine} nodes)"
        )


def _non_negative(field: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise InvalidJobError(f"{field} must be a finite number >= 0, got {value!r}")


def _positive(field: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise InvalidJobError(f"{field} must be a finite number > 0, got {value!r}")


def _positive_nodes(field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise InvalidJobError(f"{field} must be a positive whole number of nodes, got {value!r}")
