"""Cloning: fork a running member into variants without stopping it (the DeepClone idea).

:func:`request_clone` registers the clones and orders the fork; the source's ``TrainContext``
serves the order at its next step boundary with one asynchronous checkpoint that is hard-linked
into each clone's tiers as it commits; a clone restores it, applies its overrides and continues.
"""

from resilient_flows.clone.lineage import lineage_tree
from resilient_flows.clone.request import allowed_overrides, check_overrides, request_clone

__all__ = ["allowed_overrides", "check_overrides", "lineage_tree", "request_clone"]
