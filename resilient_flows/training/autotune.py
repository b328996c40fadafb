"""``interval: auto``: measure what this member's checkpoints cost, then let the recommender choose.

The first :data:`WARMUP_CHECKPOINTS` checkpoints are taken every few steps, as configured for the
warm-up; they give the stall of a checkpoint (the L1 cost: what training waits for), the time to
the shared tier (the L2 latency; the commit, without a node-local tier), the member's pace and
how long it took to start (a restart repeats it). With the failure rates the planner put in the
spec, :class:`~resilient_flows.mlc.Recommender` turns these into a time interval and a
``persist_every``, which hold for the rest of the attempt; the choice and what it was made from
go to ``events.jsonl`` as a ``tuned`` event.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict
from typing import Any

from resilient_flows.checkpoint import CheckpointStats
from resilient_flows.mlc import MLCConfig, MLCParams, Recommender

__all__ = ["MAX_PERSIST_EVERY", "WARMUP_CHECKPOINTS", "AutoTuner", "tuned_fields"]

WARMUP_CHECKPOINTS = 3
#: ``persist_every`` when the recommender says never flush (no lost nodes to fear).
MAX_PERSIST_EVERY = 1 << 30
#: Floor of a measured duration, so that a ratio of two never divides by zero.
FLOOR_S = 1e-4


class AutoTuner:
    """One member's measurements until it has enough, then one recommendation."""

    def __init__(self, process_mtbf_s: float, node_mtbf_s: float, steps: int) -> None:
        self.process_mtbf_s = process_mtbf_s
        self.node_mtbf_s = node_mtbf_s
        self.steps = steps
        self.created = time.monotonic()
        self.stalls: list[float] = []
        self.first_step: tuple[int, float] | None = None
        self.done = False  # set by the caller on every rank once the choice is applied

    def stepped(self, step: int) -> None:
        if self.first_step is None:
            self.first_step = (step, time.monotonic())

    def saved(self, stats: CheckpointStats) -> None:
        self.stalls.append(stats.last_stall)

    def ready(self, stats: CheckpointStats, two_tiers: bool) -> bool:
        """Enough checkpoints seen, and one of them through to the shared tier (its latency known)."""
        through = stats.persisted if two_tiers else stats.committed
        return len(self.stalls) >= WARMUP_CHECKPOINTS and through > 0

    def recommend(self, step: int, stats: CheckpointStats, two_tiers: bool) -> tuple[MLCParams, MLCConfig]:
        """What the member measured, and the configuration for the rest of its run."""
        assert self.first_step is not None
        first, began = self.first_step
        now = time.monotonic()
        pace = max(FLOOR_S, (now - began) / max(1, step - first + 1))
        l1_cost = max(FLOOR_S, statistics.median(self.stalls))
        latency = stats.last_persist_latency if two_tiers else stats.last_commit_latency
        l2_latency = max(l1_cost, latency)
        startup = max(l1_cost, began - self.created)
        params = MLCParams(
            l1_cost=l1_cost,
            l1_restart=startup,
            l1_mtbf=self.process_mtbf_s,
            solve_time=max(1.0, (self.steps - step - 1) * pace),
            l2_latency=l2_latency,
            l2_restart=startup + l2_latency,
            l2_mtbf=self.node_mtbf_s,
        )
        return params, Recommender.default().recommend(params)


def tuned_fields(params: MLCParams, config: MLCConfig) -> dict[str, Any]:
    """The ``tuned`` event's fields: the inputs and the choice, enough to replay it."""
    return {"params": asdict(params), "interval_s": config.interval, "persist_every": config.l2_every}
