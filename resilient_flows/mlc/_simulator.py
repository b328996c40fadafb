"""Monte Carlo simulation of a job that checkpoints as our engine does, under two or three kinds of failure.

The analytic models assume one level and blocking checkpoints. The engine has two or three levels,
and its flushes to the upper ones run in the background. This simulator plays that protocol out so
that a configuration can be judged by its measured efficiency, ``solve_time / mean wall time``.

The model, as the engine behaves:

- Compute is cut into segments of ``interval`` seconds (the last one may be shorter). Each
  segment ends with an L1 checkpoint that blocks compute for ``p.checkpoint_cost(interval)``: the
  copy (``l1_cost``) and, when the node-local write (``l1_latency``) is longer than a segment, the
  wait for the previous checkpoint's write. A checkpoint counts (is committed) ``l1_latency``
  after its copy ends. The job is done when the checkpoint of its last segment is committed: a
  training job's result is its final checkpoint. Without flushes a failure-free job takes
  ``solve_time + ceil(solve_time / interval) * checkpoint_cost + l1_latency``.
- Every ``l2_every``-th L1 checkpoint since the job (re)started asks for a flush, as the engine's
  save counter does; with three levels every ``l3_every``-th of those flushes goes on to L3. A
  flush takes ``l2_latency`` (plus the L3 part, for those that go on) and from the end of each part
  protects the state it started from against that level's failures. One flusher runs the flushes
  in order behind a one-slot queue: a request made while a flush runs waits in the slot; a request
  made while the slot is taken blocks the writer, and compute with it, until the running flush ends
  and the slot frees.
- While the flusher runs, compute goes ``l2_slowdown`` slower; checkpoints and blocked waits are
  not compute and are not slowed. The flush's latency is wall-clock time.
- Failures of each level are independent Poisson processes in wall-clock time, of rates
  ``1 / l1_mtbf``, ``1 / l2_mtbf`` and ``1 / l3_mtbf``. They strike during compute, during a
  checkpoint (which is then not committed) and during a restart (which begins again). Any failure
  kills the flusher: the running and the waiting flush are lost.
- After an L1 failure the job rolls back to its newest committed L1 checkpoint (or the start) and
  pays ``l1_restart``. After a level-``k`` failure (``k`` = 2, 3) it rolls back to the newest
  checkpoint level ``k`` holds (or the start) and pays level ``k``'s restart; the copies of the
  levels below are gone (an L3 failure leaves L2 empty, so the next L2 failure restores from L3 and
  pays ``l3_restart``). Until the next L1 checkpoint the restored state has no node-local copy, so
  an L1 failure in that window pays the restart of the level it came from. With L1 failures only
  this is exactly Daly's model (see :func:`~resilient_flows.mlc._analytic.daly_wall_time`).

How it runs. Between two failures everything is deterministic, and every run (from the start, or
from the end of a restart) begins alike: an idle flusher and a save counter at zero. So a run is a
schedule that depends on the configuration only, not on the trial: when the writer resumes after
its ``c``-th flush request, when the flusher is busy, when each flush started. Without slowdown,
when each flush ends before the next request, the schedule is closed-form (a commit every
``interval`` plus a checkpoint, a flush every ``l2_every`` of them). Otherwise :class:`_Schedule` computes it
one request at a time for all configurations at once, until the flusher's state at a request
repeats (idle, or blocked, at the same place in the ``l3_every`` cycle); from there on it is
periodic and extended in closed form. Each trial then advances from one failure to the next by
looking the failure's time up in its schedule (a binary search): how many segments were
committed, which flushes had completed. It does not step through segments. All trials (of all
configurations, for :func:`simulate_failures_many`) advance in lock step, one failure or restart per numpy
step.

Common random numbers. Failure arrival times are drawn per trial index from a generator seeded by
``(seed, level, block)`` and do not depend on the configuration. So two configurations simulated
with the same seed and number of trials meet the same failures, and the difference between them
is not sampling noise.

Traffic. Every flush that reaches the shared tier (L2 of two levels, L3 of three) is counted when
its shared part starts, even if a failure cuts it short: its bytes were being sent.

Guard. A trial that is still running at ``max_wall_factor * solve_time`` seconds of wall time, or
after ``max_events`` failures, is stopped. Its wall time is then the time it reached, a lower
bound, and the result counts it in ``stopped``. A configuration with stopped trials has an
efficiency that is an upper bound; it is hopeless anyway.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from resilient_flows.mlc._params import InvalidParameterError, MLCConfig, MLCParams, check_count, check_number

#: A trial is stopped at this many times the solve time of wall-clock time.
MAX_WALL_FACTOR = 1000.0
#: ... or after this many failures.
MAX_EVENTS = 20_000

_Z95 = 1.959963984540054  # two-sided 95% quantile of the normal distribution
_BLOCK = 32  # failure gaps drawn per trial at a time
_MAX_ROWS = 250_000  # trials x configurations simulated in one lock-step batch
_HOUR = 3600.0


@dataclass(frozen=True)
class FailureSimResult:
    """What :func:`simulate_failures` measured for one configuration.

    ``efficiency`` is ``solve_time / wall_time``. It is the ratio to the mean wall time, not the mean of
    per-trial ratios, so it is the throughput of many runs. ``wall_time_ci`` is the normal 95%
    interval of the mean. ``efficiency_ci`` is that interval mapped through ``solve_time / x``, with
    its upper end capped at the failure-free efficiency. ``stopped`` counts trials stopped by the
    guard (see the module docstring). ``l1_failures``, ``l2_failures`` and ``l3_failures`` are the
    mean number of failures per trial. ``shared_flushes`` is the mean number of flushes per trial
    that reached the shared tier, and ``traffic`` what they sent, in bytes per hour of wall time per
    node (``None`` when the parameters give the flush's latency instead of its bytes).
    ``wall_times`` holds every trial's wall time.
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
    l3_failures: float
    shared_flushes: float
    traffic: float | None
    wall_times: np.ndarray = field(repr=False, compare=False)


def simulate_failures(
    p: MLCParams,
    c: MLCConfig,
    trials: int = 1000,
    seed: int | None = 0,
    *,
    max_wall_factor: float = MAX_WALL_FACTOR,
    max_events: int = MAX_EVENTS,
) -> FailureSimResult:
    """Simulate ``trials`` runs of the job ``p`` checkpointing as ``c`` says.

    Parameters
    ----------
    p:
        The job and its failures.
    c:
        The checkpointing policy. ``l3_every`` needs parameters with a third level.
    trials:
        Independent runs (``>= 1``). The confidence intervals need at least 2.
    seed:
        Seeds the failure arrivals. The same seed and ``trials`` give the same failures whatever
        ``c`` is. ``None`` draws fresh entropy.
    max_wall_factor, max_events:
        The guard against jobs that never finish: see the module docstring.

    Returns
    -------
    FailureSimResult
    """
    return simulate_failures_many(p, [c], trials, seed, max_wall_factor=max_wall_factor, max_events=max_events)[0]


def simulate_failures_many(
    p: MLCParams,
    configs: Sequence[MLCConfig],
    trials: int = 1000,
    seed: int | None = 0,
    *,
    max_wall_factor: float = MAX_WALL_FACTOR,
    max_events: int = MAX_EVENTS,
) -> list[FailureSimResult]:
    """:func:`simulate_failures` for several configurations at once, with common random numbers; much
    faster than a loop."""
    if not isinstance(p, MLCParams):
        raise TypeError(f"p must be an MLCParams, got {type(p).__name__}")
    for i, c in enumerate(configs):
        if not isinstance(c, MLCConfig):
            raise TypeError(f"configs[{i}] must be an MLCConfig, got {type(c).__name__}")
        if c.l3_every is not None and not p.three_level:
            raise InvalidParameterError(
                f"configs[{i}].l3_every is set, but the parameters have no third level (l3_mtbf)"
            )
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
    l3s = np.array([c.l3_every or 0 for c in configs], dtype=np.int64)
    per_batch = max(1, _MAX_ROWS // trials)
    parts = [
        _run(
            p,
            intervals[i : i + per_batch],
            everys[i : i + per_batch],
            l3s[i : i + per_batch],
            trials,
            seed,
            max_wall_factor,
            max_events,
        )
        for i in range(0, len(configs), per_batch)
    ]
    wall, stopped, f1, f2, f3, flushes = (np.concatenate([part[n] for part in parts]) for n in range(6))
    return [_result(p, c, wall[i], stopped[i], (f1[i], f2[i], f3[i]), flushes[i]) for i, c in enumerate(configs)]


def _check_seed(seed: int | None) -> int:
    if seed is None:
        entropy = np.random.SeedSequence().entropy
        assert isinstance(entropy, int)  # drawn when none is given: one int, never the sequence passed
        return entropy
    return check_count("seed", seed, minimum=0)


def _result(
    p: MLCParams,
    c: MLCConfig,
    wall: np.ndarray,
    stopped: np.ndarray,
    failures: tuple[np.ndarray, np.ndarray, np.ndarray],
    flushes: np.ndarray,
) -> FailureSimResult:
    n = len(wall)
    mean = float(wall.mean())
    half = _Z95 * float(wall.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan
    low, high = mean - half, mean + half
    floor = _failure_free_wall(p, c.interval)
    f1, f2, f3 = failures
    rate = float(flushes.sum()) / float(wall.sum()) * _HOUR
    return FailureSimResult(
        config=c,
        trials=n,
        efficiency=p.solve_time / mean,
        efficiency_ci=(p.solve_time / high, p.solve_time / max(low, floor)),
        wall_time=mean,
        wall_time_ci=(low, high),
        l1_failures=float(f1.mean()),
        l2_failures=float(f2.mean()),
        stopped=int(stopped.sum()),
        l3_failures=float(f3.mean()),
        shared_flushes=float(flushes.mean()),
        traffic=rate * p.checkpoint_bytes if p.checkpoint_bytes > 0 else None,
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
    """A lower bound on any trial's wall time: the segments and their checkpoints, nothing slowed."""
    tau, n, _ = _segments(p.solve_time, np.array([interval]))
    return p.solve_time + int(n[0]) * float(_checkpoint_costs(p, tau)[0]) + p.l1_latency


def _checkpoint_costs(p: MLCParams, tau: np.ndarray) -> np.ndarray:
    """:meth:`MLCParams.checkpoint_cost` of each configuration's (capped) interval."""
    return p.l1_cost + np.maximum(0.0, p.l1_latency - tau)


class FailureArrivals:
    """Failure inter-arrival gaps of one level, by (trial, index), the same for every configuration.

    Public so that a driver of real runs can inject the very failures that :func:`simulate_failures` with
    the same ``seed`` and ``trials`` meets: then each measured trial has a simulated twin, and
    their difference is the model's error, not sampling noise (``benchmarks/mlc_validate.py``).

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


class _Schedule:
    """Where a run stands ``e`` seconds after it began, per configuration (see the module docstring).

    A run's ``c``-th flush request comes when its ``c * l2_every``-th checkpoint is copied; the
    writer then resumes at ``B[c]`` (later than the request when it blocked), and its next
    ``l2_every`` segments are slowed while the flusher is busy, up to ``END[c]``. Flush ``c``
    starts at ``START[c]``; its L2 part ends ``l2_latency`` later and, when it goes on to L3, its
    L3 part after the L3 latency. A segment of ``w`` seconds of compute that starts with ``F``
    seconds of flushing left takes ``w + s * min(w / (1 - s), F)``: at rate ``1 - s`` while the
    flush runs, at full speed after.

    Configurations without slowdown whose flushes each end before the next request (``simple``)
    have the closed form of a run with no flush at all. The others get tables, one row each,
    computed request by request until the flusher's state repeats: at a request where it is idle,
    or where the writer blocks, the state is fixed by the request's place in the ``l3_every`` cycle,
    so the second such request at the same place starts a period of ``per`` requests and ``shift``
    seconds, beyond which the tables are not stored but extended.
    """

    def __init__(
        self, p: MLCParams, tau: np.ndarray, nseg: np.ndarray, last: np.ndarray, every: np.ndarray, l3: np.ndarray
    ) -> None:
        self.s = p.l2_slowdown
        self.lat2, self.lat3 = p.flush_latencies
        self.three = p.three_level
        self.cost = _checkpoint_costs(p, tau)
        self.u = tau + self.cost
        self.tau_s = tau / (1.0 - self.s)  # wall time of a fully slowed segment's compute
        self.u_s = self.tau_s + self.cost
        self.last, self.every, self.l3 = last, every, l3
        self.period = np.where(every > 0, every * self.u, math.inf)
        longest = self.lat2 + np.where(l3 > 0, self.lat3, 0.0)
        self.simple = (every == 0) | ((self.s == 0) & (self.period >= longest))
        self.table = np.full(len(tau), -1)  # row of each configuration in the tables, -1 when simple
        complex_ = np.flatnonzero(~self.simple)
        self.table[complex_] = np.arange(len(complex_))
        self._build(complex_, (nseg[complex_] - 1) // every[complex_])

    # ---------------------------------------------------------------- building the tables

    def _build(self, cfgs: np.ndarray, requests: np.ndarray) -> None:
        """Play the flush requests of a whole run out, all configurations ``cfgs`` in lock step."""
        n = len(cfgs)
        every, l3 = self.every[cfgs], self.l3[cfgs]
        u, u_s, tau_s = self.u[cfgs], self.u_s[cfgs], self.tau_s[cfgs]
        b, start, end = np.zeros(n), np.full(n, -math.inf), np.full(n, -math.inf)
        columns = [(b, start, end)]
        seen = np.full((n, 2, max(1, int(l3.max(initial=0)))), -1)
        self.first = np.zeros(n, dtype=np.int64)
        self.per = np.zeros(n, dtype=np.int64)
        self.length = requests + 1
        rows = np.arange(n)
        active = requests > 0
        c = 0
        while active.any():
            c += 1
            request = b + every * u + self.s * np.minimum(every * tau_s, _overlap(np.maximum(0.0, end - b), u_s, tau_s))
            deep = (l3 > 0) & (c % np.maximum(l3, 1) == 0)
            idle = end <= request
            blocked = start > request
            b = np.where(active, np.maximum(request, start), b)
            start = np.where(active, np.maximum(b, end), start)
            end = np.where(active, start + self.lat2 + np.where(deep, self.lat3, 0.0), end)
            columns.append((b, start, end))
            kind = np.where(blocked, 1, 0)
            phase = c % np.maximum(l3, 1)
            reset = active & (idle | blocked)
            before = seen[rows, kind, phase]
            repeat = reset & (before >= 0)
            self.first[repeat] = before[repeat]
            self.per[repeat] = c - before[repeat]
            self.length[repeat] = c + 1
            fresh = reset & (before < 0)
            seen[rows[fresh], kind[fresh], phase[fresh]] = c
            active &= ~repeat & (c < requests)
        self.b, self.start, self.end = (np.column_stack([col[i] for col in columns]) for i in range(3))
        self.shift = np.where(self.per > 0, self.b[rows, self.first + self.per] - self.b[rows, self.first], 0.0)

    # ---------------------------------------------------------------- looking up

    def _at(self, table: np.ndarray, t: np.ndarray, c: np.ndarray) -> np.ndarray:
        """``table[t, c]`` for any request index ``c``, beyond the stored ones by periodicity."""
        first, per = self.first[t], self.per[t]
        beyond = (per > 0) & (c >= first + per)
        laps = np.where(beyond, (c - first) // np.maximum(per, 1), 0)
        index = np.where(beyond, first + (c - first) % np.maximum(per, 1), np.minimum(c, self.length[t] - 1))
        return table[t, index] + laps * self.shift[t]

    def _count(
        self,
        value: Callable[[np.ndarray, np.ndarray], np.ndarray],
        t: np.ndarray,
        x: np.ndarray,
        stride: np.ndarray,
        cap: np.ndarray,
    ) -> np.ndarray:
        """``#{j >= 1: value(t, j * stride) <= x, j * stride <= cap}`` for a nondecreasing ``value``.

        Past a whole period the search runs on ``x`` moved back by whole periods, which removes
        ``per / stride`` entries each.
        """
        first, per = self.first[t], self.per[t]
        span = per // stride
        base = -(-first // stride) * stride  # the first index of the sequence in the periodic part
        origin = value(t, base)
        laps = np.where(
            (per > 0) & (x >= origin + self.shift[t]), np.floor((x - origin) / np.where(per > 0, self.shift[t], 1.0)), 0
        )
        laps = np.maximum(laps, 0).astype(np.int64)
        moved = x - laps * self.shift[t]
        lo = np.ones(len(t), dtype=np.int64)
        hi = np.where(per > 0, (base + per) // stride, (self.length[t] - 1) // stride) + 1
        while (open_ := lo < hi).any():
            mid = (lo + hi) // 2
            ok = value(t, np.where(open_, mid, 1) * stride) <= moved
            lo = np.where(open_ & ok, mid + 1, lo)
            hi = np.where(open_ & ~ok, mid, hi)
        return np.minimum(lo - 1 + laps * span, cap // stride)

    def _b(self, t: np.ndarray, c: np.ndarray) -> np.ndarray:
        return self._at(self.b, t, c)

    def _start(self, t: np.ndarray, c: np.ndarray) -> np.ndarray:
        return self._at(self.start, t, c)

    def _cycle(self, t: np.ndarray, cfg: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(resume time, flusher busy until, slowed compute time of the whole cycle) of cycle ``c``."""
        b = self._b(t, c)
        end = self._at(self.end, t, c)
        return b, end, _overlap(np.maximum(0.0, end - b), self.u_s[cfg], self.tau_s[cfg])

    def commits(self, cfg: np.ndarray, e: np.ndarray, left: np.ndarray) -> np.ndarray:
        """L1 checkpoints committed ``e`` seconds into a run, at most ``left - 1``."""
        done = np.floor(e / self.u[cfg])
        t = self.table[cfg]
        hard = t >= 0
        if hard.any():
            th, ch, eh = t[hard], cfg[hard], e[hard]
            every = self.every[ch]
            c = self._count(self._b, th, eh, np.ones(len(th), dtype=np.int64), np.full(len(th), np.iinfo(np.int64).max))
            b, _, a = self._cycle(th, ch, c)
            x = eh - b
            m = np.maximum(np.floor(x / self.u_s[ch]), np.floor((x - self.s * a) / self.u[ch]))
            done[hard] = c * every + np.clip(m, 0, every)
        return np.clip(done, 0, left - 1).astype(np.int64)

    def flushed(self, cfg: np.ndarray, e: np.ndarray, left: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``e`` seconds into a run: (the newest request whose L2 part had ended, the newest whose L3
        part had; how many flushes the shared tier had begun to receive).

        The second is a multiple of ``l3_every``, 0 for none. Only the requests of the run's first
        ``left - 1`` commits count: the last commit ends the job.
        """
        every, l3 = self.every[cfg], self.l3[cfg]
        cap = np.where(every > 0, (left - 1) // np.maximum(every, 1), 0)
        stride3 = np.maximum(l3, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            n2 = np.floor((e - self.lat2) / self.period[cfg])
            n3 = np.floor((e - self.lat2 - self.lat3) / (self.period[cfg] * stride3))
            if self.three:
                shared = np.floor((e - self.lat2) / (self.period[cfg] * stride3))
            else:
                shared = np.floor(e / self.period[cfg])
        t = self.table[cfg]
        hard = t >= 0
        if hard.any():
            th, eh, capped, ones = t[hard], e[hard], cap[hard], np.ones(hard.sum(), dtype=np.int64)
            n2[hard] = self._count(self._start, th, eh - self.lat2, ones, capped)
            n3[hard] = self._count(self._start, th, eh - self.lat2 - self.lat3, stride3[hard], capped)
            if self.three:
                shared[hard] = self._count(self._start, th, eh - self.lat2, stride3[hard], capped)
            else:
                shared[hard] = self._count(self._start, th, eh, ones, capped)
        deep = (every > 0) & (l3 > 0)
        n2 = np.where(every > 0, np.minimum(n2, cap), 0)
        n3 = np.where(deep, np.minimum(n3, cap // stride3) * stride3, 0)
        shared = np.where(deep if self.three else every > 0, np.minimum(shared, cap // stride3), 0)
        n2, n3, shared = (np.maximum(x, 0).astype(np.int64) for x in (n2, n3, shared))
        return n2, n3, shared

    def finish(self, cfg: np.ndarray, left: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Seconds from a run's start to the commit of its ``left``-th segment, the job's last (``last``
        long); NaN for simple configurations, whose caller has the closed form."""
        out = np.full(len(cfg), math.nan)
        t = self.table[cfg]
        hard = t >= 0
        if hard.any():
            th, ch, lh = t[hard], cfg[hard], left[hard]
            every = self.every[ch]
            c = (lh - 1) // every
            b, end, a = self._cycle(th, ch, c)
            before = lh - 1 - c * every
            begin = b + before * self.u[ch] + self.s * np.minimum(before * self.tau_s[ch], a)
            rest = np.maximum(0.0, end - begin)
            w = last[hard]
            out[hard] = begin + w + self.s * np.minimum(w / (1.0 - self.s), rest) + self.cost[ch]
        return out


def _overlap(busy: np.ndarray, u_s: np.ndarray, tau_s: np.ndarray) -> np.ndarray:
    """Seconds of compute within the first ``busy`` seconds of a cycle whose segments are all slowed.

    Segments there take ``tau_s`` of compute and then a checkpoint (``u_s`` in all).
    """
    whole = np.floor(busy / u_s)
    return whole * tau_s + np.minimum(busy - whole * u_s, tau_s)


class _Rows:
    """The trials still running, one row per (configuration, trial), as columns.

    Fixed per row: ``row`` (index into the results), ``cfg`` (its configuration), ``tid`` (trial
    index, which picks its failure arrivals), ``u`` (a segment with its checkpoint), ``nseg``
    (segments), ``ulast`` (the last one with its checkpoint), ``last`` (its compute), ``every``
    (``l2_every``, 0 for never), ``l3`` (``l3_every``, 0 for never). State: ``t`` (start of the
    current phase), ``restarting``, ``rcost`` (that restart's cost), ``k`` (segments committed
    when the phase began: the rollback target while restarting), ``l2`` and ``l3`` (segments safe
    against L2 and L3 failures), ``far`` (the ``l2`` state is only in L3), ``local`` (the state at
    ``k`` has a node-local copy), ``rfar`` (the restart cost of the state at ``k`` without it),
    ``i1``..``i3`` (index of the next failure gap), ``nf1``..``nf3`` (time of the next failure),
    ``f1``..``f3`` (failures so far), ``flushes`` (flushes to the shared tier begun so far).
    """

    names = ("row", "cfg", "tid", "u", "nseg", "ulast", "last", "every", "l3", "t", "restarting", "rcost", "k")
    names += ("l2", "l3safe", "far", "local", "rfar", "i1", "i2", "i3", "nf1", "nf2", "nf3", "f1", "f2", "f3")
    names += ("flushes",)

    row: np.ndarray
    cfg: np.ndarray
    tid: np.ndarray
    u: np.ndarray
    nseg: np.ndarray
    ulast: np.ndarray
    last: np.ndarray
    every: np.ndarray
    l3: np.ndarray
    t: np.ndarray
    restarting: np.ndarray
    rcost: np.ndarray
    k: np.ndarray
    l2: np.ndarray
    l3safe: np.ndarray
    far: np.ndarray
    local: np.ndarray
    rfar: np.ndarray
    i1: np.ndarray
    i2: np.ndarray
    i3: np.ndarray
    nf1: np.ndarray
    nf2: np.ndarray
    nf3: np.ndarray
    f1: np.ndarray
    f2: np.ndarray
    f3: np.ndarray
    flushes: np.ndarray

    def __init__(self, **columns: np.ndarray) -> None:
        self.__dict__.update(columns)

    def keep(self, mask: np.ndarray) -> None:
        for name in self.names:
            setattr(self, name, getattr(self, name)[mask])


def _run(
    p: MLCParams,
    intervals: np.ndarray,
    everys: np.ndarray,
    l3s: np.ndarray,
    trials: int,
    seed: int,
    max_wall_factor: float,
    max_events: int,
) -> tuple[np.ndarray, ...]:
    """Simulate ``trials`` runs of each configuration.

    Returns arrays of shape ``(configs, trials)``: wall time, stopped, L1, L2 and L3 failures,
    flushes begun to the shared tier.
    """
    n_cfg = len(intervals)
    n = n_cfg * trials
    cfg = np.repeat(np.arange(n_cfg), trials)
    tau, nseg, last = _segments(p.solve_time, intervals)
    cost = _checkpoint_costs(p, tau)
    schedule = _Schedule(p, tau, nseg, last, everys, l3s)
    arrivals = tuple(
        FailureArrivals(m, trials, seed, level) for level, m in enumerate((p.l1_mtbf, p.l2_mtbf, p.l3_mtbf), 1)
    )
    s = _first_rows(
        p, cfg, np.tile(np.arange(trials), n_cfg), tau + cost, last + cost, nseg, last, everys, l3s, arrivals
    )
    wall = np.empty(n)
    stopped = np.zeros(n, dtype=bool)
    out = {name: np.zeros(n, dtype=np.int64) for name in ("f1", "f2", "f3", "flushes")}
    cap = max_wall_factor * p.solve_time

    while s.row.size:
        nf = np.minimum(np.minimum(s.nf1, s.nf2), s.nf3)
        left = s.nseg - s.k
        t_fin = s.t + (left - 1) * s.u + s.ulast
        hard = ~schedule.simple[s.cfg]
        if hard.any():
            t_fin[hard] = s.t[hard] + schedule.finish(s.cfg[hard], left[hard], s.last[hard])
        t_fin += p.l1_latency  # the last checkpoint's write
        end = np.where(s.restarting, s.t + s.rcost, t_fin)
        ok = nf >= end
        finish = ok & ~s.restarting
        back = ok & s.restarting
        fail = ~ok
        if fail.any():
            _fail(p, s, schedule, fail, nf, left, arrivals)
        s.t = np.where(back, end, s.t)
        s.restarting = (s.restarting & ~back) | fail
        if finish.any():
            rows = np.flatnonzero(finish)
            s.flushes[rows] += schedule.flushed(s.cfg[rows], t_fin[rows] - s.t[rows], left[rows])[2]
        wall[s.row[finish]] = t_fin[finish]
        stop = ~finish & ((s.t >= cap) | (s.f1 + s.f2 + s.f3 >= max_events))
        wall[s.row[stop]] = s.t[stop]
        stopped[s.row[stop]] = True
        gone = finish | stop
        if gone.any():
            for name, column in out.items():
                column[s.row[gone]] = getattr(s, name)[gone]
            s.keep(~gone)
            for a, idx in zip(arrivals, (s.i1, s.i2, s.i3), strict=True):
                a.forget_before(idx)
    shape = (n_cfg, trials)
    return (wall.reshape(shape), stopped.reshape(shape), *(column.reshape(shape) for column in out.values()))


def _first_rows(
    p: MLCParams,
    cfg: np.ndarray,
    tid: np.ndarray,
    u: np.ndarray,
    ulast: np.ndarray,
    nseg: np.ndarray,
    last: np.ndarray,
    everys: np.ndarray,
    l3s: np.ndarray,
    arrivals: tuple[FailureArrivals, ...],
) -> _Rows:
    """Every trial of every configuration (row ``i``: configuration ``cfg[i]``, trial ``tid[i]``)
    at its start: no time spent, no failure yet, its first failures drawn; ``u`` and ``ulast``
    are a configuration's segment and last segment with their checkpoint."""
    n = len(cfg)
    zeros = np.zeros(n, dtype=np.int64)  # for reading only; each column gets its own array
    return _Rows(
        row=np.arange(n),
        cfg=cfg,
        tid=tid,
        u=u[cfg],
        nseg=nseg[cfg],
        ulast=ulast[cfg],
        last=last[cfg],
        every=everys[cfg],
        l3=l3s[cfg],
        t=np.zeros(n),
        restarting=np.zeros(n, dtype=bool),
        rcost=np.zeros(n),
        k=zeros.copy(),
        l2=zeros.copy(),
        l3safe=zeros.copy(),
        far=np.zeros(n, dtype=bool),
        local=np.ones(n, dtype=bool),
        rfar=np.full(n, p.l2_restart),
        i1=zeros.copy(),
        i2=zeros.copy(),
        i3=zeros.copy(),
        nf1=arrivals[0].gap(tid, zeros),
        nf2=arrivals[1].gap(tid, zeros),
        nf3=arrivals[2].gap(tid, zeros),
        f1=zeros.copy(),
        f2=zeros.copy(),
        f3=zeros.copy(),
        flushes=zeros.copy(),
    )


def _fail(
    p: MLCParams,
    s: _Rows,
    schedule: _Schedule,
    fail: np.ndarray,
    nf: np.ndarray,
    left: np.ndarray,
    arrivals: tuple[FailureArrivals, ...],
) -> None:
    """Roll the rows ``fail`` back for the failure that strikes them at ``nf``, in place."""
    rows = np.flatnonzero(fail)
    nf1, nf2, nf3 = s.nf1[rows], s.nf2[rows], s.nf3[rows]
    is3 = nf3 < np.minimum(nf1, nf2)
    is2 = ~is3 & (nf2 < nf1)
    is1 = ~is3 & ~is2
    k, every = s.k[rows], s.every[rows]
    done, n2, n3, began = (np.zeros(len(rows), dtype=np.int64) for _ in range(4))
    running = ~s.restarting[rows]  # a restart has committed and flushed nothing
    if running.any():
        sub = rows[running]
        elapsed = nf[sub] - s.t[sub]
        done[running] = schedule.commits(s.cfg[sub], np.maximum(0.0, elapsed - p.l1_latency), left[sub])
        n2[running], n3[running], began[running] = schedule.flushed(s.cfg[sub], elapsed, left[sub])
    s.flushes[rows] += began
    l2 = np.where(n2 > 0, np.maximum(s.l2[rows], k + n2 * every), s.l2[rows])
    l3 = np.where(n3 > 0, np.maximum(s.l3safe[rows], k + n3 * every), s.l3safe[rows])
    far = s.far[rows] & (n2 == 0)
    local = s.local[rows] | (done >= 1)
    from_l2 = np.where(far, p.l3_restart, p.l2_restart)
    cost = np.where(is3, p.l3_restart, np.where(is2, from_l2, np.where(local, p.l1_restart, s.rfar[rows])))
    s.k[rows] = np.where(is3, l3, np.where(is2, l2, k + done))
    s.l2[rows] = np.where(is3, l3, l2)
    s.l3safe[rows] = l3
    s.far[rows] = is3 | far
    s.rcost[rows] = cost
    s.rfar[rows] = np.where(is1, s.rfar[rows], cost)
    s.local[rows] = is1 & local
    s.t[rows] = nf[rows]
    for index, (hit, idx, nxt, count) in enumerate(
        ((is1, s.i1, s.nf1, s.f1), (is2, s.i2, s.nf2, s.f2), (is3, s.i3, s.nf3, s.f3))
    ):
        if hit.any():
            at = rows[hit]
            idx[at] += 1
            nxt[at] += arrivals[index].gap(s.tid[at], idx[at])
            count[at] += 1
