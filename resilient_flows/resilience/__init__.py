"""Checkpointed loops over numpy arrays and torch tensors (the Kokkos Resilience idea).

``Context.checkpoint(label, i, fn)`` finds the arrays a loop body captures, saves them through the
checkpoint engine, and restores them in place after a restart, so that a simulation needs no
``state_dict`` of its own. Nothing here imports Parsl.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.resilience._capture import (
        Array as Array,
    )
    from resilient_flows.resilience._capture import (
        find_arrays as find_arrays,
    )
    from resilient_flows.resilience._context import (
        Context as Context,
    )
    from resilient_flows.resilience._context import (
        Every as Every,
    )
    from resilient_flows.resilience._context import (
        Filter as Filter,
    )
    from resilient_flows.resilience._context import (
        every as every,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
