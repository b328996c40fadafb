"""Find the arrays a callable works on, under names that a restarted process finds again.

A checkpointed loop body is an ordinary Python callable, usually a lambda over the simulation's
arrays. Rather than asking the user to list its state, we look at what the callable holds on to,
the way Kokkos Resilience finds the views a lambda captures. Python has no capture list, so we
follow the references a callable keeps:

* a function's closure cells, default arguments and keyword-only defaults, named after the
  variable or parameter (``u``, ``alpha``), and recursively the functions it captures
  (``step.grid``);
* a bound method's ``__self__`` (its instance attributes) and its function's captures, both under
  the method's own path, so ``ctx.checkpoint("x", i, solver.advance)`` finds ``grid``;
* a callable object's instance attributes and its ``__call__``'s captures, the same way;
* any other user object's instance attributes (``solver.grid``), lists and tuples
  (``fields[0]``), dicts keyed by strings, integers or tuples of these (``opts['mask']``), and
  ``functools.partial`` arguments.

Globals are *not* followed: a function names every global and builtin it touches, which would
drag in whole modules. Code that works on module-level arrays registers them explicitly. Objects
without ``__dict__`` (``__slots__``, C extension types other than arrays), modules and classes are
not entered either, and read-only numpy arrays (broadcasts, memory-mapped inputs) are not
state. Names depend only on variable names and container positions, never on object
identities, so they are the same in every process running the same code. Each object is entered
once (cycles end there) and an array reached twice is saved once, under its shortest path (the
breadth-first search meets it there first; ties go to the order of discovery).
"""

from __future__ import annotations

import functools
import inspect
import types
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

#: What the resilience context saves and restores in place.
Array = np.ndarray | torch.Tensor

_OPAQUE = (
    types.ModuleType,
    type,
    types.BuiltinFunctionType,
    types.CodeType,
    types.FrameType,
    types.GeneratorType,
    types.CoroutineType,
    str,
    bytes,
    bytearray,
    memoryview,
    int,
    float,
    complex,
    bool,
    type(None),
)

_KEY_TYPES = (str, int, bool, float, type(None))


def find_arrays(fn: Callable[..., Any], *, skip: Iterable[Any] = (), opaque: tuple[type, ...] = ()) -> dict[str, Array]:
    """The numpy arrays and torch tensors reachable from ``fn``, by stable path name.

    Parameters
    ----------
    fn:
        The callable whose captured state is wanted. Its own captures have plain names (``u``);
        deeper ones are joined with ``.``, ``[i]`` and ``['key']``.
    skip:
        Objects not to enter or report (compared by identity): excluded arrays, and objects such
        as the checkpoint context itself.
    opaque:
        Further types never to enter (their instances hold bookkeeping, not simulation state).

    Returns
    -------
    dict
        Path name to array, in discovery order (deterministic for the same code and data).
    """
    finder = _Finder({id(obj) for obj in skip}, _OPAQUE + opaque)
    finder.run(fn)
    return finder.found


class _Finder:
    def __init__(self, skip: set[int], opaque: tuple[type, ...]) -> None:
        self.seen = set(skip)
        self.opaque = opaque
        self.found: dict[str, Array] = {}
        self.queue: deque[tuple[Any, str]] = deque()

    def run(self, fn: Any) -> None:
        """Breadth first, so that an object keeps its shortest name (``u`` rather than ``step.u``)."""
        self.queue.append((fn, ""))
        while self.queue:
            self.enter(*self.queue.popleft())

    def visit(self, obj: Any, path: str) -> None:
        if not isinstance(obj, self.opaque) and id(obj) not in self.seen:
            self.queue.append((obj, path))

    def enter(self, obj: Any, path: str) -> None:
        if id(obj) in self.seen:
            return
        self.seen.add(id(obj))
        if isinstance(obj, np.ndarray | torch.Tensor):
            if isinstance(obj, np.ndarray) and (obj.dtype.hasobject or not obj.flags.writeable):
                return  # object arrays would need pickle; read-only ones are inputs, not state
            self.found[_unique(path or "array", self.found)] = obj
        elif isinstance(obj, types.FunctionType):
            self._function(obj, path)
        elif isinstance(obj, types.MethodType):
            self.visit(obj.__self__, path)
            self.visit(obj.__func__, path)
        elif isinstance(obj, functools.partial):
            self.visit(obj.func, path)
            for index, arg in enumerate(obj.args):
                self.visit(arg, _attr(path, f"args[{index}]"))
            for key, value in obj.keywords.items():
                self.visit(value, _attr(path, key))
        elif isinstance(obj, list | tuple):
            for index, item in enumerate(obj):
                self.visit(item, f"{path}[{index}]")
        elif isinstance(obj, dict):
            for key, value in obj.items():
                if _stable_key(key):
                    self.visit(value, f"{path}[{key!r}]")
        elif hasattr(obj, "__dict__"):
            attributes = vars(obj)
            if isinstance(attributes, dict):
                for name, value in list(attributes.items()):
                    self.visit(value, _attr(path, name))
            call = inspect.getattr_static(type(obj), "__call__", None)
            if isinstance(call, types.FunctionType):
                self.visit(call, path)

    def _function(self, fn: types.FunctionType, path: str) -> None:
        code = fn.__code__
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=True):
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not yet assigned (a function defined before its variable)
                continue
            self.visit(value, _attr(path, name))
        if fn.__defaults__:
            positional = code.co_varnames[: code.co_argcount]
            for name, value in zip(positional[-len(fn.__defaults__) :], fn.__defaults__, strict=True):
                self.visit(value, _attr(path, name))
        for name, value in (fn.__kwdefaults__ or {}).items():
            self.visit(value, _attr(path, name))


def _attr(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _stable_key(key: Any) -> bool:
    if isinstance(key, tuple):
        return all(_stable_key(k) for k in key)
    return isinstance(key, _KEY_TYPES)


def _unique(name: str, found: dict[str, Array]) -> str:
    """Two different arrays under one path (a method's attribute and its closure): number the later."""
    if name not in found:
        return name
    n = 2
    while f"{name}~{n}" in found:
        n += 1
    return f"{name}~{n}"
