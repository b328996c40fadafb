"""Which fault ended each lost attempt and what it cost (steps redone, the recovery and its split):
the core of the analysis, on which the figures, the node-loss restores and the drains build.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import recovery_split

from chaoslib.rundata import RunData, attempt_jobs
from chaoslib.schedule import Fault

#: Faults that only the runner's watchdog notices: their threshold is the member's stall timeout.
HANGS = ("worker-stop", "manager-process-kill")
#: How long after a fault a worker it kills may still start a task: a hung pool lives until the
#: watchdog retires it (the site's stall timeout, plus the look that sees it).
DOOMED_S = 90.0


@dataclass
class Loss:
    """An attempt that ended before its member finished: what it cost, and how the member came back."""

    member: str
    attempt: int
    fault: Fault | None  # None when no fault explains it
    steps: int  # logged by this attempt and again by a later one
    detected_by: str  # the first sign of the loss: failed, lost, submitted (a new runner) or started
    recovery_s: float | None  # fault -> training again, less the queue (``Split.recovery_s``)
    detect_s: float | None  # fault (or the silence it caused, if later) -> the first sign of the loss
    split: recovery_split.Split | None  # detection, restart, restore, redone steps (None: no fault)
    through_full: bool  # the attempt lived through a full file system: checkpoints may have failed

    @property
    def waiting(self) -> bool:
        """A fault that found the member waiting to restart, its attempt ended by an earlier one."""
        return self.detected_by == "waiting"


def by_member(data: RunData) -> dict[str, list[dict[str, Any]]]:
    """Each member's events, with the losses of a whole Parsl instance, which end every member's
    attempt in it (see :func:`recovery_split.ends_every_attempt`)."""
    grouped: dict[str, list[dict[str, Any]]] = {name: [] for name in data.names}
    for event in data.events:
        if recovery_split.ends_every_attempt(event):
            for events in grouped.values():
                events.append(event)
        else:
            grouped.setdefault(event.get("member"), []).append(event)
    return grouped


def losses(data: RunData, faults: list[Fault], slots: int | None = None) -> list[Loss]:
    """Every attempt followed by another, with the fault that ended it (see :func:`attribute`) and
    what it cost (see :func:`_loss`; ``slots``: the site's workers, for the queue).

    An attempt that no fault struck, ended when the runner's watchdog cancelled its block for
    another member's sake (its worker got SIGTERM with the block), is charged to the fault that
    made that member silent."""
    injected = [f for f in faults if f.skipped is None and f.time > 0]
    fulls = [f for f in injected if f.kind == "storage-full"]
    ended = []  # (member, events, attempt, next attempt, detected, how, fault)
    jobs = attempt_jobs(data)
    for name, mine in by_member(data).items():
        started = {e["attempt"]: e["time"] for e in mine if e["kind"] == "started"}
        pids = {e["attempt"]: e.get("pid") for e in mine if e["kind"] == "started"}
        done = {e.get("attempt") for e in mine if e["kind"] == "finished"}  # ended well, whatever followed
        done |= walltime_ends(mine)  # stopped by its block's drain, or declined to start before it
        notices = sorted((e["time"], e["kind"]) for e in mine if e["kind"] in ("failed", "lost", "submitted"))
        for a, b in itertools.pairwise(sorted(started)):
            if a in done:
                continue
            detected, how = next(((t, k) for t, k in notices if started[a] < t <= started[b]), (started[b], "started"))
            fault = attribute(name, a, started[a], pids[a], jobs.get((name, a)), detected, how, injected)
            ended.append((name, mine, a, b, detected, how, fault))
    silenced = {(name, detected): fault for name, _, _, _, detected, how, fault in ended if how == "lost" and fault}
    hangs = [f for f in injected if f.kind in HANGS]
    charged = []
    for name, mine, a, b, detected, how, fault in ended:
        start = next(e["time"] for e in mine if e["kind"] == "started" and e["attempt"] == a)
        if fault is None:
            cancels = [e for e in data.events if e["kind"] == "lost" and start - 1.0 <= e["time"] <= detected]
            fault = next(filter(None, (_silencer(e, silenced, hangs) for e in cancels)), None)
        charged.append((name, mine, a, b, detected, how, fault))
    ends = {(name, a): fault.time for name, _, a, _, _, _, fault in charged if fault is not None}
    spans = attempt_spans(data, ends)
    found = []
    for name, mine, a, b, detected, how, fault in charged:
        ended = ends.get((name, b))
        waits = [] if fault is None else waited_through(data, name, mine, a, fault, ended, injected)
        cuts = [f.time for f in waits] + [ended]
        found.append(_loss(data, name, mine, a, b, detected, how, fault, fulls, cuts[0], spans, slots))
        for wait, until in zip(waits, cuts[1:], strict=True):
            found.append(_loss(data, name, mine, a, b, wait.time, "waiting", wait, fulls, until, spans, slots))
    return found


#: Faults that take what every waiting member needs to start, by how much they take: a pool (or a
#: node, or a pilot job), the interchange (every pool with it), the runner (Parsl with it).
SHARED_FAULTS = {
    "pool-kill": 1,
    "manager-process-kill": 1,
    "pilot-cancel": 1,
    "node-loss": 1,
    "node-and-buddy-loss": 1,
    "interchange-kill": 2,
    "runner-kill": 3,
}


def waited_through(
    data: RunData,
    name: str,
    mine: list[dict[str, Any]],
    attempt: int,
    fault: Fault,
    ended: float | None,
    faults: list[Fault],
) -> list[Fault]:
    """The faults of :data:`SHARED_FAULTS` that struck after ``fault`` ended ``attempt`` of
    ``name`` and before it trained again (or its next attempt ended, at ``ended``), each taking
    more than the fault charged before it: each takes over the rest of the member's wait (see
    :func:`recovery_split.split_of`), whether it found the member waiting or struck its ended
    attempt again (a runner killed just after a worker was stopped: the pool's report of the stop
    has no runner to go to). One that takes as much or less adds to the wait of the fault charged."""
    lines = data.metrics.get(name, [])
    again = recovery_split.split_of(mine, lines, name, attempt, fault.time, 0.0, ended).training_again_s
    if again is None:
        return []
    started = next(e["time"] for e in mine if e["kind"] == "started" and e["attempt"] == attempt)
    begin, end = max(fault.time, started), fault.time + again  # a fault may be charged from before the start
    scope, found = SHARED_FAULTS.get(fault.kind, 0), []
    for f in sorted(faults, key=lambda f: f.time):
        if begin < f.time < end and SHARED_FAULTS.get(f.kind, 0) > scope:
            found.append(f)
            scope = SHARED_FAULTS[f.kind]
    return found


#: Events that end an attempt, or show that it ended: after them its worker is free for another.
ATTEMPT_ENDS = ("finished", "failed", "preempted", "lost", "submitted")


def _ends(event: dict[str, Any], attempt: int) -> bool:
    """Whether ``event`` (of the same member) shows that its ``attempt`` ended: a sign of its end,
    the next attempt's start, or a new runner's submission."""
    if event["kind"] == "started":
        return event["attempt"] != attempt
    return event["kind"] in ATTEMPT_ENDS and event.get("attempt") in (None, attempt)


def attempt_spans(data: RunData, ends: dict[tuple[str, int], float]) -> dict[str, list[tuple[float, float]]]:
    """member -> (start, end) of each of its attempts, while it held a worker for work: from its
    ``started`` to the first sign that it ended (its member's next event of :data:`ATTEMPT_ENDS`),
    or to the fault that ended it (``ends``: (member, attempt) -> the fault's time), if earlier: a
    worker whose attempt a fault struck trains nothing, whenever the runner learns it."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for name, mine in by_member(data).items():
        for event in (e for e in mine if e["kind"] == "started"):
            attempt, start = event["attempt"], event["time"]
            signs = [e["time"] for e in mine if e is not event and e["time"] >= start and _ends(e, attempt)]
            end = min([*signs, ends.get((name, attempt), float("inf"))])
            spans.setdefault(name, []).append((start, end))
    return spans


def walltime_stop(event: dict[str, Any]) -> bool:
    """Whether ``event`` is a member stopping because the runner drains its block before its
    walltime (the reason :class:`~resilient_flows.workflow._walltime.BlockClock` gives)."""
    return event["kind"] == "preempted" and "(walltime)" in str(event.get("reason", ""))


def walltime_ends(mine: list[dict[str, Any]]) -> set[int]:
    """A member's attempts that a drain stopped (committed, exit 75) or that declined to start on a
    block about to be drained: each ended as it should, no fault ended it."""
    return {e.get("attempt") for e in mine if walltime_stop(e) or e["kind"] == "declined"}


def _silencer(lost: dict[str, Any], silenced: dict[tuple[str, float], Fault], hangs: list[Fault]) -> Fault | None:
    """The fault behind a ``lost`` event of the watchdog, whose block cancel stops every attempt
    on the block: the fault charged with the silent member's loss, or for a block none of whose
    tasks beat, the latest hang before it."""
    if lost.get("member") is not None:
        return silenced.get((lost["member"], lost["time"]))
    return max((f for f in hangs if f.time <= lost["time"]), key=lambda f: f.time, default=None)


def _loss(
    data: RunData,
    name: str,
    mine: list[dict[str, Any]],
    a: int,
    b: int,
    detected: float,
    how: str,
    fault: Fault | None,
    fulls: list[Fault],
    until: float | None = None,
    spans: dict[str, list[tuple[float, float]]] | None = None,
    slots: int | None = None,
) -> Loss:
    """What attempt ``a`` of ``name``, ended by ``fault`` and followed by ``b``, cost: its split
    (:mod:`recovery_split`), cut at ``until`` (the next fault that took over: see :func:`losses`)
    and less the wait for a free worker while the other members' attempts (``spans``) took all
    ``slots``. With ``how`` ``waiting``, ``fault`` found the member waiting to restart: what it
    cost from then on (no detection, no steps: they are the first fault's)."""
    started = {e["attempt"]: e["time"] for e in mine if e["kind"] == "started"}
    # when the watchdog found an attempt silent: since when, in wall-clock time
    silent_since = {e["time"]: e["time"] - e["silent_s"] for e in mine if e["kind"] == "lost" and e.get("silent_s")}
    lines = data.metrics.get(name, [])
    # a hang is noticeable once the attempt falls silent: a pool whose manager process died runs
    # its tasks on, beating, until they need it
    # nothing to notice for a member found waiting; nothing this fault could notice after the next took over
    unnoticed = how == "waiting" or (until is not None and detected > until)
    detect = None if fault is None or unnoticed else detected - max(fault.time, silent_since.get(detected, fault.time))
    others = [span for member, member_spans in (spans or {}).items() if member != name for span in member_spans]
    at = detected if fault is None else fault.time
    split = recovery_split.split_of(mine, lines, name, a, at, 0.0, until, others, slots, how == "waiting")
    split = replace(split, redone_s=split.redone_steps * recovery_split.step_time_s(lines))
    recovery = None if fault is None else split.recovery_s
    through = any(f.time < detected and f.end > started[a] for f in fulls)
    return Loss(name, a, fault, split.redone_steps, how, recovery, detect, split if fault else None, through)


def attribute(
    name: str,
    attempt: int,
    start: float,
    pid: int | None,
    job: int | None,
    detected: float,
    how: str,
    faults: list[Fault],
) -> Fault | None:
    """The fault that ended ``attempt`` of ``name``: of those between its start and the first sign
    of its loss, the first that struck it directly (every kind that strikes an attempt ends it:
    a worker stopped, then orphaned by a runner kill, was ended by the stop), else the latest
    that found it running (a full file system), else one that killed the worker
    it started on just after the fault (a task the pool had prefetched, or that its interchange
    handed it before a cancelled job's processes died), or that cancelled the Slurm ``job`` it
    started in (on a worker the pool forked after the fault looked). An attempt that started after the runner
    was killed, and ended when the next runner came, ran in the dead runner's orphaned blocks (its
    interchange still hands them tasks): that kill ended it. Likewise an attempt that started
    after its interchange was killed and ended when the runner started Parsl again."""
    window = [f for f in faults if start - 1.0 <= f.time <= detected]
    struck = [f for f in window if f.hit.get(name) == attempt]
    if struck:
        return min(struck, key=lambda f: f.time)
    found = [f for f in window if f.running.get(name) == attempt]
    if found:
        return max(found, key=lambda f: f.time)
    doomed = [
        f
        for f in faults
        if (pid in f.doomed or (job is not None and f.job == job)) and f.time - 1.0 <= start <= f.time + DOOMED_S
    ]
    if doomed:
        return max(doomed, key=lambda f: f.time)
    kills = [f for f in faults if f.kind in ("runner-kill", "interchange-kill") and f.time <= start]
    return max(kills, key=lambda f: f.time) if kills and how == "submitted" else None


def window_recoveries(data: RunData, fault: Fault) -> list[float]:
    """For a fault that lasts a while and ended no attempt (a full file system waited out): from
    the fault to the first step after it ended, per member whose attempt lived through it."""
    out = []
    for name, attempt in fault.running.items():
        after = [when for _, a, when in data.metrics.get(name, []) if a == attempt and when > fault.end]
        if after:
            out.append(min(after) - fault.time)
    return out


def flip_outcomes(data: RunData, faults: list[Fault]) -> Counter[str]:
    """How each flipped shard was met by the next attempt of its member: ``detected`` (it restored
    an older checkpoint, or none when the damaged one was the only one), ``restored`` (it loaded
    the damaged one) or ``not exercised`` (there was no next attempt, or it found a newer one)."""
    out: Counter[str] = Counter()
    grouped = by_member(data)
    for fault in faults:
        if fault.kind != "shard-flip" or fault.flipped_step is None:
            continue
        ((name, attempt),) = fault.hit.items()
        mine = grouped.get(name, [])
        later = [e["attempt"] for e in mine if e["kind"] == "started" and e["attempt"] > attempt]
        if not later:
            out["not exercised"] += 1
            continue
        step = next((e["step"] for e in mine if e["kind"] == "resumed" and e["attempt"] == min(later)), -1)
        if step > fault.flipped_step:
            out["not exercised"] += 1
        else:
            out["restored" if step == fault.flipped_step else "detected"] += 1
    return out
