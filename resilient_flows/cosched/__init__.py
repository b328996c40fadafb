"""Co-scheduling on-demand jobs with batch training: whom to preempt, or how long to wait.

:func:`decide` answers one on-demand request given the running jobs, with an exact policy
(``"dp"``) or a baseline; the simulator replays a machine's job trace under each policy. Nothing
here imports Parsl: the workflow runner and the simulator are two users of the same decision.
"""

from __future__ import annotations

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.cosched._agent": (
        "Agent",
        "AgentConfig",
        "ONDEMAND_MARKER",
    ),
    "resilient_flows.cosched._batch": (
        "BatchSystem",
        "UNITS",
    ),
    "resilient_flows.cosched._cosim": (
        "DEFAULT_POLICIES",
        "DEFAULT_SWEEP",
        "comparison_caption",
        "comparison_document",
        "comparison_table",
        "plot_tradeoff",
        "run_policies",
    ),
    "resilient_flows.cosched._jobs": (
        "Decision",
        "OnDemandRequest",
        "RunningJob",
        "decision_cost",
    ),
    "resilient_flows.cosched._pbspro": ("PBSProBatch",),
    "resilient_flows.cosched._policies": (
        "BASELINES",
        "POLICIES",
        "covering_knapsack",
        "decide",
    ),
    "resilient_flows.cosched._simulator": (
        "DEFAULT_CHECKPOINT_INTERVAL",
        "DEFAULT_RESTART_COST",
        "OnDemandStream",
        "SimConfig",
        "SimMetrics",
        "SimResult",
        "simulate",
        "young_interval",
    ),
    "resilient_flows.cosched._slurm": ("SlurmBatch",),
    "resilient_flows.cosched._swf": (
        "SwfJob",
        "SwfTrace",
        "read_swf",
    ),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
