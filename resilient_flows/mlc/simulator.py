"""Monte Carlo simulation of a job that checkpoints as our engine does, under two kinds of failure.

The analytic models assume one level and blocking checkpoints. The engine has two levels, and its
shared-tier flush runs in the background. This simulator plays that protocol out so that a
configuration can be judged by its measured efficiency, ``solve_time / mean wall time``.

The model, as the engine behaves:

- Compute is cut into segments of ``interval`` seconds (the last one may be shorter). Each
  segment ends with an L1 checkpoint that blocks compute for ``l1_cost``; it counts once it has
  finished (is committed). The job is done when the checkpoint of its last segment is committed: a
  training job's result is its final checkpoint. So a failure-free job takes
  ``solve_time + ceil(solve_time / interval) * l1_cost``, and its efficiency is
  ``interval / (interval + l1_cost)`` when the interval divides the solve time.
- Every ``l2_every``-th L1 checkpoint since the job (re)started asks for a flush to L2, as the
  engine's save counter does. A flush takes ``l2_latency`` while compute goes on, and from its end
  protects the state it started from. Flushes run one at a time (the engine's single flusher
  thread). A request made while a flush is running waits and starts when that flush ends. If a
  newer request arrives before then, it replaces the waiting one: the engine would instead block
  its writer on its one-slot queue, which only matters when flushes are asked for faster than the
  shared tier takes them (``l2_every * (interval + l1_cost) < l2_latency``). In that case the
  simulator is slightly optimistic.
- L1 failures (process crashes) and L2 failures (lost nodes) are independent Poisson processes in
  wall-clock time, of rates ``1 / l1_mtbf`` and ``1 / l2_mtbf``. They strike during compute, during
  a checkpoint (which is then not committed) and during a restart (which begins again). Any failure
  kills the flusher: the running and the waiting flush are lost.
- After an L1 failure the job rolls back to its newest committed L1 checkpoint (or the start) and
  pays ``l1_restart``. After an L2 failure it rolls back to the newest completed L2 checkpoint (or
  the start) and pays ``l2_restart``: the node-local copies are gone. Until the next L1 checkpoint
  the only copy of the restored state is in L2, so an L1 failure in that window also pays
  ``l2_restart``. With L1 failures only this is exactly Daly's model (see
  :func:`~resilient_flows.mlc.analytic.daly_wall_time`).

How it runs. Between two failures everything is deterministic. So each trial advances from one
failure to the next in closed form: how many segments were committed, which flush had completed.
It does not step through segments. All trials (of all configurations, for
:func:`simulate_many`) advance in lock step, one failure or restart per numpy step.

Common random numbers. Failure arrival times are drawn per trial index from a generator seeded by
``(seed, level, block)`` and do not depend on the configuration. So two configurations simulated
with the same seed and number of trials meet the same failures, and the difference between them
is not sampling noise.

Guard. A trial that is still running at ``max_wall_factor * solve_time`` seconds of wall time, or
after ``max_events`` failures, is stopped. Its wall time is then the time it reached, a lower
bound, and the result counts it in ``stopped``. A configuration with stopped trials has an
efficiency that is an upper bound; it is hopeless anyway.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from resilient_flows.mlc.params import InvalidParameterError, MLCConfig, MLCParams, check_count, check_number

__all__ = ["MAX_EVENTS", "MAX_WALL_FACTOR", "SimResult", "simulate", "simulate_many"]

#: A trial is stopped at this many times the solve time of wall-clock time.
MAX_WALL_FACTOR = 1000.0
#: ... or after this many failures.
MAX_EVENTS = 20_000

_Z95 = 1.959963984540054  # two-sided 95% quantile of the normal distribution
_BLOCK = 32  # failure gaps drawn per trial at a time
_MAX_ROWS = 250_000  # trials x configurations simulated in one lock-step batch


@dataclass(frozen=True)
class SimResult:
    """What :func:`simulate` measured for one configuration.

    ``efficiency`` is ``solve_time / wall_time``. It is the ratio to the mean wall time, not the mean of
    per-trial ratios, so it is the throughput of many runs. ``wall_time_ci`` is the normal 95%
    interval of the mean. ``efficiency_ci`` is that interval mapped through ``solve_time / x``, with
    its upper end capped at the failure-free efficiency. ``stopped`` counts trials stopped by the
    guard (see the module docstring). ``l1_failures`` and ``l2_failures`` are the mean number of
    failures per trial. ``wall_times`` holds every trial's wall time.
    """

    config: MLCConfig
    trials: int
    efficiency: float
    efficiency_ci: tuple[float, float]
    wall_time: float
    wall_time_ci: tuple[float, float]
    l1_failures: float
    l2_failures: float
    stopped: int
    wall_times: np.ndarray = field(repr=False, compare=False)


def simulate(
    p: MLCParams,
    c: MLCConfig,
    trials: int = 1000,
    seed: int | None = 0,
    *,
    max_wall_factor: float = MAX_WALL_FACTOR,
    max_events: int = MAX_EVENTS,
) -> SimResult:
    """Simulate ``trials`` runs of the job ``p`` checkpointing as ``c`` says.

    Parameters
    ----------
    p:
        The job and its failures.
    c:
        The checkpointing policy.
    trials:
        Independent runs (``>= 1``). The confidence intervals need at least 2.
    seed:
        Seeds the failure arrivals. The same seed and ``trials`` give the same failures whatever
        ``c`` is. ``None`` draws fresh entropy.
    max_wall_factor, max_events:
        The guard against jobs that never finish: see the module docstring.

    Returns
    -------
    SimResult
    """
    return simulate_many(p, [c], trials, seed, max_wall_factor=max_wall_factor, max_events=max_events)[0]


def simulate_many(
    p: MLCParams,
    configs: Sequence[MLCConfig],
    trials: int = 1000,
    seed: int | None = 0,
    *,
    max_wall_factor: float = MAX_WALL_FACTOR,
    max_events: int = MAX_EVENTS,
) -> list[SimResult]:
    """:func:`simulate` for several configurations at once, with common random numbers; much faster than a loop."""
    if not isinstance(p, MLCParams):
        raise TypeError(f"p must be an MLCParams, got {type(p).__name__}")
    for i, c in enumerate(configs):
        if not isinstance(c, MLCConfig):
            raise TypeError(f"configs[{i}] must be an MLCConfig, got {type(c).__name__}")
    trials = check_count("trials", trials)
    max_events = check_count("max_events", max_events)
    max_wall_factor = check_number("max_wall_factor", max_wall_factor, positive=True)
    if max_wall_factor < 1:
        raise InvalidParameterError(f"max_wall_factor must be >= 1, got {max_wall_factor!r}")
    seed = _check_seed(seed)
    if not configs:
        return []
    intervals = np.array([c.interval for c in configs], dtype=float)
    everys = np.array([c.l2_every or 0 for c in configs], dtype=np.int64)
    per_batch = max(1, _MAX_ROWS // trials)
    parts = [
        _run(p, intervals[i : i + per_batch], everys[i : i + per_batch], trials, seed, max_wall_factor, max_events)
        for i in range(0, len(configs), per_batch)
    ]
    wall, stopped, f1, f2 = (np.concatenate([part[n] for part in parts]) for n in range(4))
    return [_result(p, c, wall[i], stopped[i], f1[i], f2[i]) for i, c in enumerate(configs)]


def _check_seed(seed: int | None) -> int:
    if seed is None:
        return int(np.random.SeedSequence().entropy)
    return check_count("seed", seed, minimum=0)


def _result(
    p: MLCParams, c: MLCConfig, wall: np.ndarray, stopped: np.ndarray, f1: np.ndarray, f2: np.ndarray
) -> SimResult:
    n = len(wall)
    mean = float(wall.mean())
    half = _Z95 * float(wall.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan
    low, high = mean - half, mean + half
    floor = _failure_free_wall(p, c.interval)
    return SimResult(
        config=c,
        trials=n,
        efficiency=p.solve_time / mean,
        efficiency_ci=(p.solve_time / high, p.solve_time / max(low, floor)),
        wall_time=mean,
        wall_time_ci=(low, high),
        l1_failures=float(f1.mean()),
        l2_failures=float(f2.mean()),
        stopped=int(stopped.sum()),
        wall_times=wall,
    )


def _segments(solve_time: float, interval: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(interval capped at the solve time, number of segments, length of the last one)."""
    tau = np.minimum(interval, solve_time)
    # A hair of slack: 100 h / 10 min is 600 segments even where the division rounds up.
    n = np.maximum(1, np.ceil(solve_time / tau * (1.0 - 1e-12))).astype(np.int64)
    last = solve_time - (n - 1) * tau
    return tau, n, last


def _failure_free_wall(p: MLCParams, interval: float) -> float:
    _, n, _ = _segments(p.solve_time, np.array([interval]))
    return p.solve_time + int(n[0]) * p.l1_cost


class _Arrivals:
    """Failure inter-arrival gaps of one level, by (trial, index), the same for every configuration.

    Gap ``j`` of trial ``i`` is column ``j % B`` of block ``j // B``, a ``trials x B`` array drawn from a
    generator seeded by ``(seed, level, j // B)``. Blocks are drawn when first needed and dropped
    once every trial still running has passed them.
    """

    def __init__(self, mtbf: float, trials: int, seed: int, level: int) -> None:
        self.mtbf, self.trials, self.seed, self.level = mtbf, trials, seed, level
        self.blocks: dict[int, np.ndarray] = {}

    def gap(self, tid: np.ndarray, idx: np.ndarray) -> np.ndarray:
        if math.isinf(self.mtbf):
            return np.full(len(tid), math.inf)
        out = np.empty(len(tid))
        block = idx // _BLOCK
        col = idx % _BLOCK
        for b in np.unique(block).tolist():
            if b not in self.blocks:
                rng = np.random.default_rng([self.seed, self.level, b])
                self.blocks[b] = rng.standard_exponential((self.trials, _BLOCK)) * self.mtbf
            sel = block == b
            out[sel] = self.blocks[b][tid[sel], col[sel]]
        return out

    def forget_before(self, idx: np.ndarray) -> None:
        if self.blocks and len(idx):
            first = int(idx.min()) // _BLOCK
            for b in [b for b in self.blocks if b < first]:
                del self.blocks[b]


class _Rows:
    """The trials still running, one row per (configuration, trial), as columns.

    Fixed per row: ``row`` (index into the results), ``tid`` (trial index, which picks its failure
    arrivals), ``u`` (a segment with its checkpoint), ``nseg`` (segments), ``ulast`` (the last one
    with its checkpoint), ``every`` (``l2_every``, 0 for never), ``period`` (wall time between flush
    requests). State: ``t`` (start of the current phase), ``restarting``, ``rcost`` (that restart's
    cost), ``k`` (segments committed when the phase began: the rollback target while restarting),
    ``l2`` (segments safe in L2), ``local`` (the state at ``k`` has a node-local copy), ``i1``/``i2``
    (index of the next failure gap), ``nf1``/``nf2`` (time of the next failure), ``f1``/``f2``
    (failures so far).
    """

    names = ("row", "tid", "u", "nseg", "ulast", "every", "period", "t", "restarting", "rcost")
    names += ("k", "l2", "local", "i1", "i2", "nf1", "nf2", "f1", "f2")

    def __init__(self, **columns: np.ndarray) -> None:
        self.__dict__.update(columns)

    def keep(self, mask: np.ndarray) -> None:
        for name in self.names:
            setattr(self, name, getattr(self, name)[mask])


def _run(
    p: MLCParams,
    intervals: np.ndarray,
    everys: np.ndarray,
    trials: int,
    seed: int,
    max_wall_factor: float,
    max_events: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Simulate ``trials`` runs of each configuration.

    Returns arrays of shape ``(configs, trials)``: wall time, stopped, L1 failures, L2 failures.
    """
    n_cfg = len(intervals)
    n = n_cfg * trials
    cfg = np.repeat(np.arange(n_cfg), trials)
    tau, nseg, last = _segments(p.solve_time, intervals)
    u = (tau + p.l1_cost)[cfg]
    every = everys[cfg]
    arrivals = (_Arrivals(p.l1_mtbf, trials, seed, 1), _Arrivals(p.l2_mtbf, trials, seed, 2))
    tid = np.tile(np.arange(trials), n_cfg)
    zeros = np.zeros(n, dtype=np.int64)  # for reading only; each column gets its own array
    s = _Rows(
        row=np.arange(n),
        tid=tid,
        u=u,
        nseg=nseg[cfg],
        ulast=(last + p.l1_cost)[cfg],
        every=every,
        period=np.where(every > 0, every * u, math.inf),
        t=np.zeros(n),
        restarting=np.zeros(n, dtype=bool),
        rcost=np.zeros(n),
        k=zeros.copy(),
        l2=zeros.copy(),
        local=np.ones(n, dtype=bool),
        i1=zeros.copy(),
        i2=zeros.copy(),
        nf1=arrivals[0].gap(tid, zeros),
        nf2=arrivals[1].gap(tid, zeros),
        f1=zeros.copy(),
        f2=zeros.copy(),
    )
    wall = np.empty(n)
    stopped = np.zeros(n, dtype=bool)
    fails1 = np.zeros(n, dtype=np.int64)
    fails2 = np.zeros(n, dtype=np.int64)
    cap = max_wall_factor * p.solve_time
    latency, r1, r2 = p.l2_latency, p.l1_restart, p.l2_restart

    while s.row.size:
        nf = np.minimum(s.nf1, s.nf2)
        left = s.nseg - s.k
        t_fin = s.t + (left - 1) * s.u + s.ulast
        end = np.where(s.restarting, s.t + s.rcost, t_fin)
        ok = nf >= end
        finish = ok & ~s.restarting
        back = ok & s.restarting
        fail = ~ok
        if fail.any():
            is2 = s.nf2 < s.nf1
            elapsed = nf - s.t
            done = np.where(s.restarting, 0, np.clip(np.floor(elapsed / s.u), 0, left - 1)).astype(np.int64)
            flushed = _flushed(elapsed, s.period, latency, s.every, s.restarting)
            safe = np.where(flushed > 0, np.maximum(s.l2, s.k + flushed * s.every), s.l2)
            local1 = s.local | (done >= 1)
            s.k = np.where(fail, np.where(is2, safe, s.k + done), s.k)
            s.l2 = np.where(fail, safe, s.l2)
            s.rcost = np.where(fail, np.where(is2 | ~local1, r2, r1), s.rcost)
            s.local = np.where(fail, ~is2 & local1, s.local)
            s.t = np.where(fail, nf, s.t)
            for level, (hit, idx, nxt, count) in enumerate(
                ((fail & ~is2, s.i1, s.nf1, s.f1), (fail & is2, s.i2, s.nf2, s.f2))
            ):
                if hit.any():
                    idx += hit  # in place: these are s's own arrays
                    nxt[hit] += arrivals[level].gap(s.tid[hit], idx[hit])
                    count += hit
        s.t = np.where(back, end, s.t)
        s.restarting = (s.restarting & ~back) | fail
        wall[s.row[finish]] = t_fin[finish]
        stop = ~finish & ((s.t >= cap) | (s.f1 + s.f2 >= max_events))
        wall[s.row[stop]] = s.t[stop]
        stopped[s.row[stop]] = True
        gone = finish | stop
        if gone.any():
            fails1[s.row[gone]] = s.f1[gone]
            fails2[s.row[gone]] = s.f2[gone]
            s.keep(~gone)
            for a, idx in zip(arrivals, (s.i1, s.i2), strict=True):
                a.forget_before(idx)
    shape = (n_cfg, trials)
    return wall.reshape(shape), stopped.reshape(shape), fails1.reshape(shape), fails2.reshape(shape)


def _flushed(
    elapsed: np.ndarray, period: np.ndarray, latency: float, every: np.ndarray, restarting: np.ndarray
) -> np.ndarray:
    """Index ``i`` (0: none) of the newest flush request completed ``elapsed`` seconds into a run.

    A run begins when a restart ends (or at 0) with an idle flusher; request ``i >= 1`` comes at
    ``i * period`` with the state ``i * every`` segments further on. If ``period >= latency`` the
    flusher is never busy when a request comes: flush ``i`` ends at ``i * period + latency``.
    Otherwise it never rests: flushes end at ``period + n * latency``, and the ``n``-th one started
    at ``period + (n - 1) * latency`` with the newest request made by then.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        sparse = np.floor((elapsed - latency) / period)
        n = np.floor((elapsed - period) / latency)
        busy = np.where(n >= 1, np.floor((period + (n - 1) * latency) / period), 0)
        i = np.where(period >= latency, sparse, busy)
    i = np.where((every > 0) & ~restarting & (i >= 1), i, 0)
    return i.astype(np.int64)
