"""What a test needs from its machine beyond the package: an optional extra, root, a service.

Where a need is not met the test skips and says what is missing, so that the suite runs on a
laptop without the extras or root. Where ``RESILIENT_FLOWS_REQUIRE_ALL=1`` (set by ``.ci/run``)
it fails instead: a CI machine that lost an extra, root or the Slurm cluster must never pass for
a green run. Every such skip in the suite goes through here; the one exception is a test whose
input data may be absent from a clean clone (see ``tests/test_cosched_sim.py``).
"""

from __future__ import annotations

import importlib
import os
import warnings
from types import ModuleType
from typing import NoReturn

import pytest

__all__ = ["REQUIRE_ALL", "all_required", "require", "require_module", "unmet", "unmet_in_part"]

#: The environment variable that turns every skip for a missing need into a failure.
REQUIRE_ALL = "RESILIENT_FLOWS_REQUIRE_ALL"


def all_required() -> bool:
    """Whether every need must be met (CI), rather than skipped."""
    return os.environ.get(REQUIRE_ALL) == "1"


def unmet(reason: str) -> NoReturn:
    """Skip the test (or, at module level, the whole file) for ``reason``; fail it in CI."""
    if all_required():
        pytest.fail(f"{REQUIRE_ALL}=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(condition: bool, reason: str) -> None:
    """Return if ``condition`` holds; else skip the test for ``reason`` (fail it in CI)."""
    if not condition:
        unmet(reason)


def require_module(name: str, reason: str) -> ModuleType:
    """The module ``name``; without it the test skips for ``reason`` (fails in CI).

    Like ``pytest.importorskip``, which never fails: an extra that CI forgot to install would
    otherwise turn its tests into a quiet row of skips."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        unmet(f"{reason} ({exc})")


def unmet_in_part(reason: str) -> None:
    """For a test that can check the rest without this need: fail it in CI, else warn and return."""
    if all_required():
        pytest.fail(f"{REQUIRE_ALL}=1 but {reason}", pytrace=False)
    warnings.warn(reason, stacklevel=2)
