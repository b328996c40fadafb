"""Checkpoint interval tuning: how often to checkpoint to L1, and how often to flush L1 to L2.

Three ways to answer, from instant to slow. The analytic models (Young, Daly, the exact optimum
of Daly's model, Benoit's first-order multi-level optimum, the first-order interval for
asynchronous flushes that slow compute) assume one kind of failure, or a first-order expansion.
The simulator plays out what our checkpoint engine actually does: blocking node-local
checkpoints, asynchronous flushes to the upper tiers that slow compute and block the writer when
they fall behind, bandwidth shared with other flushers, process crashes and lost nodes, on two or
three levels. The search finds the configuration the simulator likes best, the ground
truth the analytic models and the learned model are measured against. The :class:`Recommender`,
trained on search results, predicts that configuration in microseconds.

Nothing here imports Parsl or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.mlc._analytic": (
        "MultilevelOptimum",
        "async_interval",
        "async_optimum",
        "daly_interval",
        "daly_wall_time",
        "multilevel_optimum",
        "optimal_interval",
        "three_level_optimum",
        "two_level_optimum",
        "young_interval",
    ),
    "resilient_flows.mlc._dataset": (
        "label",
        "read_rows",
        "sample_params",
        "write_rows",
    ),
    "resilient_flows.mlc._params": (
        "InvalidParameterError",
        "MLCConfig",
        "MLCParams",
        "Objective",
    ),
    "resilient_flows.mlc._recommender": (
        "Recommender",
        "fit",
    ),
    "resilient_flows.mlc._search": ("search",),
    "resilient_flows.mlc._simulator": (
        "FailureSimResult",
        "simulate_failures",
        "simulate_failures_many",
    ),
    "resilient_flows.mlc._tune": ("candidates",),
}

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.mlc._analytic import (
        MultilevelOptimum as MultilevelOptimum,
    )
    from resilient_flows.mlc._analytic import (
        async_interval as async_interval,
    )
    from resilient_flows.mlc._analytic import (
        async_optimum as async_optimum,
    )
    from resilient_flows.mlc._analytic import (
        daly_interval as daly_interval,
    )
    from resilient_flows.mlc._analytic import (
        daly_wall_time as daly_wall_time,
    )
    from resilient_flows.mlc._analytic import (
        multilevel_optimum as multilevel_optimum,
    )
    from resilient_flows.mlc._analytic import (
        optimal_interval as optimal_interval,
    )
    from resilient_flows.mlc._analytic import (
        three_level_optimum as three_level_optimum,
    )
    from resilient_flows.mlc._analytic import (
        two_level_optimum as two_level_optimum,
    )
    from resilient_flows.mlc._analytic import (
        young_interval as young_interval,
    )
    from resilient_flows.mlc._dataset import (
        label as label,
    )
    from resilient_flows.mlc._dataset import (
        read_rows as read_rows,
    )
    from resilient_flows.mlc._dataset import (
        sample_params as sample_params,
    )
    from resilient_flows.mlc._dataset import (
        write_rows as write_rows,
    )
    from resilient_flows.mlc._params import (
        InvalidParameterError as InvalidParameterError,
    )
    from resilient_flows.mlc._params import (
        MLCConfig as MLCConfig,
    )
    from resilient_flows.mlc._params import (
        MLCParams as MLCParams,
    )
    from resilient_flows.mlc._params import (
        Objective as Objective,
    )
    from resilient_flows.mlc._recommender import (
        Recommender as Recommender,
    )
    from resilient_flows.mlc._recommender import (
        fit as fit,
    )
    from resilient_flows.mlc._search import (
        search as search,
    )
    from resilient_flows.mlc._simulator import (
        FailureSimResult as FailureSimResult,
    )
    from resilient_flows.mlc._simulator import (
        simulate_failures as simulate_failures,
    )
    from resilient_flows.mlc._simulator import (
        simulate_failures_many as simulate_failures_many,
    )
    from resilient_flows.mlc._tune import (
        candidates as candidates,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
