"""Cobalt, the batch scheduler of ALCF's Theta: Parsl dropped its provider, this is ours."""

from __future__ import annotations

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.sites.cobalt._cobalt": ("CobaltProvider",),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
