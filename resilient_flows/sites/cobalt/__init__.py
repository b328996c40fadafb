"""Cobalt, the batch scheduler of ALCF's Theta: Parsl dropped its provider, this is ours."""

from resilient_flows.sites.cobalt.cobalt import CobaltProvider

__all__ = ["CobaltProvider"]
