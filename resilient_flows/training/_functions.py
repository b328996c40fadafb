"""Importing a function a workflow names as ``package.module:function``, with one line for each way
it can fail.

A member's workload, its evaluate function and a stage's loop are imported where they run, from
the worker's ``sys.path``: the installed packages and ``PYTHONPATH`` of the environment Parsl
started the worker in, and for a member's functions its workflow file's directory first (not the
current directory). No retry makes
a missing module importable, so ``validate`` and ``run`` import them first, the same way, in a
process like a worker's (:mod:`resilient_flows.training._probe`), and report what this module
raises. Nothing here imports torch.
"""

from __future__ import annotations

import difflib
import importlib
import traceback
from collections.abc import Callable
from typing import Any

from resilient_flows.errors import WorkloadError


def import_function(ref: str, what: str = "workload") -> Callable[..., Any]:
    """The function ``ref`` (``package.module:function``) names; ``what`` it is, for the error.

    Raises :class:`WorkloadError` for a module that is not on the path, one that does not
    compile or raises while it is imported, a name it lacks and a name that is not callable.
    """
    module_name, _, attr = ref.partition(":")
    if not (module_name and attr):
        raise WorkloadError(f"{what} {ref!r}: expected 'package.module:function'")
    module = _import(module_name, ref, what)
    if not hasattr(module, attr):
        functions = [name for name in dir(module) if not name.startswith("_") and callable(getattr(module, name))]
        close = difflib.get_close_matches(attr, functions, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise WorkloadError(f"{what} {ref!r}: {module_name} has no function {attr!r}{hint}")
    function = getattr(module, attr)
    if not callable(function):
        kind = type(function).__name__
        raise WorkloadError(f"{what} {ref!r}: {module_name}.{attr} is a value of type {kind}, not a function")
    return function


def _import(module_name: str, ref: str, what: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(f"{exc.name}.")):
            raise WorkloadError(
                f"{what} {ref!r}: no module named {exc.name!r} where workers import from (installed packages, "
                "PYTHONPATH and the workflow file's directory): install it, or add its directory to PYTHONPATH"
            ) from None
        problem = _raised(exc)
    except SyntaxError as exc:
        raise WorkloadError(f"{what} {ref!r}: {exc.filename}:{exc.lineno}: {exc.msg}") from None
    except (Exception, SystemExit) as exc:  # a module's own code raised, or exited, while it was imported
        problem = _raised(exc)
    raise WorkloadError(f"{what} {ref!r}: importing {module_name} raised {problem}")


def _raised(exc: BaseException) -> str:
    """``Type: message (file:line)`` of ``exc``: its first line, and where it was raised."""
    message = str(exc).strip().splitlines()
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}{': ' + message[0] if message else ''}{where}"
