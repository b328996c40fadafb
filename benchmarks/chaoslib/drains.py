"""What block walltimes did to a ``--walltime`` run: blocks drained, members stopped and starts
declined, retries spent, steps redone, blocks that Slurm ended at their walltime.
"""

from __future__ import annotations

from dataclasses import dataclass

from chaoslib.losses import by_member, losses, walltime_stop
from chaoslib.rundata import RunData, attempt_jobs
from chaoslib.schedule import Fault


@dataclass(frozen=True)
class Drains:
    """What the walltime did to a run (``--walltime``), from its events and its Slurm jobs' states."""

    blocks_drained: int  # ``drained`` events: blocks cancelled by the runner before their end
    stops: int  # members a drain stopped (committed, exit 75)
    declined: int  # starts declined near a block's drain
    retries: float  # cost of the failures of drained attempts
    redone: list[int]  # per stop: steps the stopped attempt logged and a later one logged again
    timeouts: int  # the run's Slurm jobs that ended at their walltime
    killed: list[str]  # attempts on a drained or timed-out block that ended for no reason of ours


def drains(data: RunData, faults: list[Fault], states: dict[int, str]) -> Drains:
    """The drains of a ``--walltime`` run. An attempt counts as killed by the walltime when it ran
    on a block that the runner drained or that Slurm ended at its walltime, and ended neither
    finished, nor stopped by the drain, nor declined, nor by a fault."""
    stops, retries, redone = 0, 0.0, []
    for name, mine in by_member(data).items():
        steps: dict[int, set[int]] = {}
        for step, attempt, _ in data.metrics.get(name, []):
            steps.setdefault(attempt, set()).add(step)
        stopping: int | None = None
        for event in mine:
            if walltime_stop(event):
                stops += 1
                stopping = event.get("attempt")
                later = set().union(*(s for a, s in steps.items() if a > stopping))
                redone.append(len(steps.get(stopping, set()) & later))
            elif event["kind"] == "declined":
                stopping = event.get("attempt")
            elif event["kind"] == "failed" and stopping is not None:
                retries += float(event.get("cost", 0))
                stopping = None
            elif event["kind"] == "started":
                stopping = None
    jobs = attempt_jobs(data)
    ended = {int(e["job_id"]) for e in data.events if e["kind"] == "drained" and str(e.get("job_id", "")).isdigit()}
    ended |= {job for job, state in states.items() if state == "TIMEOUT"}
    killed = [
        f"{loss.member} attempt {loss.attempt} (job {jobs.get((loss.member, loss.attempt))})"
        for loss in losses(data, faults)
        if loss.fault is None and jobs.get((loss.member, loss.attempt)) in ended
    ]
    return Drains(
        sum(e["kind"] == "drained" for e in data.events),
        stops,
        sum(e["kind"] == "declined" for e in data.events),
        retries,
        redone,
        sum(state == "TIMEOUT" for state in states.values()),
        killed,
    )
