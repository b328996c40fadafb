"""Site configurations: a site file (``<name>.yaml``) -> ``parsl.Config`` and :class:`SiteFacts`.

Site files are found by name in the directories of :func:`site_dirs` (the user's before the
shipped ``site-configs/``). Only this package, ``apps`` and ``workflow`` know Parsl; its names are
imported on first use, so that reading a site's facts (:func:`site_facts`) does not import Parsl.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.sites._blockerrors import (
        PatientBlockErrorHandler as PatientBlockErrorHandler,
    )
    from resilient_flows.sites._facts import (
        SiteFacts as SiteFacts,
    )
    from resilient_flows.sites._options import (
        SITE_OPTIONS as SITE_OPTIONS,
    )
    from resilient_flows.sites._options import (
        SiteOptions as SiteOptions,
    )
    from resilient_flows.sites._options import (
        parse_site_options as parse_site_options,
    )
    from resilient_flows.sites._site import (
        SiteFile as SiteFile,
    )
    from resilient_flows.sites._site import (
        load_site as load_site,
    )
    from resilient_flows.sites._site import (
        site_facts as site_facts,
    )
    from resilient_flows.sites._sitefile import (
        SITE_DIR as SITE_DIR,
    )
    from resilient_flows.sites._sitefile import (
        SITES_VARIABLE as SITES_VARIABLE,
    )
    from resilient_flows.sites._sitefile import (
        KnownSite as KnownSite,
    )
    from resilient_flows.sites._sitefile import (
        SiteDir as SiteDir,
    )
    from resilient_flows.sites._sitefile import (
        known_sites as known_sites,
    )
    from resilient_flows.sites._sitefile import (
        site_description as site_description,
    )
    from resilient_flows.sites._sitefile import (
        site_dirs as site_dirs,
    )
    from resilient_flows.sites._sitefile import (
        site_names as site_names,
    )
    from resilient_flows.sites._sitefile import (
        site_path as site_path,
    )
    from resilient_flows.sites._sitefile import (
        user_site_dir as user_site_dir,
    )
    from resilient_flows.sites.cobalt import (
        CobaltProvider as CobaltProvider,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
