"""Site configurations: ``site-configs/<name>.yaml`` -> ``parsl.Config`` and :class:`SiteFacts`.

Only this package, ``apps`` and ``workflow`` know Parsl.
"""

from __future__ import annotations

import os
from typing import Any

from parsl.config import Config

from resilient_flows.sites.build import SITE_DIR, build_config, read_site, site_names, site_path
from resilient_flows.sites.cobalt import CobaltProvider
from resilient_flows.sites.facts import SiteFacts, site_facts

__all__ = ["SITE_DIR", "CobaltProvider", "SiteFacts", "load_site", "site_facts", "site_names"]


def load_site(name_or_path: str | os.PathLike = "local", **overrides: Any) -> Config:
    """The ``parsl.Config`` of a named site (``local``, ``polaris``, ...) or of a YAML file.

    ``overrides`` replace top-level ``parsl.Config`` arguments (``run_dir``, ``retries``, ...).
    The file's ``facts`` are not part of it: see :func:`site_facts`.
    """
    path = site_path(name_or_path)
    return build_config(read_site(path), str(path), **overrides)
