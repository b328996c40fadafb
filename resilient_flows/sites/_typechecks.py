"""Parsl's run-time type checks, left out of the processes that run only Parsl's own code.

Parsl decorates its classes and functions with typeguard's ``@typechecked``, which, as each module
is imported, parses the decorated source and compiles a checked copy: about 0.3 CPU-s of every
``import parsl``, a third of it. The checks guard Parsl's interface against a caller's wrong types.
A worker pool, its fork server and the interchange call only Parsl's own code, and one of each
starts for every block and every restart, on every node: there the checks are skipped, as
``python -O`` skips them (typeguard's decorator then returns its target), without stripping those
processes' assertions as ``-O`` would. The runner and a user's Parsl script, which build Parsl's
configuration from a site file, keep them (a wrong type there is a clear error).
"""

from __future__ import annotations

from typing import Any

__all__ = ["skip_type_checks"]


def skip_type_checks() -> None:
    """Make typeguard's ``typechecked`` return what it decorates unchanged, for every module
    imported after this call (Parsl's: call it before Parsl is imported)."""
    import typeguard

    typeguard.typechecked = _unchecked  # type: ignore[assignment]


def _unchecked(target: Any = None, **_: Any) -> Any:
    """``@typechecked`` and ``@typechecked(...)`` as ``python -O`` makes them: no instrumentation."""
    return _unchecked if target is None else target
