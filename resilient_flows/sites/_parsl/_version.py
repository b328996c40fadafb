"""The Parsl versions the package's internals were read from and tested with, and the check that
the installed Parsl is one of them (see the package's docstring)."""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from parsl.version import VERSION as INSTALLED

from resilient_flows.errors import UnsupportedParslError

__all__ = ["INSTALLED", "PARSL_RANGE", "TESTED_PARSL", "check_parsl"]

#: The Parsl versions the internals were read from and tested with.
TESTED_PARSL = ("2026.10.26",)
#: The Parsl versions resilient-flows runs with: from the oldest tested up to the next month's
#: releases, none of which was tested (today the range holds one release, the tested one). Widen
#: it once a newer Parsl passes the tests; ``pyproject.toml`` says the same.
PARSL_RANGE = ">=2026.10.26,<2026.11"


def check_parsl(version: str = INSTALLED) -> str:
    """``version`` (the installed Parsl's) when it is within :data:`PARSL_RANGE`; else an
    :class:`~resilient_flows.errors.UnsupportedParslError` naming it and the range."""
    try:
        known = Version(version) in SpecifierSet(PARSL_RANGE)
    except InvalidVersion:
        known = False
    if not known:
        raise UnsupportedParslError(
            f"Parsl {version} is installed, but resilient-flows relies on internals of Parsl {PARSL_RANGE} "
            f"(tested with {', '.join(TESTED_PARSL)}): pip install 'parsl{PARSL_RANGE}'"
        )
    return version
