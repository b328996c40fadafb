"""The preemption agent: watch a batch system's queue, ask :func:`decide`, act with the scheduler's commands.

Slurm's and PBS Pro's own preemption pick victims by priority and age; they do not know when a
job last checkpointed, so they can throw away hours of work to free nodes a few minutes early.
The agent knows: every :class:`~resilient_flows.checkpoint.Checkpointer` publishes a heartbeat
(:mod:`~resilient_flows.checkpoint._heartbeat`), and a job's comment points to it.

Each poll:

1. read the jobs and the free capacity (one ``squeue`` and one ``sinfo``, or their PBS Pro
   equivalents); a failing or slow scheduler makes the agent back off, doubling its wait up to
   :data:`MAX_BACKOFF` polls, and say so in its log;
2. move the preemptions under way along: a signalled victim that has exited (after its
   checkpoint), or that outlived its ``grace``, is requeued and held; a held victim is released
   once the request it made room for runs or is gone, so that it cannot jump ahead of it;
3. for each pending on-demand job not yet served: describe the running batch jobs the agent may
   touch as :class:`RunningJob` (heartbeats give ``last_checkpoint``, ``checkpoint_interval`` and
   ``restart_cost``; a job without one counts as "no checkpoint since start", the conservative
   choice), ask :func:`decide`, and carry the decision out: signal the victims now, or hold off
   and decide again at the next poll, as the workflow runner does.

Every decision goes to the agent's log (``--log``) with its inputs, so that ``decide(**event["inputs"])``
replays it. The agent never signals a job outside the configured partitions and users, nor an
on-demand job, and reports a request larger than the whole machine once without acting on it.

The agent runs as the scheduler's administrator (or a PBS operator) and reads what users wrote,
so it believes little of it:

- a job is on demand by its partition alone where ``ondemand_partition`` is set (its comment is
  then ignored); only without one, by the marker as a whole word of its comment, never inside a
  path or another word;
- a heartbeat is read only from a regular file that the job's owner owns, opened without
  following a symlink or blocking on a FIFO, at most 64 KiB, and all of a poll's heartbeats within
  ``heartbeat_deadline`` (:class:`~resilient_flows.checkpoint._heartbeat.HeartbeatReader`); what it
  claims is bounded by what the agent sees (:func:`running_job`);
- every user-controlled text that reaches the log is escaped and cut short
  (:func:`~resilient_flows.cosched._batch.clean`).

Preemptions under way are written, before each command that starts or ends one, to a small state
file (:func:`load_state`), so that an agent killed between a requeue and its release releases its
victims after a restart instead of leaving them held until an administrator notices.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from resilient_flows.capped import read_json_capped
from resilient_flows.checkpoint import CheckpointHeartbeat, HeartbeatReader
from resilient_flows.cosched._batch import SHOWN, UNITS, BatchCommandError, BatchJob, BatchSystem, Unit, clean, uid_of
from resilient_flows.cosched._jobs import Decision, OnDemandRequest, RunningJob
from resilient_flows.cosched._policies import POLICIES, decide
from resilient_flows.durable import fsync_dir, write_durably
from resilient_flows.errors import InvalidJobError, ResilientFlowsError

logger = logging.getLogger(__name__)

ONDEMAND_MARKER = "rf-ondemand"
#: The longest wait after failed polls, in poll intervals.
MAX_BACKOFF = 16
#: A job whose time limit is unknown is taken to run this much longer (it ends "never").
NO_END = 365 * 86400.0
STATE_FORMAT = "resilient-flows-agent-state/1"
#: The state file holds a few records per preemption under way; a larger one is not the agent's.
STATE_CAP = 1 << 20
#: The most preemptions under way (and requests served) a state file may name.
STATE_ENTRIES = 10_000
#: Values of an event that hold no text.
_PLAIN = (int, float, type(None))
#: What separates the words of a comment, for the on-demand marker.
_WORDS = re.compile(r"[\s,]+")


@dataclass(frozen=True)
class AgentConfig:
    """What the agent may do, and how it weighs the request's wait against the victims' lost work.

    ``partitions`` and ``users`` restrict the victims (empty: any batch job); on-demand jobs are
    never victims. ``grace`` is how long a signalled victim gets to checkpoint and exit before it
    is requeued anyway (which kills it). ``restart_cost`` stands in for jobs without a heartbeat.
    ``prioritize`` puts a served request ahead of every other pending job, where the batch system
    lets the agent (:attr:`~resilient_flows.cosched._batch.BatchSystem.can_prioritize`): else a
    pending batch job ranked higher could take the nodes its victims free.

    ``ondemand_partition``: pending jobs there are the requests, and no others (a job's comment is
    then ignored: its owner writes it). Without it, a pending job is a request when
    ``ondemand_marker`` is a whole word of its comment. ``heartbeat_deadline`` bounds the time a
    poll spends reading heartbeats; ``max_restore`` is the most restore time a heartbeat is
    believed to claim (it is also at most the job's elapsed time).
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
    heartbeat_deadline: float = 2.0
    max_restore: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "max_delay", "grace", "restart_cost", "max_restore"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise InvalidJobError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("interval", "heartbeat_deadline"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise InvalidJobError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if self.policy not in POLICIES:
            raise InvalidJobError(f"policy: unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.unit not in UNITS:
            raise InvalidJobError(f"unit must be one of {', '.join(UNITS)}, got {self.unit!r}")
        if not self.signal.isalnum():
            raise InvalidJobError(f"signal must be a signal name or number such as USR1, got {self.signal!r}")
        if self.ondemand_partition is None and not re.fullmatch(r"[^\s,]+", self.ondemand_marker):
            raise InvalidJobError(
                f"ondemand_marker must be one word (no spaces or commas), got {self.ondemand_marker!r}, "
                "and no on-demand partition is given"
            )


class AgentStateError(ResilientFlowsError):
    """The agent's state file cannot be read or is not one: the message names it and what is wrong.

    The agent refuses to start rather than forget the victims it holds; move the file aside to
    start without it (then release any job it held by hand)."""


@dataclass
class _Preemption:
    """A victim on its way out for ``request``: signalled, then requeued and held, then released."""

    request: str
    signalled: float
    requeued: float | None = None


@dataclass
class _Commits:
    """What the agent has seen of a job's commits: the newest, and the smallest gap between two."""

    newest: float
    gap: float | None = None


@dataclass
class Agent:
    """One agent, for one batch system. :meth:`poll` is one round; :meth:`run` loops.

    ``state_path``: where the preemptions under way are kept across restarts (None: in memory
    only); a dry run neither reads nor writes it.
    """

    batch: BatchSystem
    config: AgentConfig = field(default_factory=AgentConfig)
    log_path: Path | None = None
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    state_path: Path | None = None
    preempting: dict[str, _Preemption] = field(default_factory=dict)
    served: dict[str, float] = field(default_factory=dict)  # request id -> when its victims were signalled
    reported: set[str] = field(default_factory=set)
    failures: int = 0
    commits: dict[str, _Commits] = field(default_factory=dict)  # job id -> its commits seen, while it has a heartbeat
    warned: dict[str, str] = field(default_factory=dict)  # job id -> why its heartbeat was last refused
    reader: HeartbeatReader = field(init=False, repr=False)
    _saved: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.reader = HeartbeatReader(self.config.heartbeat_deadline)
        if self.state_path is None or self.config.dry_run:
            return
        preempting, served = load_state(self.state_path, self.batch.name)
        self.preempting.update(preempting)
        self.served.update(served)
        try:
            self._write_state(self.state_path)  # a path it cannot write stops it now, not at its first preemption
        except OSError as exc:
            raise AgentStateError(f"agent state {self.state_path}: cannot be written ({exc})") from exc
        if preempting or served:
            self._log(
                {
                    "t": self.clock(),
                    "event": "resumed",
                    "state": str(self.state_path),
                    "preempting": {victim: asdict(p) for victim, p in preempting.items()},
                    "served": served,
                }
            )

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
        self._save(now, events)
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
        victims = [job for job in jobs if self._victim(job)]
        beats = self._heartbeats(victims)
        gaps = self._gaps(beats)
        candidates = {job.id: running_job(job, now, c, beats.get(job.id), gaps.get(job.id)) for job in victims}
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

    # ------------------------------------------------------------------ what users say

    def _ondemand(self, job: BatchJob) -> bool:
        c = self.config
        if c.ondemand_partition is not None:
            return job.queue == c.ondemand_partition
        return is_marked(job.comment, c.ondemand_marker)

    def _heartbeats(self, jobs: list[BatchJob]) -> dict[str, CheckpointHeartbeat]:
        """The heartbeats of ``jobs`` that can be believed, read within the poll's deadline."""
        wanted: dict[str, tuple[str, int | None]] = {}
        for job in jobs:
            if not job.heartbeat:
                continue
            owner = uid_of(job)
            if not os.path.isabs(job.heartbeat):
                self._refused(job, "not an absolute path")
            elif owner is None:
                self._refused(job, f"its owner {job.user!r} is unknown here, so no file speaks for it")
            else:
                wanted[job.id] = (job.heartbeat, owner)
        read = self.reader.read(wanted)
        beats = {}
        for job in jobs:
            result = read.get(job.id)
            if isinstance(result, CheckpointHeartbeat):
                beats[job.id] = result
                self.warned.pop(job.id, None)
            elif job.id in wanted:
                why = f"not read within {self.config.heartbeat_deadline:g} s" if result is None else str(result)
                self._refused(job, why)
        for job_id in set(self.warned) - {job.id for job in jobs}:
            del self.warned[job_id]
        return beats

    def _refused(self, job: BatchJob, why: str) -> None:
        """Say once (per job and reason) that a heartbeat is not used: a user must not flood the log."""
        if self.warned.get(job.id) != why:
            self.warned[job.id] = why
            logger.warning(
                "job %s: heartbeat %s not used, taken as no checkpoint: %s",
                clean(job.id),
                clean(job.heartbeat),
                clean(why),
            )

    def _gaps(self, beats: dict[str, CheckpointHeartbeat]) -> dict[str, float]:
        """For each job with a heartbeat, the smallest gap the agent saw between two of its commits
        (an upper bound of its period: commits seen one after another are whole periods apart)."""
        seen, self.commits = self.commits, {}
        for job_id, beat in beats.items():
            commits = seen.get(job_id)
            if commits is None or beat.committed < commits.newest:  # first look, or a new run of the job
                commits = _Commits(beat.committed)
            elif beat.committed > commits.newest:
                gap = beat.committed - commits.newest
                commits.gap = gap if commits.gap is None else min(commits.gap, gap)
                commits.newest = beat.committed
            self.commits[job_id] = commits
        return {job_id: commits.gap for job_id, commits in self.commits.items() if commits.gap is not None}

    # ------------------------------------------------------------------ deciding

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
        """Signal (or requeue) each victim, each recorded in the state file before its command runs,
        so that a restarted agent knows of every victim it may have touched."""
        self.served[request] = now
        events: list[dict[str, Any]] = []
        for victim in decision.preempt:
            self.preempting[victim] = _Preemption(request, now)
            self._save(now, events)
            if not self.batch.requeues_exited:  # the requeue signals it (PBS Pro's qrerun)
                if self._act(lambda v=victim: self.batch.requeue(v, hold=True), now, "requeue", victim, events):
                    self.preempting[victim].requeued = now
                else:
                    del self.preempting[victim]
            elif not self.config.dry_run:
                try:
                    self.batch.signal(victim, self.config.signal)
                except BatchCommandError as exc:
                    events.append(self._log({"t": now, "event": "signal_failed", "job": victim, "error": str(exc)}))
                    del self.preempting[victim]
            self._save(now, events)
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
        events: list[dict[str, Any]] = []
        for victim, p in list(self.preempting.items()):
            job = jobs.get(victim)
            if p.requeued is None and job is not None and job.state == "pending":
                if not job.held:  # back in the queue by other means (the scheduler's own requeue)
                    del self.preempting[victim]
                    continue
                p.requeued = now  # requeued held by an agent that died before it could record so
            if p.requeued is None:
                exited = job is None or job.state != "running"
                if not (exited or now - p.signalled >= self.config.grace):
                    continue
                action = "requeue" if exited else "requeue_after_grace"
                if self._act(lambda v=victim: self.batch.requeue(v, hold=True), now, action, victim, events):
                    p.requeued = now
                elif job is None:
                    del self.preempting[victim]  # the scheduler forgot it: nothing left to requeue
                self._save(now, events)
                continue  # else tried again at the next poll (a job still completing cannot be requeued)
            request = jobs.get(p.request)
            started = request is None or request.state != "pending"
            stale = now - p.requeued >= self._patience
            if started or stale:
                self._act(lambda v=victim: self.batch.release(v), now, "release", victim, events)
                del self.preempting[victim]
                self._save(now, events)
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

    def _save(self, now: float, events: list[dict[str, Any]]) -> None:
        """Write the preemptions under way, if they changed, durably: the next command may be the
        agent's last. A failure is logged and the write tried again at the next change or poll;
        the agent carries on, as it would without a state file."""
        if self.state_path is None or self.config.dry_run:
            return
        try:
            self._write_state(self.state_path)
        except OSError as exc:
            event = {"t": now, "event": "state_failed", "state": str(self.state_path), "error": str(exc)}
            events.append(self._log(event))

    def _write_state(self, path: Path) -> None:
        text = json.dumps(
            {
                "format": STATE_FORMAT,
                "scheduler": self.batch.name,
                "preempting": {victim: asdict(p) for victim, p in self.preempting.items()},
                "served": self.served,
            },
            sort_keys=True,
        )
        if text != self._saved:
            write_durably(path, text)
            fsync_dir(path.parent)
            self._saved = text

    def _log(self, event: dict[str, Any]) -> dict[str, Any]:
        """Append ``event`` to the log, every text in it escaped and capped: ids, errors and paths
        may carry what users wrote."""
        event = _cleaned(event)
        line = json.dumps(event, sort_keys=True)
        logger.info("%s", line)
        if self.log_path is not None:
            with open(self.log_path, "a") as f:
                f.write(line + "\n")
        return event


def is_marked(comment: str, marker: str) -> bool:
    """Whether ``marker`` is a whole word of ``comment`` (words split at spaces and commas): a path
    or another word that holds it (``/x/rf-ondemand/y``, ``rf-ondemandx``) is no marker."""
    return marker in _WORDS.split(comment)


def running_job(
    job: BatchJob,
    now: float,
    config: AgentConfig,
    beat: CheckpointHeartbeat | None = None,
    seen_gap: float | None = None,
) -> RunningJob:
    """A running batch job as the policy sees it, from its heartbeat ``beat`` if it has one.

    A heartbeat is its user's claim, so each figure is bounded by what the agent can see: the
    newest checkpoint lies between the job's start and now; the period is at most the job's
    elapsed time and ``seen_gap`` (the smallest gap the agent saw between two of its commits);
    the restore time is at most the elapsed time and ``config.max_restore``. Otherwise a job
    could claim a restore of 1e9 s and never be a victim.
    """
    start = min(job.start if job.start is not None else now, now)
    elapsed = now - start
    end = job.expected_end
    if end is None or end <= now:
        end = now + NO_END if end is None else now + 1.0  # past its limit: ending any moment
    last, period, restart = None, None, config.restart_cost
    if beat is not None:
        last = min(now, max(start, beat.committed))
        if beat.period is not None:
            period = min(beat.period, elapsed, math.inf if seen_gap is None else seen_gap) or None
        if beat.restore is not None:
            restart = min(beat.restore, elapsed, config.max_restore)
    return RunningJob(
        id=job.id,
        nodes=job.size(config.unit),
        start=start,
        end=end,
        last_checkpoint=last,
        checkpoint_interval=period,
        restart_cost=restart,
    )


def load_state(path: Path, scheduler: str) -> tuple[dict[str, _Preemption], dict[str, float]]:
    """The preemptions under way and the requests served, as an earlier agent for ``scheduler``
    left them in ``path`` (nothing if there is no such file).

    The file is read as every file others may have written is (:func:`~resilient_flows.capped.read_json_capped`:
    a regular file only, capped, not nested deep) and checked field by field; anything else raises
    :class:`AgentStateError`.
    """
    try:
        return _state(read_json_capped(path, STATE_CAP, "agent state"), scheduler)
    except FileNotFoundError:
        return {}, {}
    except OSError as exc:
        raise AgentStateError(f"agent state {path}: cannot be read ({exc.strerror})") from exc
    except ValueError as exc:
        raise AgentStateError(
            f"agent state {path}: {clean(exc)}; move it aside to start without it (and release by hand any job it held)"
        ) from exc


def _state(raw: Any, scheduler: str) -> tuple[dict[str, _Preemption], dict[str, float]]:
    if not isinstance(raw, dict) or raw.get("format") != STATE_FORMAT:
        raise ValueError(f"not a {STATE_FORMAT} file")
    if set(raw) != {"format", "scheduler", "preempting", "served"}:
        raise ValueError(f"fields {sorted(raw)}, expected format, preempting, scheduler, served")
    if raw["scheduler"] != scheduler:
        raise ValueError(f"written by an agent for {clean(raw['scheduler'])!r}, not {scheduler!r}")
    preempting, served = _table(raw, "preempting", dict), _table(raw, "served", float)
    out = {}
    for victim, p in preempting.items():
        if set(p) != {"request", "signalled", "requeued"}:
            raise ValueError(f"preempting.{clean(victim)}: fields {sorted(p)}, expected request, requeued, signalled")
        requeued = p["requeued"]
        out[victim] = _Preemption(
            request=_job_id(p["request"], f"preempting.{victim}.request"),
            signalled=_instant(p["signalled"], f"preempting.{victim}.signalled"),
            requeued=None if requeued is None else _instant(requeued, f"preempting.{victim}.requeued"),
        )
    return out, {request: _instant(t, f"served.{request}") for request, t in served.items()}


def _table(raw: dict[str, Any], name: str, kind: type) -> dict[str, Any]:
    table = raw[name]
    if not isinstance(table, dict) or len(table) > STATE_ENTRIES:
        raise ValueError(f"{name} must be an object of at most {STATE_ENTRIES} entries")
    for key, value in table.items():
        _job_id(key, f"{name} key")
        if kind is dict and not isinstance(value, dict):
            raise ValueError(f"{name}.{clean(key)} must be an object")
    return table


def _job_id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 256 or not value.isprintable() or " " in value:
        raise ValueError(f"{where}: not a job id: {clean(repr(value), 80)}")
    return value


def _instant(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValueError(f"{where}: not a Unix time: {clean(repr(value), 80)}")
    return float(value)


def _cleaned(value: Any) -> Any:
    """``value`` with every text in it through :func:`clean` (numbers pass untouched, and unvisited:
    a decision's inputs hold thousands of them)."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {
            (k if len(k) <= SHOWN and k.isprintable() else clean(k)): v if isinstance(v, _PLAIN) else _cleaned(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [v if isinstance(v, _PLAIN) else _cleaned(v) for v in value]
    return value


def _jsonable(inputs: dict[str, Any]) -> dict[str, Any]:
    out = dict(inputs)
    out["running"] = [dict(vars(job)) for job in inputs["running"]]  # flat: asdict's deep copy is slow
    out["request"] = dict(vars(inputs["request"]))
    return out
