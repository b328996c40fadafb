"""Co-scheduling on-demand jobs with batch training: whom to preempt, or how long to wait.

:func:`decide` answers one on-demand request given the running jobs, with an exact policy
(``"dp"``) or a baseline; the simulator replays a machine's job trace under each policy. Nothing
here imports Parsl: the workflow runner and the simulator are two users of the same decision.
"""

from resilient_flows.cosched.jobs import Decision, OnDemandRequest, RunningJob, decision_cost
from resilient_flows.cosched.policies import BASELINES, POLICIES, covering_knapsack, decide
from resilient_flows.cosched.simulator import OnDemandStream, SimConfig, SimMetrics, SimResult, simulate, young_interval
from resilient_flows.cosched.swf import SwfJob, SwfTrace, read_swf

__all__ = [
    "BASELINES",
    "POLICIES",
    "Decision",
    "OnDemandRequest",
    "OnDemandStream",
    "RunningJob",
    "SimConfig",
    "SimMetrics",
    "SimResult",
    "SwfJob",
    "SwfTrace",
    "covering_knapsack",
    "decide",
    "decision_cost",
    "read_swf",
    "simulate",
    "young_interval",
]
