"""When a member checkpoints: every N steps or seconds, or (``interval: auto``) at the interval the
recommender picks once the first checkpoints are measured, for a run that ends at the latest when
its block is drained (a block's walltime: see :mod:`resilient_flows.training._walltime`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from resilient_flows.checkpoint import Checkpointer
from resilient_flows.checkpoint._config import CheckpointConfig
from resilient_flows.training._autotune import MAX_PERSIST_EVERY, AutoTuner, tuned_fields
from resilient_flows.training.boundary._ranks import Ranks


class Cadence:
    """A member's checkpoint interval, in steps or seconds since the last save, and its tuning."""

    def __init__(
        self,
        spec: CheckpointConfig,
        steps: int,
        checkpointer: Checkpointer,
        drain_in: Callable[[], float | None] = lambda: None,
    ) -> None:
        """``drain_in``: seconds until the member's block is drained, None when it never is."""
        self.interval_steps, self.interval_s = spec.interval_steps, spec.interval_s
        self._checkpointer = checkpointer
        self._drain_in = drain_in
        self._last_save = time.monotonic()
        self._tuner = _tuner(spec, steps) if spec.auto else None

    def due(self, step: int) -> bool:
        """Whether a checkpoint of ``step`` is due."""
        if self.interval_steps is not None and (step + 1) % self.interval_steps == 0:
            return True
        return self.interval_s is not None and time.monotonic() - self._last_save >= self.interval_s

    def steps_to_next(self, step: int) -> int | None:
        """How many steps from ``step`` (the next to run) on, that one included, until a checkpoint
        by the step interval is due; None without one."""
        if self.interval_steps is None:
            return None
        return self.interval_steps - step % self.interval_steps

    def saved(self) -> None:
        self._last_save = time.monotonic()
        if self._tuner is not None:
            self._tuner.saved(self._checkpointer.stats)

    def tune(self, step: int, ranks: Ranks, emit: Callable[..., None]) -> None:
        """``interval: auto``: once the warm-up checkpoints are measured, take the recommender's
        choice, the same on every rank (which checkpoint on the same steps). No collective once tuned."""
        tuner = self._tuner
        if tuner is None or tuner.done:
            return
        ck = self._checkpointer
        tuner.stepped(step, ck.flush_seconds)  # step times and their flush: l2_slowdown
        two_tiers = ck.local is not None
        choice: tuple[float, int, dict[str, Any]] | None = None
        if ranks.rank == 0 and tuner.ready(ck.stats, two_tiers):
            params, config = tuner.recommend(step, ck.stats, two_tiers, ck.nodes, self._drain_in())
            fields = tuned_fields(params, config, tuner.observed(ck.stats, ck.nodes))
            choice = (config.interval, config.l2_every or MAX_PERSIST_EVERY, fields)
        choice = ranks.broadcast(choice)
        if choice is None:
            return
        tuner.done = True
        self.interval_s, ck.shared_every, fields = choice
        self.interval_steps = None
        emit("tuned", step=step, **fields)


def _tuner(spec: CheckpointConfig, steps: int) -> AutoTuner:
    """The tuner of an ``auto`` spec, whose planner set both failure rates."""
    if spec.process_mtbf_s is None or spec.node_mtbf_s is None:
        raise ValueError("auto checkpoint intervals need process_mtbf_s and node_mtbf_s")
    return AutoTuner(spec.process_mtbf_s, spec.node_mtbf_s, steps)
