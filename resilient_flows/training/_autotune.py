"""``interval: auto``: measure what this member's checkpoints cost, then let the recommender choose.

The first :data:`WARMUP_CHECKPOINTS` checkpoints are taken every few steps, as configured for the
warm-up; they give the stall of a checkpoint (the L1 cost: what training waits for), how long
its node-local write goes on after that (the L1 latency: a checkpoint waits for the one before),
the time to the shared tier (the L2 latency; the commit, without a node-local tier), the member's
pace and how long it took to start (a restart repeats it). They also give the flush's interference
(``l2_slowdown``): every step between two checkpoints is timed, with the seconds of it that a
flush ran (from :attr:`~resilient_flows.checkpoint.Checkpointer.flush_seconds`), so that flushes
shorter than a step are measured too (see :meth:`AutoTuner.l2_slowdown`); and the bytes of a
checkpoint per node with the bandwidths the tiers gave them. With the failure rates the planner
put in the spec, :class:`~resilient_flows.mlc.Recommender` turns these into a time interval and a
shared tier's cadence (``shared_every``: every how many checkpoints go on to it), which hold for
the rest of the attempt; the choice and what it was made from go to the run's event log as a
``tuned`` event.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import fields as dataclass_fields
from typing import Any

from resilient_flows.checkpoint import CheckpointStats
from resilient_flows.mlc import MLCConfig, MLCParams, Recommender

WARMUP_CHECKPOINTS = 3
#: The shared tier's cadence when the recommender says never flush (no lost nodes to fear).
MAX_PERSIST_EVERY = 1 << 30
#: Floor of a measured duration, so that a ratio of two never divides by zero.
FLOOR_S = 1e-4
#: Ceiling of a measured slowdown: a flush that stops training entirely is a measurement gone wrong.
MAX_SLOWDOWN = 0.99
#: Step times needed both with and without a flush before they are compared.
MIN_SAMPLES = 3
#: A step counts as one with a flush when a flush ran for at least this share of a flush-free
#: step: a briefer overlap costs less than a step's own jitter.
MIN_OVERLAP = 0.2


class AutoTuner:
    """One member's measurements until it has enough, then one recommendation."""

    def __init__(self, process_mtbf_s: float, node_mtbf_s: float, steps: int) -> None:
        self.process_mtbf_s = process_mtbf_s
        self.node_mtbf_s = node_mtbf_s
        self.steps = steps
        self.created = time.monotonic()
        self.stalls: list[float] = []
        self.first_step: tuple[int, float] | None = None
        self.samples: list[tuple[float, float]] = []  # (seconds of a step, seconds of it a flush ran)
        self._previous: tuple[float, float] | None = None  # when the last step ended, the flusher's seconds then
        self._saved_since = False
        self.done = False  # set by the caller on every rank once the choice is applied

    def stepped(self, step: int, flush_seconds: float = 0.0) -> None:
        """Step ``step`` ended; ``flush_seconds``: the flusher's busy seconds so far (a counter).

        The time since the previous step is a sample, with the seconds of it a flush ran; a step
        with a save in it is no sample (its stall is the L1 cost, measured apart).
        """
        now = time.monotonic()
        if self.first_step is None:
            self.first_step = (step, now)
        if self._previous is not None and not self._saved_since:
            self.samples.append((now - self._previous[0], max(0.0, flush_seconds - self._previous[1])))
        self._previous, self._saved_since = (now, flush_seconds), False

    def saved(self, stats: CheckpointStats) -> None:
        self.stalls.append(stats.last_stall)
        self._saved_since = True

    def l2_slowdown(self) -> float:
        """The fraction of compute speed lost while a flush runs; 0 until :data:`MIN_SAMPLES` steps
        with and without a flush were seen.

        Compute goes at ``1 - s`` of its speed while a flush runs, so a step that a flush overlapped
        for ``d`` seconds takes ``s * d`` longer than the median flush-free step: ``s`` is the median
        of ``extra / d`` over the steps with a flush. That holds whether the flush covers the whole
        step or a part of it, so flushes shorter than a step are measured too.
        """
        idle = [t for t, d in self.samples if d == 0.0]
        if len(idle) < MIN_SAMPLES:
            return 0.0
        base = statistics.median(idle)
        busy = [(t - base) / d for t, d in self.samples if d > 0.0 and d >= MIN_OVERLAP * base]
        if len(busy) < MIN_SAMPLES:
            return 0.0
        return min(MAX_SLOWDOWN, max(0.0, statistics.median(busy)))

    def observed(self, stats: CheckpointStats, nodes: int = 1) -> dict[str, Any]:
        """What the measurement saw beyond the model's inputs: a checkpoint's bytes per node, the
        sample counts of ``l2_slowdown`` and every tier's own bandwidth (bytes/s, from the start of
        this rank's write to the commit, fastest tier first; None for a tier not written yet)."""
        return {
            "checkpoint_bytes": stats.last_checkpoint_bytes / nodes,
            "steps_with_flush": sum(d > 0.0 for _, d in self.samples),
            "steps_without_flush": sum(d == 0.0 for _, d in self.samples),
            "tier_bandwidths": [stats.bandwidth(tier) for tier in range(len(stats.tier_bytes))],
        }

    def ready(self, stats: CheckpointStats, two_tiers: bool) -> bool:
        """Enough checkpoints seen, and one of them through to the shared tier (its latency known)."""
        through = stats.persisted if two_tiers else stats.committed
        return len(self.stalls) >= WARMUP_CHECKPOINTS and through > 0

    def recommend(
        self, step: int, stats: CheckpointStats, two_tiers: bool, nodes: int = 1, time_left_s: float | None = None
    ) -> tuple[MLCParams, MLCConfig]:
        """What the member measured, and the configuration for the rest of its run.

        ``time_left_s``: seconds until its block is drained (None: no walltime). The drain commits a
        checkpoint anyway, so the run the interval must protect ends there: its solve time is capped.

        The shared tier is given by its measured latency (from a save to the commit there: the
        first tier's write and the wait for the flusher included). :class:`MLCParams` takes that
        or the bytes and bandwidths, not both: the bytes and each tier's bandwidth go to
        :meth:`observed`, for the ``tuned`` event.
        """
        assert self.first_step is not None
        first, began = self.first_step
        now = time.monotonic()
        pace = max(FLOOR_S, (now - began) / max(1, step - first + 1))
        l1_cost = max(FLOOR_S, statistics.median(self.stalls))
        latency = stats.last_persist_latency if two_tiers else stats.last_commit_latency
        l2_latency = max(l1_cost, latency)
        startup = max(l1_cost, began - self.created)
        # the node-local write goes on after the stall; without a shared tier it is the only write
        l1_latency = max(0.0, stats.last_commit_latency - l1_cost) if two_tiers else 0.0
        params = MLCParams(
            l1_cost=l1_cost,
            l1_latency=l1_latency,
            l1_restart=startup,
            l1_mtbf=self.process_mtbf_s,
            solve_time=max(1.0, min((self.steps - step - 1) * pace, math.inf if time_left_s is None else time_left_s)),
            l2_latency=l2_latency,
            l2_restart=startup + l2_latency,
            l2_mtbf=self.node_mtbf_s,
            l2_slowdown=self.l2_slowdown(),
            nodes=nodes,
        )
        return params, Recommender.default().recommend(params)


def tuned_fields(params: MLCParams, config: MLCConfig, observed: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``tuned`` event's fields: the inputs and the choice, enough to replay it, and what else
    the measurement ``observed``. Parameters at their defaults are left out (an infinite MTBF or
    bandwidth is no JSON number); ``MLCParams(**params)`` fills them in again."""
    given = {f.name: getattr(params, f.name) for f in dataclass_fields(params) if getattr(params, f.name) != f.default}
    fields = {"params": given, "interval_s": config.interval, "shared_every": config.l2_every}
    return fields | ({"observed": observed} if observed is not None else {})
