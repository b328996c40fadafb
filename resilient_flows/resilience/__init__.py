"""Checkpointed loops over numpy arrays and torch tensors (the Kokkos Resilience idea).

``Context.checkpoint(label, i, fn)`` finds the arrays a loop body captures, saves them through the
checkpoint engine, and restores them in place after a restart, so that a simulation needs no
``state_dict`` of its own. Nothing here imports Parsl.
"""

from __future__ import annotations

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.resilience._capture": (
        "Array",
        "find_arrays",
    ),
    "resilient_flows.resilience._context": (
        "Context",
        "Every",
        "Filter",
        "every",
    ),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
