"""Training data for the recommender: parameter sets drawn over a wide range, labelled by :func:`search`.

The range covers a laptop to an exascale machine. Times are drawn log-uniformly, most of them as
ratios to the quantity they follow from, so that every combination is plausible:

==============  =========================================  =========================
quantity        drawn as                                   range
==============  =========================================  =========================
``l1_mtbf``     seconds                                    1 hour to 30 days
``l1_cost``     seconds, at most ``l1_mtbf / 20``          1 s to 10 min
``l2_latency``  times ``l1_cost``                          1x to 100x
``l1_restart``  times ``l1_cost``                          0.5x to 3x
``l2_restart``  times ``l2_latency``                       0.5x to 3x
``l2_mtbf``     times ``l1_mtbf``                          1x to 100x
``solve_time``  times ``l1_mtbf``                          2x to 200x, at least 10 h
==============  =========================================  =========================

Rows are JSON lines (the parameters, the optimum, its simulated efficiency): no pickle, readable
by anything.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from resilient_flows.mlc.params import InvalidParameterError, MLCConfig, MLCParams
from resilient_flows.mlc.search import search

__all__ = ["label", "read_rows", "sample_params", "write_rows"]


def sample_params(count: int, seed: int = 0) -> list[MLCParams]:
    """``count`` parameter sets from the documented range, reproducibly."""
    rng = np.random.default_rng(seed)

    def log_uniform(low: float, high: float) -> float:
        return float(math.exp(rng.uniform(math.log(low), math.log(high))))

    out = []
    for _ in range(count):
        l1_mtbf = log_uniform(3600.0, 30 * 86400.0)
        l1_cost = log_uniform(1.0, min(600.0, l1_mtbf / 20))
        l2_latency = l1_cost * log_uniform(1.0, 100.0)
        out.append(
            MLCParams(
                l1_cost=l1_cost,
                l1_restart=l1_cost * log_uniform(0.5, 3.0),
                l1_mtbf=l1_mtbf,
                solve_time=max(36000.0, l1_mtbf * log_uniform(2.0, 200.0)),
                l2_latency=l2_latency,
                l2_restart=l2_latency * log_uniform(0.5, 3.0),
                l2_mtbf=l1_mtbf * log_uniform(1.0, 100.0),
            )
        )
    return out


def label(params: MLCParams, trials: int = 400, seed: int = 0) -> dict[str, Any]:
    """One row: ``params`` and the simulator's optimum for them."""
    best = search(params, trials=trials, seed=seed)
    return {"params": asdict(params), "config": asdict(best)}


def write_rows(rows: Iterable[dict[str, Any]], path: str | Path) -> int:
    """Append rows to a JSON-lines file; how many were written."""
    count = 0
    with Path(path).open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
            count += 1
    return count


def read_rows(path: str | Path) -> Iterator[tuple[MLCParams, MLCConfig]]:
    """The (parameters, optimum) pairs of a file written by :func:`write_rows`; bad lines name their number."""
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            yield MLCParams(**row["params"]), MLCConfig(**row["config"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InvalidParameterError(f"{path}:{number}: not a training row ({exc})") from None
