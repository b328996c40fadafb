"""What the checkpoint-interval models take: the job and machine (:class:`MLCParams`), a policy
(:class:`MLCConfig`) and what the search optimises (:class:`Objective`).

Two levels by default, as our checkpoint engine has them. L1 is the node-local tier: a checkpoint
there blocks compute for ``l1_cost`` seconds and is lost with the node. L2 is the shared tier:
every ``l2_every``-th L1 checkpoint is flushed there in the background, which takes ``l2_latency``
seconds while compute goes on, ``l2_slowdown`` slower. An L1 failure (a crashed process) rolls
back to the newest L1 checkpoint; an L2 failure (a lost node) to the newest L2 one.

A third level is there when ``l3_mtbf`` is finite, the SCR/VeloC/FTI hierarchy: L2 is then a
partner copy or a burst buffer (fast, and lost when the failures that need L3 strike, such as two
nodes of a pair at once) and L3 the parallel file system. Every ``l3_every``-th L2 checkpoint goes
on to L3; the flusher writes L2 and then L3, one checkpoint at a time, as the engine's ordered
tiers do. A level-``k`` failure rolls back to the newest checkpoint that level ``k`` holds and
destroys the copies of every level below ``k``.

The shared tier (L2 of two, L3 of three) may be described by its bandwidth instead of its latency:
with ``checkpoint_bytes`` the flush takes ``checkpoint_bytes / min(node_bandwidth, pfs_bandwidth /
concurrent_flushers)`` (:attr:`MLCParams.shared_latency`). Giving that tier a latency as well is an
error: neither silently wins. All times are in seconds, sizes in bytes, bandwidths in bytes/s.

All three classes check themselves when built, so the analytic models, the simulator and the search
never see a negative cost or a zero MTBF. A bad value raises :class:`InvalidParameterError`, and its
message names the field.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from resilient_flows.errors import ResilientFlowsError


class InvalidParameterError(ResilientFlowsError, ValueError):
    """A parameter of a checkpoint-interval model is out of range; the message names it.

    It is also a ``ValueError``, which is what callers of a plain function expect from a bad argument.
    """


def check_number(field: str, value: object, *, positive: bool = False, allow_inf: bool = False) -> float:
    """Return ``value`` as a float, or raise :class:`InvalidParameterError` naming ``field``.

    ``positive`` asks for ``> 0`` (else ``>= 0``); ``allow_inf`` lets ``math.inf`` through (an MTBF
    of infinity: that kind of failure never happens).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise InvalidParameterError(f"{field} must be a number, got {value!r}")
    if positive and value <= 0:
        raise InvalidParameterError(f"{field} must be > 0, got {value!r}")
    if not positive and value < 0:
        raise InvalidParameterError(f"{field} must be >= 0, got {value!r}")
    if math.isinf(value) and not allow_inf:
        raise InvalidParameterError(f"{field} must be finite, got {value!r}")
    return float(value)


def check_count(field: str, value: object, *, minimum: int = 1) -> int:
    """Return ``value`` as an int ``>= minimum``, or raise :class:`InvalidParameterError` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidParameterError(f"{field} must be a whole number >= {minimum}, got {value!r}")
    if value < minimum:
        raise InvalidParameterError(f"{field} must be >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class MLCParams:
    """A job and the machine it runs on, as the checkpoint-interval models see them.

    Parameters
    ----------
    l1_cost:
        Seconds an L1 (node-local) checkpoint blocks compute: the copy into host buffers.
    l1_latency:
        Seconds the write to the node-local tier takes after that copy, in the background. The
        checkpoint counts from its end, and the next checkpoint waits for it (the engine has one
        set of host buffers), so a checkpoint blocks compute for ``l1_cost + max(0, l1_latency -
        interval)`` (:meth:`checkpoint_cost`). 0 (the default) for a write that the copy includes.
    l1_restart:
        Seconds to resume from an L1 checkpoint after a crash (restart the process, read the local
        copy, re-initialise).
    l1_mtbf:
        Mean time between L1 failures (process crashes), in wall-clock seconds; ``math.inf`` for none.
    solve_time:
        Seconds of compute the job needs without failures or checkpoints.
    l2_latency:
        Seconds an asynchronous flush of one L1 checkpoint to L2 takes. Compute goes on meanwhile;
        the checkpoint protects against L2 failures only once the flush has finished. Of two levels,
        0 when the flush is described by ``checkpoint_bytes`` and the bandwidths instead.
    l2_restart:
        Seconds to resume from L2 after an L2 failure (get a new node, read, re-initialise).
    l2_mtbf:
        Mean time between L2 failures (lost nodes); ``math.inf`` (the default) for none, the one-level case.
    l2_slowdown:
        Fraction of compute speed lost while a flush runs, in ``[0, 1)``: the flush competes for
        memory bandwidth, the network and the CPU. It applies to the L3 part of a flush as well.
    checkpoint_bytes:
        Bytes one node writes per checkpoint; 0 (the default) when the shared tier's latency is given.
    nodes:
        Nodes of the job, all flushing at once.
    node_bandwidth:
        Bytes per second one node can send to the shared tier.
    pfs_bandwidth:
        Bytes per second of the shared file system, divided among the concurrent flushers.
    concurrent_flushers:
        How many nodes flush at once, other jobs' included; ``None`` means ``nodes``.
    l3_latency:
        Seconds the L3 part of a flush takes (after its L2 part), when it is not given by bytes.
    l3_restart:
        Seconds to resume from L3 after an L3 failure.
    l3_mtbf:
        Mean time between L3 failures, those that destroy L1 and L2 copies; ``math.inf`` (the
        default) means there is no third level, and then ``l3_latency`` and ``l3_restart`` must be 0.
    """

    l1_cost: float
    l1_restart: float
    l1_mtbf: float
    solve_time: float
    l2_latency: float = 0.0
    l2_restart: float = 0.0
    l2_mtbf: float = math.inf
    l2_slowdown: float = 0.0
    checkpoint_bytes: float = 0.0
    nodes: int = 1
    node_bandwidth: float = math.inf
    pfs_bandwidth: float = math.inf
    concurrent_flushers: int | None = None
    l3_latency: float = 0.0
    l3_restart: float = 0.0
    l3_mtbf: float = math.inf
    l1_latency: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "l1_cost",
            "l1_latency",
            "l2_latency",
            "l1_restart",
            "l2_restart",
            "checkpoint_bytes",
            "l3_latency",
            "l3_restart",
        ):
            self._set(name, check_number(name, getattr(self, name)))
        for name in ("l1_mtbf", "l2_mtbf", "l3_mtbf", "node_bandwidth", "pfs_bandwidth"):
            self._set(name, check_number(name, getattr(self, name), positive=True, allow_inf=True))
        self._set("solve_time", check_number("solve_time", self.solve_time, positive=True))
        self._set("l2_slowdown", check_number("l2_slowdown", self.l2_slowdown))
        if self.l2_slowdown >= 1:
            raise InvalidParameterError(f"l2_slowdown must be in [0, 1), got {self.l2_slowdown!r}")
        self._set("nodes", check_count("nodes", self.nodes))
        if self.concurrent_flushers is not None:
            self._set("concurrent_flushers", check_count("concurrent_flushers", self.concurrent_flushers))
        self._check_levels()

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    def _check_levels(self) -> None:
        """The third level's fields agree with each other, and the shared tier has one latency, not two."""
        if not self.three_level:
            for name in ("l3_latency", "l3_restart"):
                if getattr(self, name) > 0:
                    raise InvalidParameterError(f"{name} is set but l3_mtbf is not: a third level needs l3_mtbf")
        if self.checkpoint_bytes > 0:
            given = "l3_latency" if self.three_level else "l2_latency"
            if getattr(self, given) > 0:
                raise InvalidParameterError(
                    f"{given} and checkpoint_bytes both give the shared tier's latency: set one of them"
                )
            if math.isinf(self.node_bandwidth) and math.isinf(self.pfs_bandwidth):
                raise InvalidParameterError("checkpoint_bytes needs node_bandwidth or pfs_bandwidth to give a latency")

    def checkpoint_cost(self, interval: float) -> float:
        """Seconds an L1 checkpoint blocks compute at ``interval`` seconds of compute between checkpoints.

        In steady state a checkpoint waits for the node-local write of the one before it, which
        began ``interval`` seconds earlier. Charging that wait to every checkpoint, the first of a
        run included, keeps the model periodic; it overstates a run's wall time by one wait.
        """
        return self.l1_cost + max(0.0, self.l1_latency - interval)

    @property
    def three_level(self) -> bool:
        """Whether there is a third level (``l3_mtbf`` is finite)."""
        return not math.isinf(self.l3_mtbf)

    @property
    def flushers(self) -> int:
        """How many nodes share the file system's bandwidth: ``concurrent_flushers``, else ``nodes``."""
        return self.nodes if self.concurrent_flushers is None else self.concurrent_flushers

    @property
    def shared_latency(self) -> float:
        """Seconds a flush to the shared tier (L2 of two levels, L3 of three) takes.

        ``checkpoint_bytes / min(node_bandwidth, pfs_bandwidth / concurrent_flushers)`` when the
        bytes are given, else ``l3_latency`` or ``l2_latency``.
        """
        if self.checkpoint_bytes > 0:
            return self.checkpoint_bytes / min(self.node_bandwidth, self.pfs_bandwidth / self.flushers)
        return self.l3_latency if self.three_level else self.l2_latency

    @property
    def flush_latencies(self) -> tuple[float, float]:
        """(L2 part, L3 part) of a flush's duration; the L3 part is 0 with two levels."""
        if self.three_level:
            return self.l2_latency, self.shared_latency
        return self.shared_latency, 0.0

    @property
    def l1_rate(self) -> float:
        """L1 failures per second (0 when ``l1_mtbf`` is infinite)."""
        return 1.0 / self.l1_mtbf

    @property
    def l2_rate(self) -> float:
        """L2 failures per second (0 when ``l2_mtbf`` is infinite)."""
        return 1.0 / self.l2_mtbf

    @property
    def l3_rate(self) -> float:
        """L3 failures per second (0 when ``l3_mtbf`` is infinite: no third level)."""
        return 1.0 / self.l3_mtbf


@dataclass(frozen=True)
class MLCConfig:
    """A checkpointing policy: an L1 checkpoint after every ``interval`` seconds of compute.

    Parameters
    ----------
    interval:
        Seconds of compute between two L1 checkpoints. An interval longer than the job's solve time
        means one checkpoint, at the end.
    l2_every:
        Every ``l2_every``-th L1 checkpoint since the job (re)started is also flushed to L2, as the
        engine's tier cadence (a :class:`~resilient_flows.checkpoint.TierSpec`'s) counts; ``None``
        never flushes (the one-level case).
    predicted_efficiency:
        What a model or the search expects ``solve_time / wall_time`` to be; ``None`` when unknown.
    l3_every:
        With three levels, every ``l3_every``-th L2 checkpoint since the job (re)started goes on to
        L3. It counts L2 checkpoints, not L1 ones, as the cadence of the engine's third
        tier counts saves sent to its second: one L3 checkpoint every ``l2_every * l3_every`` L1
        checkpoints. ``None``: never.
    predicted_traffic:
        Expected bytes per hour per node sent to the shared tier; ``None`` when unknown (the
        parameters give the flush's latency, not its bytes).
    """

    interval: float
    l2_every: int | None = None
    predicted_efficiency: float | None = None
    l3_every: int | None = None
    predicted_traffic: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "interval", check_number("interval", self.interval, positive=True))
        if self.l2_every is not None:
            object.__setattr__(self, "l2_every", check_count("l2_every", self.l2_every))
        if self.l3_every is not None:
            if self.l2_every is None:
                raise InvalidParameterError("l3_every needs l2_every: L3 checkpoints are taken from L2 ones")
            object.__setattr__(self, "l3_every", check_count("l3_every", self.l3_every))
        for name in ("predicted_efficiency", "predicted_traffic"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_number(name, getattr(self, name)))


@dataclass(frozen=True, kw_only=True)
class Objective:
    """What the search maximises: efficiency, optionally capped in traffic or charged for it.

    The score of a configuration is ``efficiency - byte_price * traffic``, where ``traffic`` is the
    bytes per hour per node it sends to the shared tier; a configuration whose traffic exceeds
    ``traffic_cap`` is not eligible. The defaults (no cap, no price) maximise efficiency alone.

    Parameters
    ----------
    traffic_cap:
        Most bytes per hour per node the shared tier may receive; ``None`` for no cap.
    byte_price:
        Efficiency given up per byte per hour per node of shared-tier traffic (``1e-14`` charges
        one percentage point per TB/h per node).
    """

    traffic_cap: float | None = None
    byte_price: float = 0.0

    def __post_init__(self) -> None:
        if self.traffic_cap is not None:
            object.__setattr__(self, "traffic_cap", check_number("traffic_cap", self.traffic_cap, positive=True))
        object.__setattr__(self, "byte_price", check_number("byte_price", self.byte_price))

    @property
    def needs_bytes(self) -> bool:
        """Whether the score depends on traffic, which only ``checkpoint_bytes`` measures."""
        return self.traffic_cap is not None or self.byte_price > 0

    def check(self, p: MLCParams) -> None:
        """Raise :class:`InvalidParameterError` when this objective cannot apply to the job ``p``."""
        if self.needs_bytes and p.checkpoint_bytes == 0:
            field = "traffic_cap" if self.traffic_cap is not None else "byte_price"
            raise InvalidParameterError(f"{field} needs checkpoint_bytes: traffic is counted in bytes")
        if self.traffic_cap is not None and self.traffic_cap < p.checkpoint_bytes:
            one = f"{p.checkpoint_bytes:.6g}"
            raise InvalidParameterError(
                f"traffic_cap must be at least one checkpoint's bytes ({one}), got {self.traffic_cap!r}"
            )

    def score(self, efficiency: float, traffic: float | None) -> float:
        """The figure to maximise; ``-inf`` for a configuration over the cap."""
        if traffic is None:
            return efficiency
        if self.traffic_cap is not None and traffic > self.traffic_cap:
            return -math.inf
        return efficiency - self.byte_price * traffic
