"""Turn a site YAML, in Globus Compute's endpoint style, into a ``parsl.Config``.

Each mapping with a ``type:`` key names a Parsl class (an executor, provider or launcher); its
other keys are that class's constructor arguments, checked against its signature so that a typo
is reported with the file, the key and the allowed names instead of surfacing as a TypeError
deep inside Parsl. Only classes from Parsl's executor, provider and launcher packages, and the
providers of :mod:`resilient_flows.sites.cobalt`, can be named: a site file selects
configuration, it does not import arbitrary code.

String values may use the environment (``${NAME}``, ``${NAME:-default}``, ``${NAME:?hint}``,
``$${`` for a literal ``${``; see :mod:`resilient_flows.envvars`), so that one site file serves
every user of a machine. The top-level ``facts:`` mapping describes the
machine for resilient-flows (see :mod:`resilient_flows.sites.facts`) and never reaches Parsl.
"""

from __future__ import annotations

import difflib
import inspect
import os
from pathlib import Path
from typing import Any

import parsl.executors
import parsl.launchers
import parsl.providers
import typeguard
import yaml
from parsl.config import Config

from resilient_flows.envvars import expand_env
from resilient_flows.errors import SiteConfigError
from resilient_flows.sites import cobalt

__all__ = ["SITE_DIR", "build_config", "expand_env", "read_site", "site_names", "site_path"]

#: The site files of this checkout; ``RESILIENT_FLOWS_SITES`` points elsewhere.
SITE_DIR = Path(os.environ.get("RESILIENT_FLOWS_SITES", Path(__file__).resolve().parents[2] / "site-configs"))

_NAMESPACES = (parsl.executors, parsl.providers, parsl.launchers, cobalt)


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


def _classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for module in _NAMESPACES:
        for name in dir(module):
            obj = getattr(module, name)
            if inspect.isclass(obj) and not name.startswith("_"):
                found.setdefault(name, obj)
    return found


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


def build_config(data: dict[str, Any], where: str, **overrides: Any) -> Config:
    """A ``parsl.Config`` from a site mapping; ``overrides`` replace top-level Config arguments.

    The ``facts`` mapping is left out, and ``${...}`` references are expanded in everything else
    (not in ``overrides``, which are Python values already).
    """
    data = expand_env({k: v for k, v in data.items() if k != "facts"}, where)
    data.update(overrides)
    executors = data.pop("executors", None)
    if not isinstance(executors, list) or not executors:
        raise SiteConfigError(f"{where}: 'executors' must be a non-empty list of executor mappings")
    classes = _classes()
    built = [_build(spec, f"{where}: executors[{i}]", classes) for i, spec in enumerate(executors)]
    _check_keys(Config, data, where, exclude={"executors"})
    return Config(executors=built, **data)


def _build(spec: Any, where: str, classes: dict[str, type]) -> Any:
    if not isinstance(spec, dict) or "type" not in spec:
        raise SiteConfigError(f"{where}: expected a mapping with a 'type' key naming a Parsl class")
    spec = dict(spec)
    name = spec.pop("type")
    cls = classes.get(name)
    if cls is None:
        close = difflib.get_close_matches(str(name), classes, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise SiteConfigError(
            f"{where}: unknown type {name!r}{hint} (Parsl executors, providers and launchers, and CobaltProvider)"
        )
    _check_keys(cls, spec, f"{where} ({name})")
    args = {key: _value(key, value, f"{where}.{key}", classes) for key, value in spec.items()}
    try:
        return cls(**args)
    except (TypeError, ValueError, typeguard.TypeCheckError) as exc:
        raise SiteConfigError(f"{where} ({name}): {exc}") from None


def _value(key: str, value: Any, where: str, classes: dict[str, type]) -> Any:
    if isinstance(value, dict) and "type" in value:
        return _build(value, where, classes)
    if key == "max_workers_per_node" and value == "auto":
        return os.cpu_count() or 1
    return value


def _check_keys(cls: type, spec: dict[str, Any], where: str, exclude: frozenset[str] | set[str] = frozenset()) -> None:
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = sorted(n for n in params if n not in exclude and n != "self")
    for key in spec:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SiteConfigError(f"{where}: unknown key {key!r}{hint}; allowed: {', '.join(allowed)}")
