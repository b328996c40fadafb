"""The dashboard's page: one HTML file, its script and style, and Plotly's own bundle.

The same page serves both ways. Served live it polls the server; written as a report
(:func:`write_report_page`) it carries the run's document and every member's sampled details in a
``<script type="application/json">`` element and fetches nothing: its assets lie beside it in
``assets/`` (Plotly's bundle from the installed ``plotly`` package, never from a CDN), so it opens
from a file URL on a machine without network.

The page puts every value it shows into the document as text (``textContent``), never as markup:
member names, errors and overrides are whatever a user or a failing program wrote.
"""

from __future__ import annotations

import os
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

from resilient_flows.durable import write_atomically
from resilient_flows.strictjson import dumps_strict

#: The page's own assets, in this package.
_OWN = ("dashboard-look.js", "dashboard.js", "dashboard.css")
#: Where the embedded data goes in a report.
_DATA_MARK = "<!-- rf-data -->"
#: This module's package, whose assets/ the page bundles.
_PACKAGE = __name__.rpartition(".")[0]


def _assets() -> Path:
    return Path(str(resources.files(_PACKAGE) / "assets"))


def plotly_bundle() -> Path:
    """Plotly's minified bundle as the installed ``plotly`` package ships it."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def asset_path(name: str) -> Path | None:
    """The file of the asset ``name``; None for a name that is not one (never a path from the request)."""
    if name == "plotly.min.js":
        return plotly_bundle()
    if name in _OWN:
        return _assets() / name
    return None


def page_html(data: str | None = None) -> str:
    """The page; with ``data`` (JSON), the report's page that carries it."""
    html = (_assets() / "page.html").read_text(encoding="utf-8")
    if data is None:
        return html.replace(_DATA_MARK, "")
    # inside <script>, "</" would end the element: JSON may write "<" as \u003c anywhere
    element = f'<script id="rf-data" type="application/json">{data.replace("<", chr(92) + "u003c")}</script>'
    return html.replace(_DATA_MARK, element)


def write_report_page(page: str | os.PathLike, document: dict[str, Any], members: dict[str, Any]) -> Path:
    """The page ``page`` with ``document`` and ``members`` (name -> details) in it, and its assets
    beside it in ``assets/``; the page's path."""
    page = Path(page)
    assets = page.parent / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    for name in (*_OWN, "plotly.min.js"):
        source, target = asset_path(name), assets / name
        if source is None:
            continue
        if not target.exists() or target.stat().st_size != source.stat().st_size or name in _OWN:
            shutil.copyfile(source, target)
    write_atomically(page, page_html(dumps_strict({"document": document, "members": members})))
    return page
