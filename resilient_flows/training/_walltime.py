"""Walltime: the rules by which a block's members end before its batch job does.

A batch job ends at its walltime with a signal and, moments later, SIGKILL: a member caught in a
long step or checkpoint loses everything since its last commit, and a member started shortly
before the end wastes its start-up. The runner therefore records when each block started, ends
and will be drained (:attr:`~resilient_flows.rundir.RunLayout.block_times`); at the drain time it
asks the block's members to commit and stop (exit 75, free) and cancels the block, so that they
continue on a fresh one. A member reads its block's times when it starts and declines (exits 75
at once, without training) when it could not reach a checkpoint before the drain.

Both sides use the rules here, so that they agree. The margins come from each member's observed
pace (seconds per step and per checkpoint commit, :class:`Pace`), which it keeps in its directory
across attempts, and from conservative defaults before any is observed.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from resilient_flows.rundir import TaskLayout, run_layout
from resilient_flows.rundir._block import current_block

#: The least margin (seconds) before a block's end at which its members are asked to stop.
MIN_DRAIN_S = 15.0
#: Seconds added to every margin for the reactions it contains: the runner's poll, the member's
#: look at its requests (once a second at worst), its result travelling back, the cancel command.
REACTION_S = 5.0
#: A margin holds this many (step + commit) of the slowest member on the block: a member asked to
#: stop finishes its step and commits, and a pace observed earlier may have been a good day's.
DRAIN_STEPS = 3.0
#: Seconds per step and per commit assumed before a member has observed its own.
DEFAULT_STEP_S = 1.0
DEFAULT_COMMIT_S = 5.0
#: A member starts on a block only if it can run this many steps (or up to its next interval
#: checkpoint, when sooner) and commit them before the drain: fewer would cost more than they make.
MIN_WORK_STEPS = 10


@dataclass(frozen=True)
class Pace:
    """How fast a member goes: seconds per step and from a save to its commit (None: not observed)."""

    step_s: float | None = None
    commit_s: float | None = None

    @property
    def step(self) -> float:
        return DEFAULT_STEP_S if self.step_s is None else self.step_s

    @property
    def commit(self) -> float:
        return DEFAULT_COMMIT_S if self.commit_s is None else self.commit_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: Any) -> Pace:
        """The pace in a record (a pace file, a heartbeat); what is missing or malformed stays unknown."""
        if not isinstance(record, dict):
            return cls()
        return cls(_seconds(record.get("step_s")), _seconds(record.get("commit_s")))


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def drain_margin_s(paces: Iterable[Pace]) -> float:
    """Seconds before a block's end at which its members (of these paces) are asked to stop: longer
    than the slowest one needs to finish a step and commit, however few members are known."""
    default = DRAIN_STEPS * (DEFAULT_STEP_S + DEFAULT_COMMIT_S)
    worst = max((DRAIN_STEPS * (p.step + p.commit) for p in paces), default=default)
    return max(MIN_DRAIN_S, worst) + REACTION_S


def time_to_checkpoint_s(pace: Pace, steps_to_interval: int | None, interval_s: float | None) -> float:
    """Seconds a member starting now needs to reach a checkpoint worth starting for: its next
    interval checkpoint, or :data:`MIN_WORK_STEPS` steps if sooner (the drain checkpoints them),
    and the commit."""
    steps = MIN_WORK_STEPS if steps_to_interval is None else min(MIN_WORK_STEPS, steps_to_interval)
    work = steps * pace.step
    if interval_s is not None:
        work = min(work, interval_s)
    return work + pace.commit


@dataclass(frozen=True)
class BlockTimes:
    """One running block, on the runner's clock (seconds since the epoch): when it started (as its
    provider reports it), when its walltime ends it, and when the runner drains it."""

    block: str
    start: float
    end: float
    drain_at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def start_refusal(times: BlockTimes | None, needed_s: float, now: float) -> str | None:
    """Why a member needing ``needed_s`` to reach a checkpoint must not start on this block now;
    None when it may (or its block's times are unknown: the drain still stops it in time).

    A member that needs more than half of a block's time before its drain is asked for no more
    than that half: it could never start otherwise, and starts in the first half of each block."""
    if times is None:
        return None
    needed_s = min(needed_s, (times.drain_at - times.start) / 2)
    left = times.drain_at - now
    if left >= needed_s:
        return None
    return (
        f"block {times.block} is drained in {max(0.0, left):.0f} s (walltime), less than the "
        f"{needed_s:.0f} s this member needs to reach a checkpoint"
    )


def read_block_times(run_dir: str | os.PathLike, block: str | None) -> BlockTimes | None:
    """The runner's times of ``block``; None when unknown. Several executors number their blocks
    alike: the earliest drain of any block of that number is taken, which is the safe one."""
    if block is None:
        return None
    try:
        record = run_layout(run_dir).read_block_times()
    except (OSError, ValueError):
        return None
    found = []
    for entry in record.get("blocks", []) if isinstance(record, dict) else []:
        try:
            if isinstance(entry, dict) and str(entry["block"]) == block:
                found.append(BlockTimes(block, float(entry["start"]), float(entry["end"]), float(entry["drain_at"])))
        except (KeyError, TypeError, ValueError):
            continue
    return min(found, key=lambda t: t.drain_at, default=None)


def drain_in_s(run_dir: str | os.PathLike) -> float | None:
    """Seconds until this process's block is drained; None when it is not known to be."""
    times = read_block_times(run_dir, current_block())
    return None if times is None else max(0.0, times.drain_at - time.time())


def read_pace(directory: Path) -> Pace:
    """The pace a member's earlier attempts observed; unknown when none did."""
    try:
        return Pace.from_record(TaskLayout(directory).read_pace())
    except (OSError, ValueError):
        return Pace()


def write_pace(directory: Path, pace: Pace) -> None:
    TaskLayout(directory).write_pace(pace.to_dict())


def write_declined(directory: Path, attempt: int, block: str) -> None:
    """Mark ``attempt`` as one that declined to start: the retry handler charges it nothing and
    does not count it among the stops without progress (it trained nothing by design)."""
    TaskLayout(directory).write_declined({"attempt": attempt, "block": block, "time": round(time.time(), 3)})


def declined_attempt(directory: Path) -> int | None:
    """The last attempt of the member in ``directory`` that declined to start; None when none did."""
    try:
        record = TaskLayout(directory).read_declined()
    except (OSError, ValueError):
        return None
    attempt = record.get("attempt") if isinstance(record, dict) else None
    return attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None
