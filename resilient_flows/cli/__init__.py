"""The ``resilient-flows`` command line.

User mistakes (a missing directory, a corrupt checkpoint) end in one line on stderr and a
non-zero exit; only bugs show a traceback.

Each command imports what it needs when it runs: torch and Parsl take seconds to import, and
``--help``, ``validate`` and ``status`` need neither.

One module per command group adds its parsers (``add_parsers``) and holds their handlers;
:mod:`~resilient_flows.cli._app` puts them together behind :func:`main`, imported on first use so
that the runner's guard (``python -m resilient_flows.cli.leaseguard``) starts without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.cli._app": ("main",),
}

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.cli._app import (
        main as main,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
