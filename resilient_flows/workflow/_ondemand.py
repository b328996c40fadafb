"""On-demand analytics in a run: fire each request, and make room for it when the workers are busy.

A request with ``slots`` runs as that many analytics tasks at Parsl priority 0, ahead of every
queued member. When fewer slots are free than it needs, the running members become
:class:`~resilient_flows.cosched.RunningJob` s (one slot each, measured from the run directory:
when the attempt started, its newest committed checkpoint, the pace of its checkpoints and steps,
how long a resume took) and the workflow's co-scheduling policy picks the members to preempt and
when. A preempted member commits a checkpoint and stops; its slot goes to the analytics (priority)
and the member, requeued by the retry handler, resumes from that checkpoint once a slot frees.
Everything decided goes to the run's event log as an ``ondemand`` event, inputs included, so that a
decision can be replayed.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from parsl import Config
from parsl.executors import HighThroughputExecutor, ThreadPoolExecutor

from resilient_flows.cosched import OnDemandRequest, RunningJob, decide
from resilient_flows.errors import WorkflowError
from resilient_flows.rundir import EventLog, read_events, request_preemption
from resilient_flows.training import MemberSpec, latest_committed_step
from resilient_flows.workflow._status import MemberStatus
from resilient_flows.workflow.schema import AnalyticsConfig, CoschedConfig

#: Parsl HTEX priority of on-demand analytics: lower runs first, members have none (last).
ANALYTICS_PRIORITY = 0
#: Parsl HTEX priority of a member's retry after the machine's fault: after analytics, ahead of
#: the members that wait for their first start (see :class:`~resilient_flows.apps.ResumingRetryHandler`).
LOST_PRIORITY = 1


def worker_slots(config: Config) -> int:
    """How many tasks the configuration runs at once: workers per node x nodes per block x blocks."""
    total = 0
    for executor in config.executors:
        if isinstance(executor, HighThroughputExecutor):
            per_node = executor.max_workers_per_node
            per_node = os.cpu_count() or 1 if math.isinf(per_node) else int(per_node)
            provider = executor.provider
            if provider is None:  # never: Parsl gives every HighThroughputExecutor a provider
                raise WorkflowError(f"executor {executor.label} has no provider")
            total += per_node * provider.nodes_per_block * max(1, provider.max_blocks)
        elif isinstance(executor, ThreadPoolExecutor):
            # None: as many threads as concurrent.futures gives a pool by default
            total += executor.max_threads or min(32, (os.cpu_count() or 1) + 4)
        else:
            total += 1
    return total


def job_record(job: RunningJob) -> dict[str, Any]:
    """A running job as strict JSON (an unknown end is null)."""
    record = asdict(job)
    record["end"] = None if math.isinf(job.end) else job.end
    return record


def job_from_record(record: dict[str, Any]) -> RunningJob:
    return RunningJob(**{**record, "end": math.inf if record["end"] is None else record["end"]})


@dataclass
class _Fired:
    """A request that has fired: its tasks, and the preemption it still has to carry out."""

    config: AnalyticsConfig
    requested_at: float
    parts: list[str]
    futures: list[Future]
    victims: tuple[str, ...] = ()
    preempt_at: float | None = None


class OnDemandAnalytics:
    """The runner's side of the workflow's ``analytics`` list; call :meth:`update` on every poll."""

    def __init__(
        self,
        requests: Iterable[AnalyticsConfig],
        cosched: CoschedConfig,
        run_dir: Path,
        slots: int,
        submit: Callable[[list[dict[str, Any]], str, int | None], Future],
    ) -> None:
        self.pending = list(requests)
        self.cosched = cosched
        self.run_dir = run_dir
        self.slots = slots
        self.submit = submit
        self.events = EventLog(run_dir)
        self.fired: list[_Fired] = []
        for request in self.pending:
            if request.slots is not None and request.slots > slots:
                raise WorkflowError(
                    f"analytics {request.name!r} needs {request.slots} worker slots; the site has {slots}"
                )

    @property
    def futures(self) -> list[Future]:
        return [f for fired in self.fired for f in fired.futures]

    def drop_unfinished(self) -> None:
        """Forget the tasks of a Parsl instance that was given up: they will never complete."""
        for fired in self.fired:
            fired.futures = [f for f in fired.futures if f.done()]

    def update(self, elapsed: float, members: list[MemberSpec], statuses: dict[str, MemberStatus]) -> None:
        for request in [r for r in self.pending if self._due(r, elapsed, statuses)]:
            self.pending.remove(request)
            self._fire(request, members, statuses)
        now = time.time()
        for fired in self.fired:
            if fired.preempt_at is not None and now >= fired.preempt_at:
                fired.preempt_at = None
                started, _ = analytics_parts(read_events(self.run_dir))
                if not set(fired.parts) <= started:
                    self._preempt(fired, statuses)

    @staticmethod
    def _due(request: AnalyticsConfig, elapsed: float, statuses: dict[str, MemberStatus]) -> bool:
        if request.after_s is not None:
            return request.after_s <= elapsed
        when = request.when
        if when is None:  # never: the schema gives a request either after or when
            raise WorkflowError("an analytics request needs 'after' or 'when'")
        status = statuses.get(when.member)
        return status is not None and status.step is not None and status.step >= when.step

    def _fire(self, request: AnalyticsConfig, members: list[MemberSpec], statuses: dict[str, MemberStatus]) -> None:
        chosen = [m.to_dict() for m in members if request.members == "all" or m.name in request.members]
        count = request.slots or 1
        parts = part_names(request.name, count)
        priority = None if request.slots is None else ANALYTICS_PRIORITY
        futures = [self.submit(chosen[i::count], part, priority) for i, part in enumerate(parts)]
        fired = _Fired(request, time.time(), parts, futures)
        self.fired.append(fired)
        if request.slots is None:
            return
        now = fired.requested_at
        events = list(read_events(self.run_dir))
        jobs = running_jobs(events, self.run_dir, members, statuses, now)
        started, finished = analytics_parts(events)
        free = max(0, self.slots - len(jobs) - len(started - finished))
        ask = OnDemandRequest(nodes=request.slots, arrival=now, duration=request.duration_s, id=request.name)
        c = self.cosched
        decision = decide(
            c.policy,
            now=now,
            free_nodes=free,
            running=jobs,
            request=ask,
            alpha=c.alpha,
            beta=c.beta,
            max_delay=c.max_delay_s,
        )
        self.events.emit(
            "ondemand",
            None,
            request=request.name,
            slots=request.slots,
            policy=c.policy,
            alpha=c.alpha,
            beta=c.beta,
            max_delay=c.max_delay_s,
            now=now,
            free=free,
            jobs=[job_record(j) for j in jobs],
            delay=decision.delay,
            preempt=list(decision.preempt),
            cost=decision.cost,
        )
        fired.victims = decision.preempt
        if decision.preempt:  # carried out by update(), in this very call when the delay is 0
            fired.preempt_at = now + decision.delay

    def _preempt(self, fired: _Fired, statuses: dict[str, MemberStatus]) -> None:
        for name in fired.victims:
            status = statuses.get(name)
            if status is not None and status.state == "running":
                request_preemption(self.run_dir, name, reason=f"on-demand analytics {fired.config.name}")


def part_names(request: str, slots: int) -> list[str]:
    """The names of a request's analytics tasks, one per slot, as their events carry them."""
    return [request] if slots == 1 else [f"{request}.{i}" for i in range(slots)]


def analytics_parts(events: Iterable[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """The analytics tasks that have started, and those that have finished."""
    started, finished = set(), set()
    for e in events:
        if e["kind"] == "analytics_started":
            started.add(e["request"])
        elif e["kind"] == "analytics":
            finished.add(e["request"])
    return started, finished


def running_jobs(
    events: list[dict[str, Any]],
    run_dir: Path,
    members: list[MemberSpec],
    statuses: dict[str, MemberStatus],
    now: float,
) -> list[RunningJob]:
    """The members that hold a worker slot now, as the co-scheduling policy sees them."""
    restart = _restart_cost(events)
    jobs = []
    for member in members:
        status = statuses.get(member.name)
        if status is None or status.state != "running":
            continue
        mine = [e for e in events if e.get("member") == member.name]
        started = next((e for e in reversed(mine) if e["kind"] == "started"), None)
        if started is None:
            continue
        start = min(float(started["time"]), now)
        attempt = int(started.get("attempt") or 1)
        since = [e for e in mine if e["time"] >= started["time"]]
        saves = [float(e["time"]) for e in since if e["kind"] == "checkpointed"]
        committed = latest_committed_step(run_dir, member)
        last = next(
            (float(e["time"]) for e in reversed(since) if e["kind"] == "checkpointed" and e["step"] <= committed),
            None,
        )
        pace = _seconds_per_step(status, attempt)
        jobs.append(
            RunningJob(
                id=member.name,
                nodes=1,
                start=start,
                end=_expected_end(status, pace, now),
                last_checkpoint=None if last is None else min(max(last, start), now),
                checkpoint_interval=_interval(saves, member, pace),
                restart_cost=restart if restart is not None else _startup(status, attempt, start),
            )
        )
    return jobs


def _seconds_per_step(status: MemberStatus, attempt: int) -> float | None:
    metrics = status.metrics
    if metrics is None or attempt not in metrics.attempt_times:
        return None
    (first_step, last_step), (began, latest) = metrics.attempt_spans[attempt], metrics.attempt_times[attempt]
    return (latest - began) / (last_step - first_step) if last_step > first_step and latest > began else None


def _expected_end(status: MemberStatus, pace: float | None, now: float) -> float:
    if pace is None or status.step is None:
        return math.inf
    return now + max(1, status.steps - 1 - status.step) * pace


def _interval(saves: list[float], member: MemberSpec, pace: float | None) -> float | None:
    """The observed period of this attempt's checkpoints, else the configured one at its pace."""
    if len(saves) >= 2:
        gap = statistics.median(b - a for a, b in itertools.pairwise(saves))
        if gap > 0:
            return gap
    spec = member.checkpoint
    periods = [spec.interval_s] if spec.interval_s else []
    if spec.interval_steps and pace:
        periods.append(spec.interval_steps * pace)
    return min(periods) if periods else None


def _restart_cost(events: list[dict[str, Any]]) -> float | None:
    """The median time from a retry's start to its restored state, over this run's resumes."""
    started: dict[tuple[str | None, int], float] = {}
    gaps = []
    for e in events:
        key = (e.get("member"), int(e.get("attempt") or 0))
        if e["kind"] == "started":
            started[key] = float(e["time"])
        elif e["kind"] == "resumed" and key in started:
            gaps.append(float(e["time"]) - started[key])
    return statistics.median(gaps) if gaps else None


def _startup(status: MemberStatus, attempt: int, start: float) -> float:
    """Before any resume: from this attempt's start to its first step, what a restart repeats."""
    times = None if status.metrics is None else status.metrics.attempt_times.get(attempt)
    return 0.0 if times is None else max(0.0, times[0] - start)
