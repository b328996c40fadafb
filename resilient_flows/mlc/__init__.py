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
        "SimResult",
        "simulate",
        "simulate_many",
    ),
    "resilient_flows.mlc._tune": ("candidates",),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
