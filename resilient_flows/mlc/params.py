"""What the checkpoint-interval models take: the job and machine (:class:`MLCParams`) and a policy (:class:`MLCConfig`).

Two levels, as our checkpoint engine has them. L1 is the node-local tier: a checkpoint there
blocks compute for ``l1_cost`` seconds and is lost with the node. L2 is the shared tier: every
``l2_every``-th L1 checkpoint is flushed there in the background, which takes ``l2_latency``
seconds while compute goes on. An L1 failure (a crashed process) rolls back to the newest L1
checkpoint; an L2 failure (a lost node) to the newest L2 one. All times are in seconds.

Both classes check themselves when built, so the analytic models, the simulator and the search
never see a negative cost or a zero MTBF. A bad value raises :class:`InvalidParameterError`, and its
message names the field.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from resilient_flows.errors import ResilientFlowsError

__all__ = ["InvalidParameterError", "MLCConfig", "MLCParams", "check_count", "check_number"]


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
        Seconds an L1 (node-local) checkpoint blocks compute.
    l1_restart:
        Seconds to resume from an L1 checkpoint after a crash (restart the process, read the local
        copy, re-initialise).
    l1_mtbf:
        Mean time between L1 failures (process crashes), in wall-clock seconds; ``math.inf`` for none.
    solve_time:
        Seconds of compute the job needs without failures or checkpoints.
    l2_latency:
        Seconds an asynchronous flush of one L1 checkpoint to the shared tier takes. Compute goes on
        meanwhile; the checkpoint protects against L2 failures only once the flush has finished.
    l2_restart:
        Seconds to resume from the shared tier after a lost node (get a new node, read, re-initialise).
    l2_mtbf:
        Mean time between L2 failures (lost nodes); ``math.inf`` (the default) for none, the one-level case.
    """

    l1_cost: float
    l1_restart: float
    l1_mtbf: float
    solve_time: float
    l2_latency: float = 0.0
    l2_restart: float = 0.0
    l2_mtbf: float = math.inf

    def __post_init__(self) -> None:
        for name in ("l1_cost", "l2_latency", "l1_restart", "l2_restart"):
            object.__setattr__(self, name, check_number(name, getattr(self, name)))
        for name in ("l1_mtbf", "l2_mtbf"):
            object.__setattr__(self, name, check_number(name, getattr(self, name), positive=True, allow_inf=True))
        object.__setattr__(self, "solve_time", check_number("solve_time", self.solve_time, positive=True))

    @property
    def l1_rate(self) -> float:
        """L1 failures per second (0 when ``l1_mtbf`` is infinite)."""
        return 1.0 / self.l1_mtbf

    @property
    def l2_rate(self) -> float:
        """L2 failures per second (0 when ``l2_mtbf`` is infinite)."""
        return 1.0 / self.l2_mtbf


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
        engine's ``persist_every`` counts; ``None`` never flushes (the one-level case).
    predicted_efficiency:
        What a model or the search expects ``solve_time / wall_time`` to be; ``None`` when unknown.
    """

    interval: float
    l2_every: int | None = None
    predicted_efficiency: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "interval", check_number("interval", self.interval, positive=True))
        if self.l2_every is not None:
            object.__setattr__(self, "l2_every", check_count("l2_every", self.l2_every))
        if self.predicted_efficiency is not None:
            efficiency = check_number("predicted_efficiency", self.predicted_efficiency)
            object.__setattr__(self, "predicted_efficiency", efficiency)
