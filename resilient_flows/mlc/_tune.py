"""Every way we have to pick a checkpoint configuration, for ``resilient-flows tune`` to compare.

The formulas see the job as one level whose failures are all failures (``1 / M = 1 / l1_mtbf
+ 1 / l2_mtbf + 1 / l3_mtbf``) and flush every checkpoint, which is what the engine does by default
(a shared tier that takes every checkpoint). The learned model covers two levels; it is left out for three.
"""

from __future__ import annotations

import dataclasses
import math

from resilient_flows.mlc._analytic import (
    async_optimum,
    daly_interval,
    three_level_optimum,
    two_level_optimum,
    young_interval,
)
from resilient_flows.mlc._params import MLCConfig, MLCParams
from resilient_flows.mlc._recommender import Recommender


def combined_mtbf(p: MLCParams) -> float:
    """The mean time between failures of any kind."""
    rate = p.l1_rate + p.l2_rate + p.l3_rate
    return math.inf if rate == 0 else 1.0 / rate


def candidates(p: MLCParams, recommender: Recommender | None = None) -> dict[str, MLCConfig]:
    """The formulas' configurations and, given a ``recommender`` and two levels, the learned one."""
    mtbf = combined_mtbf(p)
    every = 1 if p.three_level or not math.isinf(p.l2_mtbf) else None
    deep = 1 if p.three_level else None
    out = {
        "Young": MLCConfig(min(young_interval(p.l1_cost, mtbf), p.solve_time), every, l3_every=deep),
        "Daly": MLCConfig(min(daly_interval(p.l1_cost, mtbf), p.solve_time), every, l3_every=deep),
        "async (interference)": async_optimum(p),
    }
    if p.three_level:
        out["multi-level (Benoit)"] = three_level_optimum(p)
    elif every is not None:
        out["two-level (Benoit)"] = two_level_optimum(p)
    if recommender is not None and not p.three_level:
        # the learned model reads the flush's latency, not its bytes
        out["learned"] = recommender.recommend(
            dataclasses.replace(p, l2_latency=p.shared_latency, checkpoint_bytes=0.0)
        )
    return out
