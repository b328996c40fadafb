"""``${NAME}`` references in configuration strings, expanded from the environment.

Site files use them so that one file serves every user of a machine; a node-local directory uses
them to name the node it is on (``$${PARSL_WORKER_BLOCK_ID}`` in a site file reaches the member
as ``${PARSL_WORKER_BLOCK_ID}`` and is expanded where the member runs). The forms:

* ``${NAME}`` is the value of ``NAME``; an error if ``NAME`` is not set;
* ``${NAME:-default}`` is ``default`` when ``NAME`` is unset or empty;
* ``${NAME:?hint}`` is an error when ``NAME`` is unset or empty, and the error shows ``hint``;
* ``$${`` is a literal ``${`` (for variables to be expanded later, where the job runs).

Nothing else is touched: ``$NAME`` without braces passes through unchanged, keys are never
expanded, and an expanded value stays a string.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from resilient_flows.errors import SiteConfigError

__all__ = ["expand_env"]

# ``$${`` (an escaped brace), a well-formed reference, or any other ``${`` (an error).
_REFERENCE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|:\?)([^}]*))?\}|\$\{")


def expand_env(value: Any, where: str, key_path: str = "", environ: Mapping[str, str] | None = None) -> Any:
    """``value`` with the ``${...}`` references in its strings replaced from the environment.

    Mappings and lists are walked; ``key_path`` names ``value`` in error messages
    (``executors[0].provider.account``).
    """
    env = os.environ if environ is None else environ
    if isinstance(value, dict):
        return {k: expand_env(v, where, f"{key_path}.{k}" if key_path else str(k), env) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, where, f"{key_path}[{i}]", env) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value

    def replace(match: re.Match[str]) -> str:
        text, name, form, word = match.group(0), match.group(1), match.group(2), match.group(3)
        if text == "$${":
            return "${"
        if name is None:
            raise SiteConfigError(
                f"{where}: {key_path} has a '${{' that is not ${{NAME}}, ${{NAME:-default}} or ${{NAME:?hint}} "
                f"in {value!r}; write '$${{' for a literal '${{'"
            )
        current = env.get(name)
        if form == ":-":
            return current if current else word
        if current is None or (form == ":?" and not current):
            hint = word if form == ":?" and word else "value"
            raise SiteConfigError(f"{where}: {key_path} uses ${{{name}}}, which is not set; export {name}=<{hint}>")
        return current

    return _REFERENCE.sub(replace, value)
