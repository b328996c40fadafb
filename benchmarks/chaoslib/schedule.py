"""The chaos schedule: faults planned in seeded bursts, each recording what it struck once it did;
the analysis charges lost attempts to these records.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from chaoslib.config import Config


@dataclass
class Fault:
    """One fault, as planned and as it happened (wall-clock times, as in ``events.jsonl``)."""

    kind: str
    burst: int
    time: float = 0.0
    end: float = 0.0  # when a window closed (SIGCONT, ballast removed); ``time`` for instant faults
    hit: dict[str, int] = field(default_factory=dict)  # members struck directly -> their attempt
    doomed: frozenset[int] = frozenset()  # worker pids the fault kills: a task they start after it dies too
    running: dict[str, int] = field(default_factory=dict)  # every member running then -> its attempt
    detail: str = ""
    skipped: str | None = None
    flipped_step: int | None = None
    nodes: tuple[str, ...] = ()  # the nodes a node loss crashed
    job: int | None = None  # the Slurm job a pilot-cancel cancelled: what starts in it after dies too


def plan_bursts(kinds: tuple[str, ...], config: Config, rng: random.Random) -> list[list[Fault]]:
    """Bursts of faults: each kind ``faults_per_kind`` times, never twice in one burst."""
    chosen: list[list[str]] = [[] for _ in range(config.bursts)]
    for kind in kinds:
        for b in rng.sample(range(config.bursts), min(config.faults_per_kind, config.bursts)):
            chosen[b].append(kind)
    return [[Fault(kind, b) for kind in burst] for b, burst in enumerate(burst for burst in chosen if burst)]
