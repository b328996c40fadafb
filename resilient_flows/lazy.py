"""Packages whose public names are declared once and imported on first use (PEP 562).

``import resilient_flows`` (or ``resilient_flows.training``) must not import torch or Parsl: the
command line's ``--help``, ``validate`` and ``status`` answer at once, and a compute node that only
checkpoints does not pay for Parsl. A package declares its public names in one mapping, from the
module each lives in to the names; this module turns that into the package's ``__getattr__``,
``__dir__`` and ``__all__``. A package's modules are internal (their names start with ``_``):
other packages import the names a package declares, never its modules.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, sources: Mapping[str, Iterable[str]], defined: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` for ``package``, whose public names live in
    the modules ``sources`` maps to them, plus those it ``defined`` itself. A name is imported on
    its first access, then kept on the package."""
    module_of = {name: module for module, names in sources.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_of[name]), name)
        setattr(sys.modules[package], name, value)  # the next access is a plain lookup
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *module_of})

    return __getattr__, __dir__, sorted({*module_of, *defined})
