"""The files that ship with the package: the site files and the example workflows.

They live at the top of the repository (``site-configs/``, ``workflows/``), where the tests and
the docs use them. A wheel has no repository around it, so ``setup.py`` copies them into the
package as ``resilient_flows/_data/<name>/`` when it builds one. A checkout, and an editable
install of one, reads them in place. This module is the one place that knows both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

__all__ = ["PACKAGED", "shipped_dir"]

#: Where a wheel carries the shipped directories.
PACKAGED = Path(__file__).resolve().parent / "_data"
_CHECKOUT = Path(__file__).resolve().parent.parent


def shipped_dir(name: Literal["site-configs", "workflows"]) -> Path:
    """The shipped directory ``name``: the wheel's copy when there is one, else the checkout's."""
    packaged = PACKAGED / name
    return packaged if packaged.is_dir() else _CHECKOUT / name
