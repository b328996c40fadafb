"""Packages whose public names are imported on first use (PEP 562).

``import resilient_flows`` (or ``resilient_flows.training``) must not import torch or Parsl: the
command line's ``--help``, ``validate`` and ``status`` answer at once, and a compute node that only
checkpoints does not pay for Parsl. A package lists where each name lives, and this module turns
that into the package's ``__getattr__`` and ``__dir__``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, sources: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose names live in the modules ``sources``
    maps to them. A name is imported on its first access, then kept on the package."""
    module_of = {name: module for module, names in sources.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_of[name]), name)
        setattr(sys.modules[package], name, value)  # the next access is a plain lookup
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *module_of})

    return __getattr__, __dir__
