"""Checkpointed loops over numpy arrays and torch tensors (the Kokkos Resilience idea).

``Context.checkpoint(label, i, fn)`` finds the arrays a loop body captures, saves them through the
checkpoint engine, and restores them in place after a restart, so that a simulation needs no
``state_dict`` of its own. Nothing here imports Parsl.
"""

from resilient_flows.resilience.capture import Array, find_arrays
from resilient_flows.resilience.context import Context, Every, Filter, every

__all__ = ["Array", "Context", "Every", "Filter", "every", "find_arrays"]
