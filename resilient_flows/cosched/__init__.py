"""Co-scheduling on-demand jobs with batch training: whom to preempt, or how long to wait.

:func:`decide` answers one on-demand request given the running jobs, with an exact policy
(``"dp"``) or a baseline; the simulator replays a machine's job trace under each policy. Nothing
here imports Parsl: the workflow runner and the simulator are two users of the same decision.
"""

from resilient_flows.cosched.jobs import Decision, OnDemandRequest, RunningJob, decision_cost
from resilient_flows.cosched.policies import BASELINES, POLICIES, covering_knapsack, decide

__all__ = [
    "BASELINES",
    "POLICIES",
    "Decision",
    "OnDemandRequest",
    "RunningJob",
    "covering_knapsack",
    "decide",
    "decision_cost",
]
