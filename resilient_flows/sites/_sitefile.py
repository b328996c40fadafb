"""Finding and reading site files, without Parsl: ``validate`` reads a site's facts from them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from resilient_flows.errors import SiteConfigError

#: The site files of this checkout; ``RESILIENT_FLOWS_SITES`` points elsewhere.
SITE_DIR = Path(os.environ.get("RESILIENT_FLOWS_SITES", Path(__file__).resolve().parents[2] / "site-configs"))


def site_names() -> list[str]:
    """The names of the site files in :data:`SITE_DIR`."""
    return sorted(p.stem for p in SITE_DIR.glob("*.yaml"))


def site_path(name_or_path: str | os.PathLike) -> Path:
    """The file of a named site (``local``, ``polaris``, ...) or the given YAML path."""
    text = os.fspath(name_or_path)
    path = Path(text) if text.endswith((".yaml", ".yml")) or os.sep in text else SITE_DIR / f"{text}.yaml"
    if not path.exists() and path.parent == SITE_DIR:
        raise SiteConfigError(
            f"unknown site {text!r}; known sites: {', '.join(site_names()) or 'none'} (in {SITE_DIR})"
        )
    return path


def read_site(path: Path) -> dict[str, Any]:
    """The site file as a mapping (``yaml.safe_load``), environment references not yet expanded."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SiteConfigError(f"site file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise SiteConfigError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise SiteConfigError(f"{path}: expected a mapping with an 'executors' list, got {type(data).__name__}")
    return data
