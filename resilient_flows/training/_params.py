"""What a workload declares about its params, and a member's params checked against it.

A workload function declares its params with an attribute ``params``: a pydantic model or a
dataclass whose fields are the params' names, types and defaults::

    class Params(pydantic.BaseModel):
        lr: float = 0.01
        hidden: int = 64

    def train(ctx):  # ctx.params["lr"], ctx.params["hidden"]
        ...

    train.params = Params

The built-in workloads declare theirs (:data:`resilient_flows.training.BUILTIN_PARAMS`). A
function without the attribute takes any params, unchecked. A function that takes its params as
keyword arguments, a stage's loop (``loop(ctx, output=..., inputs=..., **params)``), declares
them by its signature instead: its parameters' names, annotations and defaults
(:func:`signature_params`); one with ``**kwargs`` takes any.

A member's params (its ``params``, with its ``grid`` point or its campaign's sample) are checked
against the declaration: every name must be declared (an unknown one is an error with the closest
declared name), every value must have its declared type as JSON carries it (strict: ``"3"`` is
not an int, ``3`` is a float, a list is a tuple), and every field without a default must be
given. The declaration checks and does not convert: the function finds in ``ctx.params`` what
the workflow wrote, and the declared default of every param it left out (:func:`with_defaults`).

``validate`` and ``run`` check every member before anything is queued; :func:`run_member` checks
again before it trains, so that a member started from a plain Parsl script is refused with the
same line instead of failing at every retry. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import json
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, PydanticUserError, TypeAdapter, ValidationError, create_model

from resilient_flows.errors import WorkloadError


def declared_params(function: Callable[..., Any], ref: str) -> type | None:
    """The params declaration of the workload ``ref`` (its ``function``), None when it has none."""
    declared = getattr(function, "params", None)
    if declared is None:
        return None
    if not (isinstance(declared, type) and (issubclass(declared, BaseModel) or dataclasses.is_dataclass(declared))):
        raise WorkloadError(
            f"workload {ref!r}: its 'params' attribute declares the params it takes, as a pydantic model or a "
            f"dataclass; got {declared!r}"
        )
    return declared


def signature_params(function: Callable[..., Any], passed: Collection[str]) -> type | None:
    """What ``function``, which takes its params as keyword arguments, declares by its signature:
    a model of its parameters but those in ``passed`` (which its caller gives), with their
    annotations and defaults. None when it takes any keyword (``**kwargs``), or when its
    annotations are not types a model can hold."""
    signature = inspect.signature(function)
    parameters = signature.parameters.values()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return None
    try:
        hints = typing.get_type_hints(function)
    except (NameError, TypeError, AttributeError):  # an annotation that does not resolve: names only
        hints = {}
    keywords = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    fields: dict[str, Any] = {
        p.name: (hints.get(p.name, Any), ... if p.default is inspect.Parameter.empty else p.default)
        for p in parameters
        if p.name not in passed and p.kind in keywords
    }
    try:
        config = ConfigDict(arbitrary_types_allowed=True)
        return create_model(f"{function.__name__}_params", __config__=config, **fields)
    except PydanticUserError:
        return None


def declared_names(declared: type) -> list[str]:
    """The params ``declared`` names, sorted."""
    if issubclass(declared, BaseModel):
        return sorted(declared.model_fields)
    return sorted(field.name for field in dataclasses.fields(declared))


def params_problem(
    ref: str, declared: type, params: Mapping[str, Any], exempt: Collection[str] = (), what: str = "workload"
) -> tuple[str, str] | None:
    """The first param of ``params`` that the function ``ref`` (``what`` it is, which declares
    ``declared``) refuses, and the line that says why; None when it takes them all.

    Names in ``exempt`` are passed over where the declaration lacks them (a clone's optimizer
    overrides, which go into the optimizer's parameter groups rather than to the workload).
    """
    names = declared_names(declared)
    given = {key: value for key, value in params.items() if key in names or key not in exempt}
    for key in sorted(given):
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return key, f"{what} {ref!r}: unknown param {key!r}{hint}; declared: {', '.join(names) or 'none'}"
    try:
        _adapter(declared).validate_json(json.dumps(given, default=str), strict=True)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = str(error["loc"][0]) if error["loc"] else "params"
        if error["type"] == "missing":
            return key, f"{what} {ref!r}: param {key!r} is required (its declaration gives no default)"
        shown = repr(given.get(key))
        shown = shown if len(shown) <= 40 else f"{shown[:37]}..."
        return key, f"{what} {ref!r}: param {key!r} = {shown}: {error['msg']}"
    return None


def check_params(
    ref: str, declared: type | None, params: Mapping[str, Any], exempt: Collection[str] = (), what: str = "workload"
) -> None:
    """Raise :class:`WorkloadError` naming the first param of ``params`` that the function
    ``ref`` does not declare as given (see :func:`params_problem`)."""
    problem = None if declared is None else params_problem(ref, declared, params, exempt, what)
    if problem is not None:
        raise WorkloadError(problem[1])


def with_defaults(declared: type | None, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` and, for each declared field they leave out, its default: what the function
    finds in ``ctx.params``. A declaration is the user's promise of those values; a workload that
    reads ``ctx.params["batch"]`` must not fail, at every retry, for a default it declared."""
    filled = dict(params)
    if declared is None:
        return filled
    if issubclass(declared, BaseModel):
        for name, info in declared.model_fields.items():
            if name not in filled and not info.is_required():
                filled[name] = info.get_default(call_default_factory=True)
        return filled
    for field in dataclasses.fields(declared):
        if field.name in filled:
            continue
        if field.default is not dataclasses.MISSING:
            filled[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            filled[field.name] = field.default_factory()
    return filled


@functools.cache
def _adapter(declared: type) -> TypeAdapter:
    return TypeAdapter(declared)
