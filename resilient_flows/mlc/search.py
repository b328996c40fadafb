"""The configuration the simulator likes best: the slow ground truth for the analytic and learned models.

A coarse grid, then local refinement. The interval is log-spaced from a tenth to ten times
Young's interval for all failures together (``sqrt(2 * l1_cost / (lambda_1 + lambda_2))``): an L1
checkpoint is also what a flush starts from, so both kinds of failure shorten it. The grid widens
while its best interval lies on its edge. ``l2_every`` is log-spaced from 1 to ``max_l2_every``;
it is ``None`` alone when L2 failures never happen, because then flushing changes nothing. Each
refinement round puts a finer grid, a third of the previous spacing, around the best point.

All candidates are simulated with the same seed and number of trials: common random numbers (see
:mod:`~resilient_flows.mlc.simulator`). Two candidates are compared on the same failures, so the
search ranks them by their real difference and not by sampling noise. The returned
``predicted_efficiency`` is the best candidate's simulated efficiency. It is the maximum over
candidates measured on the same failures, so it is slightly optimistic, by about the width of its
confidence interval at most. Simulate the result with another seed for an unbiased figure.

The slowest candidates are the hopeless ones, those that roll back far and fail again. Each batch
therefore stops trials at a few times the best mean wall time found so far. A candidate stopped
there is rejected only when even its optimistic (upper bound) efficiency loses; otherwise it is
simulated again in full. The result is the same as without the cap, and much faster.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

from resilient_flows.mlc.analytic import young_interval
from resilient_flows.mlc.params import MLCConfig, MLCParams, check_count
from resilient_flows.mlc.simulator import MAX_WALL_FACTOR, SimResult, simulate_many

__all__ = ["search"]

logger = logging.getLogger(__name__)

_GRID_POINTS = 13  # per decade: 6; the interval grid spans two decades
_REFINE_ROUNDS = 3
_MAX_WIDENINGS = 6


def search(p: MLCParams, trials: int = 1000, seed: int = 0, *, max_l2_every: int = 256) -> MLCConfig:
    """Find the simulator-optimal configuration for the job ``p``.

    Parameters
    ----------
    p:
        The job and its failures.
    trials:
        Simulated runs per candidate. More gives a sharper optimum; the time grows linearly.
    seed:
        Seeds the failures every candidate meets (common random numbers).
    max_l2_every:
        The largest ``l2_every`` tried.

    Returns
    -------
    MLCConfig
        The best configuration found, with ``predicted_efficiency`` set to its simulated efficiency.
        When no failure can happen: one checkpoint at the end, no flushes. When even the starting
        point cannot finish (most of its trials stopped by the simulator's guard): that starting
        point, with a warning; its efficiency is then an upper bound.
    """
    if not isinstance(p, MLCParams):
        raise TypeError(f"p must be an MLCParams, got {type(p).__name__}")
    trials = check_count("trials", trials)
    seed = check_count("seed", seed, minimum=0)
    max_l2_every = check_count("max_l2_every", max_l2_every)
    rate = p.l1_rate + p.l2_rate
    if rate == 0:
        return MLCConfig(p.solve_time, None, predicted_efficiency=p.solve_time / (p.solve_time + p.l1_cost))
    state = _Search(p, trials, seed)

    base = young_interval(p.l1_cost, 1.0 / rate) or p.solve_time * 1e-4  # a free checkpoint: start small
    start = state.evaluate([base], [0 if p.l2_rate == 0 else 1])
    if start.stopped > trials // 2:
        logger.warning(
            "search: the job practically never finishes (%d of %d trials at %.0f s stopped by the guard); "
            "returning the starting point",
            start.stopped,
            trials,
            base,
        )
        return MLCConfig(start.config.interval, start.config.l2_every, predicted_efficiency=start.efficiency)

    step = 1.0 / 6.0  # decades between grid points
    intervals = base * 10.0 ** (step * np.arange(-6, 7))
    everys = [0] if p.l2_rate == 0 else sorted({round(x) for x in np.geomspace(1, max_l2_every, _GRID_POINTS)})
    state.evaluate(intervals, everys)
    for _ in range(_MAX_WIDENINGS):  # the optimum may lie outside 0.1x .. 10x when failures are extreme
        tau, _e = state.best()
        known = sorted({key[0] for key in state.scores})
        if tau == known[0] and tau > p.solve_time * 1e-9:
            state.evaluate(tau * 10.0 ** (-step * np.arange(1, 4)), everys)
        elif tau == known[-1] and tau < p.solve_time:
            state.evaluate(tau * 10.0 ** (step * np.arange(1, 4)), everys)
        else:
            break

    e_step = math.log10(max_l2_every) / (_GRID_POINTS - 1) if max_l2_every > 1 else 0.0
    for _ in range(_REFINE_ROUNDS):
        tau, e = state.best()
        step /= 3.0
        e_step /= 3.0
        near = [0]
        if e:
            spread = {round(e * 10.0**x) for x in e_step * np.arange(-3, 4)} | {e - 1, e, e + 1}
            near = sorted(x for x in spread if 1 <= x <= max_l2_every)
        state.evaluate(tau * 10.0 ** (step * np.arange(-3, 4)), near)
    tau, e = state.best()
    logger.debug("search: %d candidates, best interval %.1f s, l2_every %s", len(state.scores), tau, e or None)
    return MLCConfig(tau, e or None, predicted_efficiency=state.scores[(tau, e)])


class _Search:
    """The candidates simulated so far, keyed by ``(interval, l2_every or 0)``, and their efficiencies.

    Candidates far worse than the best so far would cost the most time: they fail and roll back
    the most. So each batch runs with the simulator's guard at ``CAP_MARGIN`` times the best
    candidate's mean wall time. A candidate that had trials stopped there has an efficiency that is
    an upper bound. If that upper bound still loses to the best, the candidate is rejected, which
    is exact. Otherwise it is simulated again under the usual guard.
    """

    CAP_MARGIN = 3.0

    def __init__(self, p: MLCParams, trials: int, seed: int) -> None:
        self.p, self.trials, self.seed = p, trials, seed
        self.scores: dict[tuple[float, int], float] = {}
        self.top = 0.0

    def best(self) -> tuple[float, int]:
        return max(self.scores, key=lambda key: (self.scores[key], key[0]))  # ties: the longer interval

    def evaluate(self, intervals: Sequence[float] | np.ndarray, everys: Sequence[int]) -> SimResult | None:
        """Simulate the candidates not seen yet; return the best result of this batch."""
        p = self.p
        todo = [
            (float(tau), e)
            for tau in np.unique(np.minimum(np.asarray(intervals, dtype=float), p.solve_time))
            for e in everys
            if (float(tau), e) not in self.scores
        ]
        configs = [MLCConfig(tau, e or None) for tau, e in todo]
        factor = MAX_WALL_FACTOR if self.top == 0 else min(MAX_WALL_FACTOR, self.CAP_MARGIN / self.top)
        results = simulate_many(p, configs, self.trials, self.seed, max_wall_factor=factor)
        again = [
            i for i, r in enumerate(results) if r.stopped and factor < MAX_WALL_FACTOR and r.efficiency >= self.top
        ]
        if again:
            redone = simulate_many(p, [configs[i] for i in again], self.trials, self.seed)
            for i, r in zip(again, redone, strict=True):
                results[i] = r
        for key, r in zip(todo, results, strict=True):
            self.scores[key] = r.efficiency
        if not results:
            return None
        top = max(results, key=lambda r: r.efficiency)
        self.top = max(self.top, top.efficiency)
        return top
