"""The preemption agent: watch a batch system's queue, ask :func:`decide`, act with the scheduler's commands.

Slurm's and PBS Pro's own preemption pick victims by priority and age; they do not know when a
job last checkpointed, so they can throw away hours of work to free nodes a few minutes early.
The agent knows: every :class:`~resilient_flows.checkpoint.Checkpointer` publishes a heartbeat
(:mod:`~resilient_flows.checkpoint.heartbeat`), and a job's comment points to it.

Each poll:

1. read the jobs and the free capacity (one ``squeue`` and one ``sinfo``, or their PBS Pro
   equivalents); a failing or slow scheduler makes the agent back off, doubling its wait up to
   :data:`MAX_BACKOFF` polls, and say so in its log;
2. move the preemptions under way along: a signalled victim that has exited (after its
   checkpoint), or that outlived its ``grace``, is requeued and held; a held victim is released
   once the request it made room for runs or is gone, so that it cannot jump ahead of it;
3. for each pending on-demand job (in the on-demand partition, or with ``rf-ondemand`` in its
   comment) not yet served: describe the running batch jobs the agent may touch as
   :class:`RunningJob` (heartbeats give ``last_checkpoint``, ``checkpoint_interval`` and
   ``restart_cost``; a job without one counts as "no checkpoint since start", the conservative
   choice), ask :func:`decide`, and carry the decision out: signal the victims now, or hold off
   and decide again at the next poll, as the workflow runner does.

Every decision goes to ``events.jsonl`` with its inputs, so that ``decide(**event["inputs"])``
replays it. The agent never signals a job outside the configured partitions and users, nor an
on-demand job, and reports a request larger than the whole machine once without acting on it.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from resilient_flows.checkpoint.heartbeat import COMMENT_PREFIX, read_heartbeat
from resilient_flows.cosched.batch import UNITS, BatchCommandError, BatchJob, BatchSystem, Unit
from resilient_flows.cosched.jobs import Decision, OnDemandRequest, RunningJob
from resilient_flows.cosched.policies import POLICIES, decide
from resilient_flows.errors import InvalidJobError

__all__ = ["MAX_BACKOFF", "ONDEMAND_MARKER", "Agent", "AgentConfig", "running_job"]

logger = logging.getLogger(__name__)

ONDEMAND_MARKER = "rf-ondemand"
#: The longest wait after failed polls, in poll intervals.
MAX_BACKOFF = 16
#: A job whose time limit is unknown is taken to run this much longer (it ends "never").
NO_END = 365 * 86400.0


@dataclass(frozen=True)
class AgentConfig:
    """What the agent may do, and how it weighs the request's wait against the victims' lost work.

    ``partitions`` and ``users`` restrict the victims (empty: any batch job); on-demand jobs are
    never victims. ``grace`` is how long a signalled victim gets to checkpoint and exit before it
    is requeued anyway (which kills it). ``restart_cost`` stands in for jobs without a heartbeat.
    ``prioritize`` puts a served request ahead of every other pending job, where the batch system
    lets the agent (:attr:`~resilient_flows.cosched.batch.BatchSystem.can_prioritize`): else a
    pending batch job ranked higher could take the nodes its victims free.
    """

    ondemand_partition: str | None = None
    ondemand_marker: str = ONDEMAND_MARKER
    partitions: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    policy: str = "dp"
    alpha: float = 1.0
    beta: float = 1.0
    max_delay: float = 1800.0
    interval: float = 5.0
    signal: str = "USR1"
    grace: float = 60.0
    restart_cost: float = 60.0
    unit: Unit = "nodes"
    prioritize: bool = True
    dry_run: bool = False

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "max_delay", "grace", "restart_cost"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise InvalidJobError(f"{name} must be a finite number >= 0, got {value!r}")
        if (
            isinstance(self.interval, bool)
            or not isinstance(self.interval, int | float)
            or not 0 < self.interval < math.inf
        ):
            raise InvalidJobError(f"interval must be a finite number of seconds > 0, got {self.interval!r}")
        if self.policy not in POLICIES:
            raise InvalidJobError(f"policy: unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.unit not in UNITS:
            raise InvalidJobError(f"unit must be one of {', '.join(UNITS)}, got {self.unit!r}")
        if not self.signal.isalnum():
            raise InvalidJobError(f"signal must be a signal name or number such as USR1, got {self.signal!r}")
        if not self.ondemand_marker.strip() and self.ondemand_partition is None:
            raise InvalidJobError("ondemand_marker is empty and no on-demand partition is given: nothing is on demand")


@dataclass
class _Preemption:
    """A victim on its way out for ``request``: signalled, then requeued and held, then released."""

    request: str
    signalled: float
    requeued: float | None = None


@dataclass
class Agent:
    """One agent, for one batch system. :meth:`poll` is one round; :meth:`run` loops."""

    batch: BatchSystem
    config: AgentConfig = field(default_factory=AgentConfig)
    log_path: Path | None = None
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    preempting: dict[str, _Preemption] = field(default_factory=dict)
    served: dict[str, float] = field(default_factory=dict)  # request id -> when its victims were signalled
    reported: set[str] = field(default_factory=set)
    failures: int = 0

    def run(self, *, polls: int | None = None) -> None:
        """Poll every ``interval`` seconds (longer after failures), ``polls`` times or forever."""
        done = 0
        while polls is None or done < polls:
            self.poll()
            done += 1
            if polls is None or done < polls:
                self.sleep(self.config.interval * min(MAX_BACKOFF, 2 ** min(self.failures, 8)))

    def poll(self) -> list[dict[str, Any]]:
        """One round: look, move preemptions along, decide for new requests. The events it logged."""
        now = self.clock()
        try:
            jobs = self.batch.jobs()
            free = self.batch.free(self.config.unit)
        except BatchCommandError as exc:
            self.failures += 1
            wait = self.config.interval * min(MAX_BACKOFF, 2 ** min(self.failures, 8))
            return [self._log({"t": now, "event": "poll_failed", "error": str(exc), "next_poll_s": wait})]
        if self.failures:
            self._log({"t": now, "event": "poll_recovered", "after_failures": self.failures})
        self.failures = 0
        by_id = {job.id: job for job in jobs}
        events = self._advance(now, by_id)
        for request_id in [r for r in self.served if r not in by_id]:
            del self.served[request_id]
        requests = [
            job
            for job in sorted(jobs, key=lambda job: job.submitted)
            if job.state == "pending"
            and not job.held
            and self._ondemand(job)
            and job.id not in self.reported
            and now - self.served.get(job.id, -math.inf) >= self._patience
        ]
        if not requests:
            return events
        c = self.config
        machine = free + sum(job.size(c.unit) for job in jobs if job.state == "running")
        # read once per poll, whatever the number of requests: a heartbeat is a file on a shared file system
        candidates = {job.id: running_job(job, now, c.restart_cost, c.unit) for job in jobs if self._victim(job)}
        for request in requests:
            decided = self._decide(now, request, machine, candidates, free, jobs)
            events.extend(decided)
            if decided and request.id in self.served:  # what it takes of the free nodes is no one else's
                free = max(0, free - request.size(self.config.unit))
        return events

    @property
    def _patience(self) -> float:
        """How long a served request may stay pending before it is decided again (a victim that
        ignored its signal, a requeue that failed): its victims' grace and ten polls."""
        return self.config.grace + 10 * self.config.interval

    # ------------------------------------------------------------------ deciding

    def _ondemand(self, job: BatchJob) -> bool:
        c = self.config
        return (c.ondemand_partition is not None and job.queue == c.ondemand_partition) or (
            c.ondemand_marker in job.comment
        )

    def _victim(self, job: BatchJob) -> bool:
        c = self.config
        return (
            job.state == "running"
            and not self._ondemand(job)
            and job.id not in self.preempting
            and (not c.partitions or job.queue in c.partitions)
            and (not c.users or job.user in c.users)
        )

    def _decide(
        self,
        now: float,
        request: BatchJob,
        machine: int,
        candidates: dict[str, RunningJob],
        free: int,
        jobs: list[BatchJob],
    ) -> list[dict[str, Any]]:
        """The decision for ``request``, logged, then what carrying it out logged."""
        c = self.config
        need = request.size(c.unit)
        if need > machine:
            self.reported.add(request.id)
            return [
                self._log(
                    {
                        "t": now,
                        "event": "unfittable",
                        "request": request.id,
                        "needs": need,
                        "machine": machine,
                        "unit": c.unit,
                    }
                )
            ]
        running = [job for job_id, job in candidates.items() if job_id not in self.preempting]
        if need > free + sum(job.nodes for job in running):
            return []  # only jobs the agent may not touch stand in the way: Slurm's queue decides
        wanted = OnDemandRequest(nodes=need, arrival=request.submitted, duration=request.time_limit or 3600.0)
        inputs = {
            "policy": c.policy,
            "now": now,
            "free_nodes": free,
            "running": running,
            "request": wanted,
            "alpha": c.alpha,
            "beta": c.beta,
            "max_delay": c.max_delay,
        }
        try:
            decision = decide(**inputs)
        except InvalidJobError as exc:
            self.reported.add(request.id)
            return [self._log({"t": now, "event": "invalid", "request": request.id, "error": str(exc)})]
        # a preemption planned before the next poll is carried out at its time; a later one is
        # decided again at each poll until it is due
        act = bool(decision.preempt) and decision.delay <= c.interval
        event = {
            "t": now,
            "event": "decision",
            "request": request.id,
            "inputs": _jsonable(inputs),
            "decision": {**asdict(decision), "preempt": list(decision.preempt)},
            "acted": act and not c.dry_run,
            "dry_run": c.dry_run,
        }
        decided = [self._log(event)]
        if act:
            if decision.delay > 0:
                self.sleep(decision.delay)  # e.g. until a victim's next checkpoint, due sooner than the next poll
            decided += self._preempt(now + decision.delay, request.id, decision)
            decided += self._put_first(now + decision.delay, request, jobs)
        return decided

    def _preempt(self, now: float, request: str, decision: Decision) -> list[dict[str, Any]]:
        self.served[request] = now
        events: list[dict[str, Any]] = []
        for victim in decision.preempt:
            if not self.batch.requeues_exited:  # the requeue signals it (PBS Pro's qrerun)
                if self._act(lambda v=victim: self.batch.requeue(v, hold=True), now, "requeue", victim, events):
                    self.preempting[victim] = _Preemption(request, now, requeued=now)
                continue
            if not self.config.dry_run:
                try:
                    self.batch.signal(victim, self.config.signal)
                except BatchCommandError as exc:
                    events.append(self._log({"t": now, "event": "signal_failed", "job": victim, "error": str(exc)}))
                    continue
            self.preempting[victim] = _Preemption(request, now)
        return events

    def _put_first(self, now: float, request: BatchJob, jobs: list[BatchJob]) -> list[dict[str, Any]]:
        """Rank ``request`` above every other pending job that could start, so that the nodes its
        victims free go to it (its victims are held, so they are not among those)."""
        if not (self.config.prioritize and self.batch.can_prioritize):
            return []
        ranks = [
            job.priority
            for job in jobs
            if job.state == "pending" and not job.held and job.id != request.id and job.priority is not None
        ]
        if not ranks or (request.priority is not None and request.priority > max(ranks)):
            return []
        above = max(ranks)
        events: list[dict[str, Any]] = []
        self._act(
            lambda: self.batch.prioritize(request.id, above=above), now, "prioritize", request.id, events, above=above
        )
        return events

    # ------------------------------------------------------------------ carrying out

    def _advance(self, now: float, jobs: dict[str, BatchJob]) -> list[dict[str, Any]]:
        events = []
        for victim, p in list(self.preempting.items()):
            job = jobs.get(victim)
            if p.requeued is None:
                exited = job is None or job.state != "running"
                if not (exited or now - p.signalled >= self.config.grace):
                    continue
                action = "requeue" if exited else "requeue_after_grace"
                if self._act(lambda v=victim: self.batch.requeue(v, hold=True), now, action, victim, events):
                    p.requeued = now
                elif job is None:
                    del self.preempting[victim]  # the scheduler forgot it: nothing left to requeue
                continue  # else tried again at the next poll (a job still completing cannot be requeued)
            request = jobs.get(p.request)
            started = request is None or request.state != "pending"
            stale = now - p.requeued >= self._patience
            if started or stale:
                self._act(lambda v=victim: self.batch.release(v), now, "release", victim, events)
                del self.preempting[victim]
        return events

    def _act(
        self,
        command: Callable[[], None],
        now: float,
        action: str,
        job: str,
        events: list[dict[str, Any]],
        **detail: Any,
    ) -> bool:
        try:
            if not self.config.dry_run:
                command()
        except BatchCommandError as exc:
            events.append(self._log({"t": now, "event": f"{action}_failed", "job": job, **detail, "error": str(exc)}))
            return False
        events.append(self._log({"t": now, "event": action, "job": job, **detail, "dry_run": self.config.dry_run}))
        return True

    def _log(self, event: dict[str, Any]) -> dict[str, Any]:
        line = json.dumps(event, sort_keys=True)
        logger.info("%s", line)
        if self.log_path is not None:
            with open(self.log_path, "a") as f:
                f.write(line + "\n")
        return event


def running_job(job: BatchJob, now: float, restart_cost: float, unit: Unit) -> RunningJob:
    """A running batch job as the policy sees it, from its heartbeat if it publishes one."""
    start = min(job.start if job.start is not None else now, now)
    end = job.expected_end
    if end is None or end <= now:
        end = now + NO_END if end is None else now + 1.0  # past its limit: ending any moment
    last, period, restart = None, None, restart_cost
    path = job.comment[len(COMMENT_PREFIX) :].strip() if job.comment.startswith(COMMENT_PREFIX) else None
    if path:
        try:
            beat = read_heartbeat(path)
        except (OSError, ValueError) as exc:
            logger.warning("job %s: heartbeat unreadable, taken as no checkpoint: %s", job.id, exc)
        else:
            last = min(now, max(start, beat.committed))
            period = beat.period
            restart = beat.restore if beat.restore is not None else restart_cost
    return RunningJob(
        id=job.id,
        nodes=job.size(unit),
        start=start,
        end=end,
        last_checkpoint=last,
        checkpoint_interval=period,
        restart_cost=restart,
    )


def _jsonable(inputs: dict[str, Any]) -> dict[str, Any]:
    out = dict(inputs)
    out["running"] = [dict(vars(job)) for job in inputs["running"]]  # flat: asdict's deep copy is slow
    out["request"] = dict(vars(inputs["request"]))
    return out
