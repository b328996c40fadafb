"""Co-scheduling on-demand jobs with batch training: whom to preempt, or how long to wait.

:func:`decide` answers one on-demand request given the running jobs, with an exact policy
(``"dp"``) or a baseline; the simulator replays a machine's job trace under each policy. Nothing
here imports Parsl: the workflow runner and the simulator are two users of the same decision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
        "TraceSimResult",
        "simulate_trace",
    ),
    "resilient_flows.cosched._slurm": ("SlurmBatch",),
    "resilient_flows.cosched._swf": (
        "SwfJob",
        "SwfTrace",
        "read_swf",
    ),
}

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.cosched._agent import (
        ONDEMAND_MARKER as ONDEMAND_MARKER,
    )
    from resilient_flows.cosched._agent import (
        Agent as Agent,
    )
    from resilient_flows.cosched._agent import (
        AgentConfig as AgentConfig,
    )
    from resilient_flows.cosched._batch import (
        UNITS as UNITS,
    )
    from resilient_flows.cosched._batch import (
        BatchSystem as BatchSystem,
    )
    from resilient_flows.cosched._cosim import (
        DEFAULT_POLICIES as DEFAULT_POLICIES,
    )
    from resilient_flows.cosched._cosim import (
        DEFAULT_SWEEP as DEFAULT_SWEEP,
    )
    from resilient_flows.cosched._cosim import (
        comparison_caption as comparison_caption,
    )
    from resilient_flows.cosched._cosim import (
        comparison_document as comparison_document,
    )
    from resilient_flows.cosched._cosim import (
        comparison_table as comparison_table,
    )
    from resilient_flows.cosched._cosim import (
        plot_tradeoff as plot_tradeoff,
    )
    from resilient_flows.cosched._cosim import (
        run_policies as run_policies,
    )
    from resilient_flows.cosched._jobs import (
        Decision as Decision,
    )
    from resilient_flows.cosched._jobs import (
        OnDemandRequest as OnDemandRequest,
    )
    from resilient_flows.cosched._jobs import (
        RunningJob as RunningJob,
    )
    from resilient_flows.cosched._jobs import (
        decision_cost as decision_cost,
    )
    from resilient_flows.cosched._pbspro import (
        PBSProBatch as PBSProBatch,
    )
    from resilient_flows.cosched._policies import (
        BASELINES as BASELINES,
    )
    from resilient_flows.cosched._policies import (
        POLICIES as POLICIES,
    )
    from resilient_flows.cosched._policies import (
        covering_knapsack as covering_knapsack,
    )
    from resilient_flows.cosched._policies import (
        decide as decide,
    )
    from resilient_flows.cosched._simulator import (
        DEFAULT_CHECKPOINT_INTERVAL as DEFAULT_CHECKPOINT_INTERVAL,
    )
    from resilient_flows.cosched._simulator import (
        DEFAULT_RESTART_COST as DEFAULT_RESTART_COST,
    )
    from resilient_flows.cosched._simulator import (
        OnDemandStream as OnDemandStream,
    )
    from resilient_flows.cosched._simulator import (
        SimConfig as SimConfig,
    )
    from resilient_flows.cosched._simulator import (
        SimMetrics as SimMetrics,
    )
    from resilient_flows.cosched._simulator import (
        TraceSimResult as TraceSimResult,
    )
    from resilient_flows.cosched._simulator import (
        simulate_trace as simulate_trace,
    )
    from resilient_flows.cosched._slurm import (
        SlurmBatch as SlurmBatch,
    )
    from resilient_flows.cosched._swf import (
        SwfJob as SwfJob,
    )
    from resilient_flows.cosched._swf import (
        SwfTrace as SwfTrace,
    )
    from resilient_flows.cosched._swf import (
        read_swf as read_swf,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
