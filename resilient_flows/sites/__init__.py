"""Site configurations: ``site-configs/<name>.yaml`` -> ``parsl.Config``.

Only this package, ``apps`` and ``workflow`` know Parsl.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from parsl.config import Config

from resilient_flows.errors import SiteConfigError
from resilient_flows.sites.build import build_config, read_site

__all__ = ["SITE_DIR", "load_site", "site_names"]

#: The site files of this checkout; ``RESILIENT_FLOWS_SITES`` points elsewhere.
SITE_DIR = Path(os.environ.get("RESILIENT_FLOWS_SITES", Path(__file__).resolve().parents[2] / "site-configs"))


def site_names() -> list[str]:
    return sorted(p.stem for p in SITE_DIR.glob("*.yaml"))


def load_site(name_or_path: str | os.PathLike = "local", **overrides: Any) -> Config:
    """The ``parsl.Config`` of a named site (``local``, ``polaris``, ...) or of a YAML file.

    ``overrides`` replace top-level ``parsl.Config`` arguments (``run_dir``, ``retries``, ...).
    """
    text = os.fspath(name_or_path)
    path = Path(text) if text.endswith((".yaml", ".yml")) or os.sep in text else SITE_DIR / f"{text}.yaml"
    if not path.exists() and path.parent == SITE_DIR:
        raise SiteConfigError(
            f"unknown site {text!r}; known sites: {', '.join(site_names()) or 'none'} (in {SITE_DIR})"
        )
    return build_config(read_site(path), str(path), **overrides)
