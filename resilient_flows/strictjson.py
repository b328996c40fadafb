"""JSON that every parser reads: what the command line's ``--json`` documents and the dashboard send.

Python writes a NaN or an infinity (a diverged loss) as ``NaN``/``Infinity``, which ``JSON.parse``
and most other parsers refuse; these documents write them as ``null``.
"""

from __future__ import annotations

import json
import math
from typing import Any


def strict(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by None, and dict keys as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def dumps_strict(document: Any, indent: int | None = None) -> str:
    """``document`` as strict JSON, without spaces unless indented; what is not JSON (a path) as its ``str``."""
    separators = None if indent is not None else (",", ":")
    return json.dumps(strict(document), indent=indent, separators=separators, allow_nan=False, default=str)
