"""The configuration the simulator likes best: the slow ground truth for the analytic and learned models.

A coarse grid, then local refinement. The interval is log-spaced from a tenth to ten times
Young's interval for all failures together (``sqrt(2 * l1_cost / (lambda_1 + lambda_2 + lambda_3))``):
an L1 checkpoint is also what a flush starts from, so every kind of failure shortens it. The grid
widens while its best interval lies on its edge. ``l2_every`` is log-spaced from 1 to
``max_l2_every``; it is ``None`` alone when only L1 failures happen, because then flushing only
costs. With three levels ``l3_every`` is log-spaced from 1 to ``max_l3_every`` as well, on coarser
grids (three dimensions instead of two). Each refinement round puts a finer grid, a third of the
previous spacing, around the best point.

What is best is the :class:`~resilient_flows.mlc._params.Objective`'s score: the efficiency by
default, or the efficiency less a price per byte of shared-tier traffic, among the configurations
under a traffic cap. Every result carries both figures, efficiency and traffic.

All candidates are simulated with the same seed and number of trials: common random numbers (see
:mod:`~resilient_flows.mlc._simulator`). Two candidates are compared on the same failures, so the
search ranks them by their real difference and not by sampling noise. The returned
``predicted_efficiency`` is the best candidate's simulated efficiency. It is the maximum over
candidates measured on the same failures, so it is slightly optimistic, by about the width of its
confidence interval at most. Simulate the result with another seed for an unbiased figure.

The slowest candidates are the hopeless ones, those that roll back far and fail again. Each batch
therefore stops trials at a few times the best mean wall time found so far. A candidate stopped
there is rejected only when even its optimistic (upper bound) efficiency loses to the best score
(a score never exceeds the efficiency); otherwise it is simulated again in full. The result is the
same as without the cap, and much faster.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

from resilient_flows.mlc._analytic import young_interval
from resilient_flows.mlc._params import MLCConfig, MLCParams, Objective, check_count
from resilient_flows.mlc._simulator import MAX_WALL_FACTOR, FailureSimResult, simulate_failures_many

logger = logging.getLogger(__name__)

_GRID_POINTS = 13  # per decade: 6; the interval grid spans two decades
_GRID_POINTS_3 = 7  # l2_every and l3_every points with three levels
_REFINE_ROUNDS = 3
_MAX_WIDENINGS = 6

_Key = tuple[float, int, int]  # (interval, l2_every or 0, l3_every or 0)


def search(
    p: MLCParams,
    trials: int = 1000,
    seed: int = 0,
    *,
    max_l2_every: int = 256,
    max_l3_every: int = 64,
    objective: Objective | None = None,
) -> MLCConfig:
    """Find the simulator-optimal configuration for the job ``p``.

    Parameters
    ----------
    p:
        The job and its failures.
    trials:
        Simulated runs per candidate. More gives a sharper optimum; the time grows linearly.
    seed:
        Seeds the failures every candidate meets (common random numbers).
    max_l2_every, max_l3_every:
        The largest ``l2_every`` and ``l3_every`` tried.
    objective:
        What to maximise; the default is the efficiency alone.

    Returns
    -------
    MLCConfig
        The best configuration found, with ``predicted_efficiency`` and ``predicted_traffic`` set to
        its simulated figures. When no failure can happen: one checkpoint at the end, no flushes.
        When even the starting point cannot finish (most of its trials stopped by the simulator's
        guard): that starting point, with a warning; its efficiency is then an upper bound. When no
        candidate meets the traffic cap: the one with the least traffic, with a warning.
    """
    if not isinstance(p, MLCParams):
        raise TypeError(f"p must be an MLCParams, got {type(p).__name__}")
    trials = check_count("trials", trials)
    seed = check_count("seed", seed, minimum=0)
    max_l2_every = check_count("max_l2_every", max_l2_every)
    max_l3_every = check_count("max_l3_every", max_l3_every)
    objective = Objective() if objective is None else objective
    if not isinstance(objective, Objective):
        raise TypeError(f"objective must be an Objective, got {type(objective).__name__}")
    objective.check(p)
    rate = p.l1_rate + p.l2_rate + p.l3_rate
    if rate == 0:
        efficiency = p.solve_time / (p.solve_time + p.l1_cost)
        return MLCConfig(p.solve_time, None, efficiency, predicted_traffic=0.0 if p.checkpoint_bytes > 0 else None)
    state = _Search(p, trials, seed, objective)
    flush = p.three_level or p.l2_rate > 0
    deep = p.three_level

    base = young_interval(p.l1_cost, 1.0 / rate) or p.solve_time * 1e-4  # a free checkpoint: start small
    start = state.evaluate([base], [1 if flush else 0], [1 if deep else 0])
    if start is None:  # never: a fresh search simulates its first candidate
        raise RuntimeError("search: the starting point was not simulated")
    if start.stopped > trials // 2:
        logger.warning(
            "search: the job practically never finishes (%d of %d trials at %.0f s stopped by the guard); "
            "returning the starting point",
            start.stopped,
            trials,
            base,
        )
        return _config(start.config.interval, (start.config.l2_every or 0, start.config.l3_every or 0), start)
    points = _GRID_POINTS_3 if deep else _GRID_POINTS
    everys = _log_grid(max_l2_every, points) if flush else [0]
    deeps = _log_grid(max_l3_every, points) if deep else [0]
    step = _coarse(state, base, everys, deeps)
    e_step = math.log10(max_l2_every) / (points - 1) if max_l2_every > 1 else 0.0
    d_step = math.log10(max_l3_every) / (points - 1) if max_l3_every > 1 else 0.0
    _refine(state, (step, e_step, d_step), max_l2_every, max_l3_every, deep)
    key = state.best()
    logger.debug("search: %d candidates, best %s", len(state.results), key)
    return _config(key[0], key[1:], state.results[key])


def _coarse(state: _Search, base: float, everys: list[int], deeps: list[int]) -> float:
    """A grid of intervals from 0.1x to 10x ``base`` (widened while the best lies on its edge: the
    optimum may lie outside when failures are extreme) times the counts; the grid's step, in decades."""
    p = state.p
    step = 1.0 / 6.0  # decades between grid points
    state.evaluate(base * 10.0 ** (step * np.arange(-6, 7)), everys, deeps)
    for _ in range(_MAX_WIDENINGS):
        tau = state.best()[0]
        known = sorted({key[0] for key in state.results})
        if tau == known[0] and tau > p.solve_time * 1e-9:
            state.evaluate(tau * 10.0 ** (-step * np.arange(1, 4)), everys, deeps)
        elif tau == known[-1] and tau < p.solve_time:
            state.evaluate(tau * 10.0 ** (step * np.arange(1, 4)), everys, deeps)
        else:
            break
    return step


def _refine(
    state: _Search, steps: tuple[float, float, float], max_l2_every: int, max_l3_every: int, deep: bool
) -> None:
    """Rounds around the best so far, each a third as wide as the one before (``steps``: the
    interval's in decades, then the counts' in decades of their own)."""
    step, e_step, d_step = steps
    for _ in range(_REFINE_ROUNDS):
        tau, e, d = state.best()
        step /= 3.0
        e_step /= 3.0
        d_step /= 3.0
        reach = 1 if deep else 3  # three dimensions: a narrower neighbourhood in the counts
        state.evaluate(
            tau * 10.0 ** (step * np.arange(-3, 4)),
            _near(e, e_step, max_l2_every, reach),
            _near(d, d_step, max_l3_every, reach),
        )


def _log_grid(largest: int, points: int) -> list[int]:
    return sorted({round(x) for x in np.geomspace(1, largest, points)})


def _near(every: int, step: float, largest: int, reach: int) -> list[int]:
    """Whole numbers ``reach`` steps around ``every`` on a log grid ``step`` decades apart, and its
    neighbours; [0] for never."""
    if not every:
        return [0]
    spread = {round(every * 10.0**x) for x in step * np.arange(-reach, reach + 1)} | {every - 1, every, every + 1}
    return sorted(x for x in spread if 1 <= x <= largest)


def _config(tau: float, everys: tuple[int, int], r: FailureSimResult) -> MLCConfig:
    e, d = everys
    return MLCConfig(tau, e or None, r.efficiency, l3_every=d or None, predicted_traffic=r.traffic)


class _Search:
    """The candidates simulated so far, keyed by ``(interval, l2_every or 0, l3_every or 0)``, and their results.

    Candidates far worse than the best so far would cost the most time: they fail and roll back
    the most. So each batch runs with the simulator's guard at ``CAP_MARGIN`` times the mean wall
    time of the best score so far. A candidate that had trials stopped there has an efficiency that
    is an upper bound. If that upper bound still loses to the best score, the candidate is rejected,
    which is exact (a score never exceeds the efficiency). Otherwise it is simulated again under
    the usual guard.
    """

    CAP_MARGIN = 3.0

    def __init__(self, p: MLCParams, trials: int, seed: int, objective: Objective) -> None:
        self.p, self.trials, self.seed, self.objective = p, trials, seed, objective
        self.results: dict[_Key, FailureSimResult] = {}
        self.scores: dict[_Key, float] = {}
        self.top = 0.0

    def best(self) -> _Key:
        """The best score (ties: the longer interval); the least traffic when no candidate meets the cap."""
        key = max(self.scores, key=lambda k: (self.scores[k], k[0]))
        if self.scores[key] == -math.inf:
            key = min(self.results, key=lambda k: (self.results[k].traffic, -self.results[k].efficiency))
            logger.warning("search: no candidate meets the traffic cap; returning the one with the least traffic")
        return key

    def evaluate(
        self, intervals: Sequence[float] | np.ndarray, everys: Sequence[int], deeps: Sequence[int]
    ) -> FailureSimResult | None:
        """Simulate the candidates not seen yet; return the best-scoring result of this batch."""
        p = self.p
        todo = [
            (float(tau), e, d)
            for tau in np.unique(np.minimum(np.asarray(intervals, dtype=float), p.solve_time))
            for e in everys
            for d in deeps
            if (float(tau), e, d) not in self.scores
        ]
        configs = [MLCConfig(tau, e or None, l3_every=d or None) for tau, e, d in todo]
        factor = MAX_WALL_FACTOR if self.top <= 0 else min(MAX_WALL_FACTOR, self.CAP_MARGIN / self.top)
        results = simulate_failures_many(p, configs, self.trials, self.seed, max_wall_factor=factor)
        again = [
            i for i, r in enumerate(results) if r.stopped and factor < MAX_WALL_FACTOR and r.efficiency >= self.top
        ]
        if again:
            redone = simulate_failures_many(p, [configs[i] for i in again], self.trials, self.seed)
            for i, r in zip(again, redone, strict=True):
                results[i] = r
        for key, r in zip(todo, results, strict=True):
            self.results[key] = r
            self.scores[key] = self.objective.score(r.efficiency, r.traffic)
        if not results:
            return None
        top = max(results, key=lambda r: self.objective.score(r.efficiency, r.traffic))
        self.top = max(self.top, self.objective.score(top.efficiency, top.traffic))
        return top
