"""Cobalt, the batch scheduler of ALCF's Theta: Parsl dropped its provider, this is ours."""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.sites.cobalt._cobalt": ("CobaltProvider",),
}

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.sites.cobalt._cobalt import (
        CobaltProvider as CobaltProvider,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
