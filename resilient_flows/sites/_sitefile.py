"""Finding and reading site files, without Parsl: ``validate`` reads a site's facts from them.

A site is named by a path (it ends in ``.yaml``/``.yml`` or holds a ``/``) or by a name, looked up
in these directories, the first that has ``NAME.yaml`` winning:

1. each directory in ``RESILIENT_FLOWS_SITES`` (separated by ``:``), in order;
2. the user's site directory, ``$XDG_CONFIG_HOME/resilient-flows/sites`` (``~/.config/...``),
   where ``resilient-flows sites new`` writes;
3. the site files shipped with the package (:data:`SITE_DIR`).

So a user's ``polaris.yaml`` takes the place of the shipped one without changing it, and a wheel
installed anywhere still finds ``local``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from resilient_flows.errors import SiteConfigError
from resilient_flows.shipped import shipped_dir

#: The site files shipped with the package: the checkout's ``site-configs/``, or a wheel's copy.
SITE_DIR = shipped_dir("site-configs")

#: The variable naming further site directories, searched before the user's and the shipped ones.
SITES_VARIABLE = "RESILIENT_FLOWS_SITES"


@dataclass(frozen=True)
class SiteDir:
    """A directory searched for site files, and what put it on the search path (``origin``)."""

    path: Path
    origin: str


@dataclass(frozen=True)
class KnownSite:
    """A site found by name: its file, and the directory it came from.

    ``shadows`` are the directories further down the search path that have a file of the same
    name too, which the name no longer reaches."""

    name: str
    path: Path
    source: SiteDir
    shadows: tuple[SiteDir, ...] = ()


def user_site_dir() -> Path:
    """The user's site directory: ``$XDG_CONFIG_HOME/resilient-flows/sites``, ``~/.config`` by default."""
    config = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(config) / "resilient-flows" / "sites"


def site_dirs() -> list[SiteDir]:
    """The directories searched for a site name, first match first (read anew on every call)."""
    listed = [SiteDir(Path(p), SITES_VARIABLE) for p in os.environ.get(SITES_VARIABLE, "").split(os.pathsep) if p]
    return [*listed, SiteDir(user_site_dir(), "user"), SiteDir(SITE_DIR, "packaged")]


def known_sites() -> dict[str, KnownSite]:
    """Every site reachable by name, sorted by name, each from the first directory that has it."""
    found: dict[str, KnownSite] = {}
    for directory in site_dirs():
        if not directory.path.is_dir():
            continue
        for path in sorted(directory.path.glob("*.yaml")):
            first = found.get(path.stem)
            if first is None:
                found[path.stem] = KnownSite(path.stem, path, directory)
            else:
                found[path.stem] = KnownSite(first.name, first.path, first.source, (*first.shadows, directory))
    return dict(sorted(found.items()))


def site_names() -> list[str]:
    """The names of the sites reachable by name, from every directory of :func:`site_dirs`."""
    return list(known_sites())


def is_site_path(text: str) -> bool:
    """Whether ``text`` is a site file's path rather than a site's name."""
    return text.endswith((".yaml", ".yml")) or os.sep in text


def site_path(name_or_path: str | os.PathLike) -> Path:
    """The file of a named site (``local``, ``polaris``, ...), or the given YAML path."""
    text = os.fspath(name_or_path)
    if is_site_path(text):
        return Path(text)
    site = known_sites().get(text)
    if site is None:
        searched = ", ".join(str(d.path) for d in site_dirs())
        raise SiteConfigError(
            f"unknown site {text!r}; known sites: {', '.join(site_names()) or 'none'} (searched {searched}; "
            f"`resilient-flows sites` lists them)"
        )
    return site.path


def site_description(path: Path) -> str:
    """The first sentence of the site file's leading comment: what ``resilient-flows sites`` shows."""
    words: list[str] = []
    try:
        with path.open() as lines:
            for line in lines:
                text = line.strip()
                if not text.startswith("#") or (words and not text.lstrip("#").strip()):
                    break  # the end of the leading comment, or of its first paragraph
                words.extend(text.lstrip("#").split())
    except OSError as exc:
        return f"(unreadable: {exc.strerror})"
    paragraph = " ".join(words)
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[: end + 1]


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
