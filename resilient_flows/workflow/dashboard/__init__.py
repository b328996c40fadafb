"""The dashboard: a run's members, curves, faults, checkpoints and lineage in a browser.

:class:`RunModel` reads the run directory incrementally (the same reading as ``status``);
:func:`serve_dashboard` serves it live to a page that polls it; :func:`write_dashboard_report`
writes the same page as a self-contained file. Names are imported on first use: the runner
writes the report without importing the web server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.workflow.dashboard._model": ("RunModel",),
    "resilient_flows.workflow.dashboard._server": (
        "dashboard_app",
        "serve_dashboard",
    ),
    "resilient_flows.workflow.dashboard._static": ("write_dashboard_report",),
}

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.workflow.dashboard._model import (
        RunModel as RunModel,
    )
    from resilient_flows.workflow.dashboard._server import (
        dashboard_app as dashboard_app,
    )
    from resilient_flows.workflow.dashboard._server import (
        serve_dashboard as serve_dashboard,
    )
    from resilient_flows.workflow.dashboard._static import (
        write_dashboard_report as write_dashboard_report,
    )

#: The default port: one ``ssh -L`` line in the docs works without editing. Defined here, not in
#: the server, so that the command line's parser reads it without importing the web server.
DEFAULT_PORT = 8050

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES, defined=["DEFAULT_PORT"])
