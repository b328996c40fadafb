"""Training data for the recommender: parameter sets drawn over a wide range, labelled by :func:`search`.

The range covers a laptop to an exascale machine, two levels (node-local, then the parallel file
system). Every quantity follows from the machine and the job, so that every combination is
plausible. Sizes and rates are drawn log-uniformly:

=====================  ===============================================  ===========================
quantity               drawn as                                          range
=====================  ===============================================  ===========================
machine nodes          nodes                                             16 to 10,000
``nodes`` (the job)    a share of the machine                            1 node to all of it
``pfs_bandwidth``      per machine node, times machine nodes             50 MB/s to 5 GB/s per node
``concurrent_flushers``  the job's nodes times other jobs flushing        1x to 4x, at most the machine
``node_bandwidth``     bytes/s one node sends                            1 to 100 GB/s
``checkpoint_bytes``   per node                                          1 to 256 GiB
``l1_cost``            ``checkpoint_bytes`` over a host copy rate        5 to 100 GB/s
``l2_slowdown``        0 (one set in five), else uniform                 0.01 to 0.5
node MTBF              per node                                          1 to 25 years
``l2_mtbf``            node MTBF / ``nodes`` (a lost node)
``l1_mtbf``            ``l2_mtbf`` / crashes per lost node                1 to 100
``l1_restart``         ``l1_cost`` times, plus a process restart         0.5x to 3x, plus 5 s to 2 min
``l2_restart``         the flush time times, plus a requeue              0.5x to 3x, plus 30 s to 10 min
``solve_time``         times ``l1_mtbf``                                 2x to 200x, at least 10 h
=====================  ===============================================  ===========================

Where the ranges come from: Theta's Lustre gave about 200 GB/s to 4,392 nodes (0.05 GB/s per
node), Polaris's Eagle 650 GB/s to 560 nodes (1.2), Frontier's Orion about 10 TB/s to 9,408
nodes (1.1), Aurora's DAOS is specified at 25 TB/s for 10,624 nodes (2.4); one Slingshot-11 NIC
sends 25 GB/s and a node has one to eight; node memory is 192 GiB (Theta) to 1 TiB (Aurora). Node
MTBFs of one to 25 years bracket the published failure logs of leadership machines. A set
whose blocking cost exceeds a twentieth of its MTBF is drawn again: no sensible job runs there.
The flush time is :attr:`MLCParams.shared_latency`, so the model also sees it as ``l2_latency``.

Rows are JSON lines (the parameters, the optimum, its simulated efficiency): no pickle, readable
by anything.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from resilient_flows.mlc._params import InvalidParameterError, MLCConfig, MLCParams
from resilient_flows.mlc._search import search

GiB = float(1 << 30)
YEAR = 365.25 * 86400.0


def sample_params(count: int, seed: int = 0) -> list[MLCParams]:
    """``count`` parameter sets from the documented range, reproducibly."""
    rng = np.random.default_rng(seed)

    def log_uniform(low: float, high: float) -> float:
        return float(math.exp(rng.uniform(math.log(low), math.log(high))))

    out: list[MLCParams] = []
    while len(out) < count:
        machine = round(log_uniform(16, 10_000))
        nodes = max(1, min(machine, round(log_uniform(1, machine))))
        flushers = min(machine, round(nodes * log_uniform(1.0, 4.0)))
        size = log_uniform(GiB, 256 * GiB)
        l2_mtbf = log_uniform(1.0, 25.0) * YEAR / nodes
        l1_mtbf = l2_mtbf / log_uniform(1.0, 100.0)
        l1_cost = size / log_uniform(5e9, 100e9)
        if l1_cost > l1_mtbf / 20:
            continue
        params = MLCParams(
            l1_cost=l1_cost,
            l1_restart=l1_cost * log_uniform(0.5, 3.0) + log_uniform(5.0, 120.0),
            l1_mtbf=l1_mtbf,
            solve_time=max(36000.0, l1_mtbf * log_uniform(2.0, 200.0)),
            l2_mtbf=l2_mtbf,
            l2_slowdown=0.0 if rng.random() < 0.2 else float(rng.uniform(0.01, 0.5)),
            checkpoint_bytes=size,
            nodes=nodes,
            node_bandwidth=log_uniform(1e9, 100e9),
            pfs_bandwidth=machine * log_uniform(0.05e9, 5e9),
            concurrent_flushers=flushers,
        )
        restart = params.shared_latency * log_uniform(0.5, 3.0) + log_uniform(30.0, 600.0)
        out.append(replace(params, l2_restart=restart))
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
