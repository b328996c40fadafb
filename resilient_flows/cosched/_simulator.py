"""Replay a batch job trace on a machine of ``N`` nodes while on-demand requests arrive, under one policy.

Batch jobs are scheduled first come, first served with EASY backfilling. Each on-demand request is
answered by :func:`~resilient_flows.cosched._policies.decide` with the running batch jobs as they
stand, and the simulator carries the decision out: it holds free nodes for the request, preempts
the victims at the chosen time and requeues them at the head of the batch queue, where they resume
from their newest checkpoint. Every allocation is recorded, so that what a policy costs (lost work,
the request's wait, the batch jobs' slowdown) is measured rather than predicted.

What is modelled and what is not:

- A job's estimate is its requested time, but never less than its run time: a job that overran its
  request in the log is given its run time as estimate, so that an estimated end is never before
  the real one (a policy that waits for a job to end can count on it).
- Batch jobs checkpoint every ``interval`` seconds from the start of each run segment; writing a
  checkpoint costs no run time here (the overhead is the same for every policy and would only
  shift all figures). The interval is fixed, or Young's ``sqrt(2 * C * MTBF_job)``.
- Failures are not simulated; the MTBF only sets Young's interval.
- A resumed job always pays the restart cost (reading its checkpoint and re-initialising), as the
  decision's objective assumes; the first run of a job pays none.
- On-demand jobs run for exactly their duration and are never preempted.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from resilient_flows.cosched._jobs import TIME_SLACK, Decision, OnDemandRequest, RunningJob
from resilient_flows.cosched._policies import decide
from resilient_flows.cosched._swf import SwfJob
from resilient_flows.errors import InvalidJobError
from resilient_flows.mlc._analytic import young_interval

#: Checkpoint period when neither an interval nor Young's inputs are given: hourly, a common
#: setting for long training runs.
DEFAULT_CHECKPOINT_INTERVAL = 3600.0
#: Seconds a preempted job spends getting back to where its checkpoint left it.
DEFAULT_RESTART_COST = 120.0
#: Shortest run time in the bounded slowdown, so that jobs of a few seconds do not dominate it.
SLOWDOWN_BOUND = 10.0

# Event kinds. Every event at one time is applied before anything is scheduled, so events are
# ordered by time and then by when they were pushed: submissions keep the trace's order.
_END, _ONDEMAND_END, _DEADLINE, _ONDEMAND_ARRIVAL, _SUBMIT = range(5)


@dataclass(frozen=True)
class SimConfig:
    """One simulation: the machine, the policy and its weights, and how batch jobs checkpoint.

    Parameters
    ----------
    nodes:
        Nodes of the machine. Trace jobs larger than this are skipped and counted.
    policy:
        A policy name for :func:`~resilient_flows.cosched._policies.decide`.
    alpha, beta, max_delay, seed:
        Passed to ``decide``; request ``i`` (from 0) gets ``seed + i`` so that ``"random"`` varies
        between requests yet replays identically.
    checkpoint_interval:
        Seconds between a batch job's checkpoints.
    checkpoint_cost, mtbf:
        Seconds to write a checkpoint and the machine's mean time between failures: together, and
        instead of ``checkpoint_interval``, they give each job Young's interval.
        Neither given: every job checkpoints every :data:`DEFAULT_CHECKPOINT_INTERVAL` seconds.
    restart_cost:
        Seconds a preempted job spends resuming before it makes progress again.
    """

    nodes: int
    policy: str = "dp"
    alpha: float = 1.0
    beta: float = 1.0
    max_delay: float = 1800.0
    seed: int | None = 0
    checkpoint_interval: float | None = None
    checkpoint_cost: float | None = None
    mtbf: float | None = None
    restart_cost: float = DEFAULT_RESTART_COST

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes <= 0:
            raise InvalidJobError(f"nodes must be a positive whole number, got {self.nodes!r}")
        if (self.checkpoint_cost is None) != (self.mtbf is None):
            raise InvalidJobError("checkpoint_cost and mtbf: give both (Young's interval) or neither")
        if self.checkpoint_cost is not None and self.checkpoint_interval is not None:
            raise InvalidJobError("checkpoint_interval: give it, or checkpoint_cost and mtbf, not both")
        for name in ("checkpoint_interval", "checkpoint_cost", "mtbf"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise InvalidJobError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if not (math.isfinite(self.restart_cost) and self.restart_cost >= 0):
            raise InvalidJobError(f"restart_cost must be a finite number of seconds >= 0, got {self.restart_cost!r}")

    def interval_for(self, job_nodes: int) -> float:
        """Checkpoint period of a job on ``job_nodes`` nodes: Young's interval for the job's own MTBF,
        ``mtbf * nodes / job_nodes`` (node failures are taken as independent, so a job on a fraction
        of the machine fails that much less often and can checkpoint more rarely)."""
        if self.checkpoint_cost is not None and self.mtbf is not None:
            return young_interval(self.checkpoint_cost, self.mtbf * self.nodes / job_nodes)
        return DEFAULT_CHECKPOINT_INTERVAL if self.checkpoint_interval is None else self.checkpoint_interval


@dataclass(frozen=True)
class OnDemandStream:
    """A seeded Poisson stream of on-demand requests.

    Requests arrive at ``rate_per_hour`` on average; each draws its node count uniformly from
    ``nodes`` and its duration uniformly from ``durations``, or, when ``mean_duration`` is given,
    from an exponential distribution of that mean (interactive sessions: mostly short, a few long).
    One stream, replayed for every policy, makes their figures comparable request for request.
    """

    rate_per_hour: float
    nodes: tuple[int, ...] = (128,)
    durations: tuple[float, ...] = (1800.0,)
    mean_duration: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate_per_hour) and self.rate_per_hour >= 0):
            raise InvalidJobError(f"on-demand rate must be a finite number >= 0 per hour, got {self.rate_per_hour!r}")
        if not self.nodes or any(isinstance(n, bool) or not isinstance(n, int) or n <= 0 for n in self.nodes):
            raise InvalidJobError(f"on-demand nodes must be positive whole numbers, got {self.nodes!r}")
        durations = self.durations if self.mean_duration is None else (self.mean_duration,)
        if not durations or any(not (math.isfinite(d) and d > 0) for d in durations):
            raise InvalidJobError(f"on-demand durations must be positive seconds, got {durations!r}")

    def requests(self, start: float, end: float) -> list[OnDemandRequest]:
        """The requests arriving in ``[start, end)``, ids ``od-1``, ``od-2``, ... in arrival order."""
        rng = np.random.default_rng(self.seed)
        if self.rate_per_hour == 0 or end <= start:
            return []
        expected = (end - start) * self.rate_per_hour / 3600.0
        count = int(expected + 10 * math.sqrt(expected) + 10)  # enough gaps that the sum passes `end`
        arrivals = start + np.cumsum(rng.exponential(3600.0 / self.rate_per_hour, count))
        arrivals = arrivals[arrivals < end]
        nodes = rng.choice(np.array(self.nodes), len(arrivals))
        if self.mean_duration is None:
            durations = rng.choice(np.array(self.durations, dtype=float), len(arrivals))
        else:
            durations = np.maximum(rng.exponential(self.mean_duration, len(arrivals)), 1.0)
        return [
            OnDemandRequest(nodes=int(n), arrival=float(a), duration=float(d), id=f"od-{i + 1}")
            for i, (a, n, d) in enumerate(zip(arrivals, nodes, durations, strict=True))
        ]


@dataclass(frozen=True, slots=True)
class Segment:
    """Nodes held by one job from ``start`` to ``end``: a batch job's run segment or an on-demand job.

    A preempted segment names its newest checkpoint (its ``start`` if none was taken) and the work
    it lost, ``nodes * (end - checkpoint)`` node-seconds; ``restart`` is the seconds it spent at its
    beginning resuming from the previous segment.
    """

    job: str
    kind: str  # "batch" or "on-demand"
    nodes: int
    start: float
    end: float
    preempted: bool = False
    restart: float = 0.0
    checkpoint: float | None = None
    lost: float = 0.0


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One on-demand request: when it was decided, what the policy said, when it started and whom it preempted.

    ``preempted`` may be fewer than ``decision.preempt`` (victims that ended on their own, or whose
    nodes were no longer needed), and ``start`` earlier than ``decided_at + decision.delay`` when
    jobs ended before their estimates.
    """

    request: OnDemandRequest
    decided_at: float
    decision: Decision
    start: float
    preempted: tuple[str, ...]

    @property
    def wait(self) -> float:
        return self.start - self.request.arrival


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A batch job's life: submitted, first started, finished, and how often it was preempted."""

    id: str
    nodes: int
    submit: float
    run_time: float
    estimate: float
    first_start: float
    finish: float
    preemptions: int

    @property
    def bounded_slowdown(self) -> float:
        return max(1.0, (self.finish - self.submit) / max(self.run_time, SLOWDOWN_BOUND))


#: Unit of every figure in :class:`SimMetrics`, for tables and JSON.
METRIC_UNITS = {
    "ondemand_requests": "requests",
    "wait_mean": "s",
    "wait_p95": "s",
    "wait_max": "s",
    "lost_node_hours": "node-h",
    "restart_node_hours": "node-h",
    "preemptions": "preemptions",
    "bounded_slowdown": "ratio",
    "utilization": "fraction",
    "decisions_per_second": "1/s",
    "objective": "weighted node-h",
    "jobs_finished": "jobs",
    "jobs_total": "jobs",
    "elapsed": "s",
}


@dataclass(frozen=True)
class SimMetrics:
    """The figures one run is judged by; :data:`METRIC_UNITS` gives their units.

    ``objective`` is the sum of the decisions' own costs (``alpha`` node-seconds waited plus
    ``beta`` node-seconds lost and restarting, in hours), the quantity the policies minimise.
    ``utilization`` counts every allocated node-second (lost work and restarts included) over the
    machine's node-seconds from the first submission to the last completion. Without any
    request, the waits are 0 and ``decisions_per_second`` is None.
    """

    ondemand_requests: int
    wait_mean: float
    wait_p95: float
    wait_max: float
    lost_node_hours: float
    restart_node_hours: float
    preemptions: int
    bounded_slowdown: float
    utilization: float
    decisions_per_second: float | None
    objective: float
    jobs_finished: int
    jobs_total: int
    elapsed: float


@dataclass(frozen=True)
class TraceSimResult:
    """What happened in one run: every allocation, every decision, every batch job, and the metrics."""

    config: SimConfig
    segments: tuple[Segment, ...]
    decisions: tuple[DecisionRecord, ...]
    jobs: tuple[JobRecord, ...]
    metrics: SimMetrics
    skipped: dict[str, int] = field(default_factory=dict)

    def busy_nodes(self) -> list[tuple[float, int]]:
        """Nodes allocated from each time on, as ``(time, nodes)`` steps: the allocation timeline."""
        deltas: dict[float, int] = {}
        for seg in self.segments:
            deltas[seg.start] = deltas.get(seg.start, 0) + seg.nodes
            deltas[seg.end] = deltas.get(seg.end, 0) - seg.nodes
        steps, busy = [], 0
        for t in sorted(deltas):
            busy += deltas[t]
            steps.append((t, busy))
        return steps


def simulate_trace(
    jobs: Iterable[SwfJob],
    config: SimConfig,
    ondemand: Sequence[OnDemandRequest] = (),
    *,
    ondemand_queue: int | None = None,
) -> TraceSimResult:
    """Replay ``jobs`` on ``config.nodes`` nodes, answering the ``ondemand`` requests with ``config.policy``.

    Parameters
    ----------
    jobs:
        Trace jobs (any order; replayed by submit time). Jobs without a run time or a processor
        count, and jobs larger than the machine, are skipped and counted in ``TraceSimResult.skipped``:
        a trace cut from a bigger machine stays usable, and the count says how much of it was.
    config:
        The machine, policy and checkpointing.
    ondemand:
        Requests, e.g. from :meth:`OnDemandStream.requests`.
    ondemand_queue:
        Trace jobs in this SWF queue are on-demand requests (their run time as duration) rather
        than batch jobs.

    Raises
    ------
    InvalidJobError
        A request larger than the machine, or two requests with the same id.
    """
    batch, requests, skipped = _split_trace(jobs, config, ondemand_queue)
    requests = sorted([*ondemand, *requests], key=lambda r: (r.arrival, r.id))
    ids = [r.id for r in requests]
    if len(set(ids)) != len(ids):
        raise InvalidJobError("on-demand requests: ids must be unique")
    for request in requests:
        if request.nodes > config.nodes:
            raise InvalidJobError(
                f"on-demand request {request.id}: {request.nodes} nodes, more than the machine's {config.nodes}"
            )
    return _Simulation(config, batch, requests, skipped).run()


def _split_trace(
    jobs: Iterable[SwfJob], config: SimConfig, ondemand_queue: int | None
) -> tuple[list[_Job], list[OnDemandRequest], dict[str, int]]:
    skipped = {"no run time": 0, "no node count": 0, "larger than the machine": 0}
    batch, requests, numbers = [], [], set()
    for job in jobs:
        if job.job_number in numbers:
            raise InvalidJobError(f"job {job.job_number}: the trace has this job number twice; ids must be unique")
        numbers.add(job.job_number)
        nodes = job.processors
        if job.run_time <= 0:
            skipped["no run time"] += 1
        elif nodes <= 0:
            skipped["no node count"] += 1
        elif nodes > config.nodes:
            skipped["larger than the machine"] += 1
        elif ondemand_queue is not None and job.queue == ondemand_queue:
            requests.append(
                OnDemandRequest(nodes=nodes, arrival=job.submit_time, duration=job.run_time, id=f"swf-{job.job_number}")
            )
        else:
            batch.append(_Job(job, nodes, config.interval_for(nodes)))
    batch.sort(key=lambda j: (j.submit, j.number))
    return batch, requests, skipped


class _Job:
    """A batch job's mutable state while it is simulated."""

    __slots__ = (
        "done",
        "estimate",
        "finish",
        "first_start",
        "id",
        "interval",
        "nodes",
        "number",
        "preemptions",
        "restart",
        "seg_start",
        "submit",
        "token",
        "work",
    )

    def __init__(self, job: SwfJob, nodes: int, interval: float) -> None:
        self.id = str(job.job_number)
        self.number = job.job_number
        self.nodes = nodes
        self.submit = job.submit_time
        self.work = job.run_time
        self.estimate = max(job.requested_time, job.run_time)
        self.interval = interval
        self.done = 0.0  # work committed by checkpoints of earlier segments
        self.restart = 0.0  # restart seconds at the beginning of the current segment
        self.seg_start = 0.0
        self.token = 0  # bumped at each preemption so that the old segment's end event is ignored
        self.first_start = -1.0
        self.finish = -1.0
        self.preemptions = 0

    def expected_length(self, restart_cost: float) -> float:
        """Seconds its next segment is expected to hold its nodes."""
        return (restart_cost if self.preemptions else 0.0) + self.estimate - self.done

    def view(self, now: float, restart_cost: float) -> RunningJob:
        """The running job as a policy sees it: checkpoints at ``seg_start + k * interval``."""
        elapsed = now - self.seg_start
        k = math.floor(elapsed / self.interval + TIME_SLACK)
        last = min(now, self.seg_start + k * self.interval) if k >= 1 else None
        end = self.seg_start + self.restart + self.estimate - self.done
        return RunningJob(self.id, self.nodes, self.seg_start, end, last, self.interval, restart_cost)


@dataclass
class _Pending:
    request: OnDemandRequest
    decided_at: float
    decision: Decision
    start_by: float
    victims: dict[str, RunningJob]  # as the policy saw them, so that their loss is what it predicted


class _Simulation:
    def __init__(self, config: SimConfig, batch: list[_Job], requests: list[OnDemandRequest], skipped: dict) -> None:
        self.config = config
        self.batch = batch
        self.requests = requests
        self.skipped = skipped
        self.events: list[tuple] = []
        self.seq = 0
        self.free = config.nodes
        self.queue: list[_Job] = []  # head first
        self.running: dict[str, _Job] = {}
        self.batch_busy = 0
        self.ondemand_running: dict[str, tuple[float, int]] = {}  # id -> (end, nodes)
        self.ondemand_queue: deque[OnDemandRequest] = deque()
        self.pending: _Pending | None = None
        self.segments: list[Segment] = []
        self.decisions: list[DecisionRecord] = []
        self.decide_seconds = 0.0

    def push(self, t: float, kind: int, payload: object, token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload, token))

    def run(self) -> TraceSimResult:
        started = time.perf_counter()
        for job in self.batch:
            self.push(job.submit, _SUBMIT, job)
        for request in self.requests:
            self.push(request.arrival, _ONDEMAND_ARRIVAL, request)
        events = self.events
        while events:
            now = events[0][0]
            while events and events[0][0] == now:
                _, _, kind, payload, token = heapq.heappop(events)
                if kind == _END:
                    if payload.token == token:
                        self.finish(payload, now)
                elif kind == _ONDEMAND_END:
                    self.release(self.ondemand_running.pop(payload)[1])
                elif kind == _SUBMIT:
                    self.queue.append(payload)
                elif kind == _ONDEMAND_ARRIVAL:
                    self.ondemand_queue.append(payload)
                # a _DEADLINE only wakes the dispatcher up
            self.serve_ondemand(now)
            self.schedule_batch(now)
        return self.result(time.perf_counter() - started)

    # -- batch jobs ---------------------------------------------------------------------------

    def start(self, job: _Job, now: float) -> None:
        job.restart = self.config.restart_cost if job.preemptions else 0.0
        job.seg_start = now
        if job.first_start < 0:
            job.first_start = now
        self.take(job.nodes)
        self.batch_busy += job.nodes
        self.running[job.id] = job
        self.push(now + job.restart + job.work - job.done, _END, job, job.token)

    def finish(self, job: _Job, now: float) -> None:
        self.release(job.nodes)
        self.batch_busy -= job.nodes
        del self.running[job.id]
        job.finish = now
        self.segments.append(Segment(job.id, "batch", job.nodes, job.seg_start, now, restart=job.restart))

    def preempt(self, view: RunningJob, now: float) -> None:
        job = self.running.pop(view.id)
        checkpoint = view.checkpoint_at(now)
        job.done += max(0.0, checkpoint - job.seg_start - job.restart)
        lost = job.nodes * (now - checkpoint)
        self.segments.append(
            Segment(job.id, "batch", job.nodes, job.seg_start, now, True, job.restart, checkpoint, lost)
        )
        self.release(job.nodes)
        self.batch_busy -= job.nodes
        job.token += 1
        job.preemptions += 1

    def schedule_batch(self, now: float) -> None:
        """FCFS with EASY backfilling on the nodes that no pending on-demand request needs."""
        queue = self.queue
        if not queue:
            return
        hold = self.pending.request.nodes if self.pending else 0
        avail = self.free - hold
        restart = self.config.restart_cost
        head = 0
        while head < len(queue) and queue[head].nodes <= avail:
            avail -= queue[head].nodes
            self.start(queue[head], now)
            head += 1
        del queue[:head]
        if not queue or avail <= 0:
            return
        shadow, extra = self.shadow(now, queue[0].nodes, avail, hold)
        started = False
        for job in queue[1:]:
            if job.nodes <= avail:
                before_shadow = now + job.expected_length(restart) <= shadow
                if before_shadow or job.nodes <= extra:
                    avail -= job.nodes
                    if not before_shadow:
                        extra -= job.nodes
                    self.start(job, now)
                    started = True
                    if avail <= 0:
                        break
        if started:
            self.queue = [job for job in queue if job.id not in self.running]

    def shadow(self, now: float, need: int, avail: int, hold: int) -> tuple[float, int]:
        """When the queue's head can start by the running jobs' estimates, and the nodes to spare then.

        A pending request's hold comes back when it is expected to end; its victims' nodes are not
        counted as coming back early (the reservation errs late, never early).
        """
        ends = [(job.seg_start + job.restart + job.estimate - job.done, job.nodes) for job in self.running.values()]
        ends.extend(self.ondemand_running.values())
        if self.pending is not None:
            ends.append((max(now, self.pending.start_by) + self.pending.request.duration, hold))
        ends.sort()
        for i, (end, nodes) in enumerate(ends):
            avail += nodes
            if avail >= need and (i + 1 == len(ends) or ends[i + 1][0] > end):
                return end, avail - need
        raise AssertionError("the head of the queue is larger than the machine")

    # -- on-demand requests -------------------------------------------------------------------

    def serve_ondemand(self, now: float) -> None:
        """Decide for the request at the head of the on-demand queue, and start it when its time comes."""
        while True:
            if self.pending is None:
                if not self.ondemand_queue:
                    return
                request = self.ondemand_queue[0]
                if request.nodes > self.free + self.batch_busy:
                    return  # on-demand jobs hold the rest: wait until they end
                self.ondemand_queue.popleft()
                self.pending = self.ask_policy(request, now)
                if self.pending.start_by > now:
                    self.push(self.pending.start_by, _DEADLINE, None)
            pending = self.pending
            need = pending.request.nodes - self.free
            if need <= 0:
                self.start_ondemand(pending, now, ())
            elif now >= pending.start_by:
                self.start_ondemand(pending, now, self.victims_needed(pending, need, now))
            else:
                return

    def ask_policy(self, request: OnDemandRequest, now: float) -> _Pending:
        restart = self.config.restart_cost
        running = [job.view(now, restart) for job in self.running.values()]
        seed = None if self.config.seed is None else self.config.seed + len(self.decisions)
        tic = time.perf_counter()
        decision = decide(
            self.config.policy,
            now=now,
            free_nodes=self.free,
            running=running,
            request=request,
            alpha=self.config.alpha,
            beta=self.config.beta,
            max_delay=self.config.max_delay,
            seed=seed,
        )
        self.decide_seconds += time.perf_counter() - tic
        by_id = {job.id: job for job in running}
        unknown = [v for v in decision.preempt if v not in by_id]
        if unknown:
            raise RuntimeError(f"policy {self.config.policy!r} preempts {unknown}, which are not running")
        victims = {v: by_id[v] for v in decision.preempt}
        return _Pending(request, now, decision, now + decision.delay, victims)

    def victims_needed(self, pending: _Pending, need: int, now: float) -> list[RunningJob]:
        """The decided victims still running, less the costliest ones whose nodes are no longer needed."""
        alive = [view for view in pending.victims.values() if view.id in self.running]
        total = sum(view.nodes for view in alive)
        if total < need:
            raise RuntimeError(
                f"policy {self.config.policy!r} planned {pending.request.id} at {now} but its victims "
                f"leave it {need - total} nodes short"
            )
        chosen = []
        for view in sorted(alive, key=lambda v: (-v.nodes * v.lost_at(now), v.id)):
            if total - view.nodes >= need:
                total -= view.nodes
            else:
                chosen.append(view)
        return chosen

    def start_ondemand(self, pending: _Pending, now: float, victims: Sequence[RunningJob]) -> None:
        requeued = sorted((self.running[v.id] for v in victims), key=lambda j: (j.submit, j.number))
        for view in victims:
            self.preempt(view, now)
        self.queue[:0] = requeued  # back to the head of the queue, in submission order
        request = pending.request
        self.take(request.nodes)
        end = now + request.duration
        self.ondemand_running[request.id] = (end, request.nodes)
        self.push(end, _ONDEMAND_END, request.id)
        self.segments.append(Segment(request.id, "on-demand", request.nodes, now, end))
        self.decisions.append(
            DecisionRecord(request, pending.decided_at, pending.decision, now, tuple(v.id for v in victims))
        )
        self.pending = None

    # -- bookkeeping --------------------------------------------------------------------------

    def take(self, nodes: int) -> None:
        if nodes > self.free:
            raise AssertionError(f"allocating {nodes} nodes with {self.free} free")
        self.free -= nodes

    def release(self, nodes: int) -> None:
        self.free += nodes

    def result(self, elapsed: float) -> TraceSimResult:
        records = tuple(
            JobRecord(j.id, j.nodes, j.submit, j.work, j.estimate, j.first_start, j.finish, j.preemptions)
            for j in self.batch
        )
        waits = np.array([d.wait for d in self.decisions]) if self.decisions else np.zeros(1)
        span_start = min([j.submit for j in self.batch] + [r.arrival for r in self.requests], default=0.0)
        span_end = max((s.end for s in self.segments), default=span_start)
        used = sum(s.nodes * (s.end - s.start) for s in self.segments)
        preempted = [s for s in self.segments if s.preempted]
        finished = [r for r in records if r.finish >= 0]
        restarts = sum(s.nodes * s.restart for s in self.segments)
        metrics = SimMetrics(
            ondemand_requests=len(self.decisions),
            wait_mean=float(waits.mean()),
            wait_p95=float(np.percentile(waits, 95)),
            wait_max=float(waits.max()),
            lost_node_hours=sum(s.lost for s in preempted) / 3600.0,
            restart_node_hours=restarts / 3600.0,
            preemptions=len(preempted),
            bounded_slowdown=float(np.mean([r.bounded_slowdown for r in finished])) if finished else 1.0,
            utilization=used / (self.config.nodes * (span_end - span_start)) if span_end > span_start else 0.0,
            decisions_per_second=len(self.decisions) / self.decide_seconds if self.decide_seconds > 0 else None,
            objective=sum(d.decision.cost for d in self.decisions) / 3600.0,
            jobs_finished=len(finished),
            jobs_total=len(records),
            elapsed=elapsed,
        )
        return TraceSimResult(self.config, tuple(self.segments), tuple(self.decisions), records, metrics, self.skipped)
