"""Site configurations: a site file (``<name>.yaml``) -> ``parsl.Config`` and :class:`SiteFacts`.

Site files are found by name in the directories of :func:`site_dirs` (the user's before the
shipped ``site-configs/``). Only this package, ``apps`` and ``workflow`` know Parsl; its names are
imported on first use, so that reading a site's facts (:func:`site_facts`) does not import Parsl.
"""

from __future__ import annotations

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.sites._blockerrors": ("PatientBlockErrorHandler",),
    "resilient_flows.sites.cobalt": ("CobaltProvider",),
    "resilient_flows.sites._facts": ("SiteFacts",),
    "resilient_flows.sites._options": (
        "SITE_OPTIONS",
        "SiteOptions",
        "parse_site_options",
    ),
    "resilient_flows.sites._site": (
        "SiteFile",
        "load_site",
        "site_facts",
    ),
    "resilient_flows.sites._sitefile": (
        "SITES_VARIABLE",
        "SITE_DIR",
        "KnownSite",
        "SiteDir",
        "known_sites",
        "site_description",
        "site_dirs",
        "site_names",
        "site_path",
        "user_site_dir",
    ),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
