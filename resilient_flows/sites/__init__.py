"""Site configurations: ``site-configs/<name>.yaml`` -> ``parsl.Config`` and :class:`SiteFacts`.

Only this package, ``apps`` and ``workflow`` know Parsl; its names are imported on first use, so
that reading a site's facts (:func:`site_facts`) does not import Parsl.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from resilient_flows.lazy import lazy_exports
from resilient_flows.sites.facts import SiteFacts
from resilient_flows.sites.site import SiteFile, site_facts
from resilient_flows.sites.sitefile import SITE_DIR, site_names

if TYPE_CHECKING:
    from parsl.config import Config

    from resilient_flows.sites.blockerrors import PatientBlockErrorHandler
    from resilient_flows.sites.cobalt import CobaltProvider

__all__ = [
    "SITE_DIR",
    "CobaltProvider",
    "PatientBlockErrorHandler",
    "SiteFacts",
    "SiteFile",
    "load_site",
    "site_facts",
    "site_names",
]


def load_site(name_or_path: str | os.PathLike = "local", **overrides: Any) -> Config:
    """The ``parsl.Config`` of a named site (``local``, ``polaris``, ...) or of a YAML file.

    ``overrides`` replace top-level ``parsl.Config`` arguments (``run_dir``, ``retries``, ...).
    The file's ``facts`` are not part of it: see :func:`site_facts`.
    """
    return SiteFile.open(name_or_path).config(**overrides)


__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "resilient_flows.sites.blockerrors": ("PatientBlockErrorHandler",),
        "resilient_flows.sites.cobalt": ("CobaltProvider",),
    },
)
