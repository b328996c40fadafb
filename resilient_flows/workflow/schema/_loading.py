"""Reading a workflow file: YAML to a validated :class:`Workflow`, or one error that names the line
and key of the first problem (and the allowed keys, with a guess, for an unknown one)."""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from resilient_flows.errors import WorkflowError
from resilient_flows.workflow._yamlsource import YamlSource
from resilient_flows.workflow.schema._fields import dotted
from resilient_flows.workflow.schema._workflow import Workflow


def load_workflow(path: str | Path) -> Workflow:
    """The workflow in ``path``; a :class:`WorkflowError` naming the line and key of the first problem."""
    source = YamlSource.read(path)
    return parse_workflow(source)


def parse_workflow(source: YamlSource) -> Workflow:
    if not isinstance(source.data, dict):
        raise WorkflowError(f"{source.path}: expected a mapping with 'name' and 'members'")
    try:
        context = {"directory": Path(source.path).resolve().parent, "source": source}
        return Workflow.model_validate(source.data, context=context)
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: (e["type"] != "extra_forbidden", source.line(tuple(e["loc"])) or 0))
        first = errors[0]
        loc = tuple(first["loc"])
        line = source.line(loc)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise WorkflowError(f"{source.path}:{line}: {dotted(loc) or 'workflow'}: {_explain(first)}{more}") from None


def _explain(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(tuple(error["loc"])[:-1])
        close = difflib.get_close_matches(str(error["loc"][-1]), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown key{hint}; allowed: {', '.join(allowed)}"
    if kind == "missing":
        if error["loc"][-1] == "workload":
            return "required key is missing; give 'workload' (a training function) or 'command' (your own script)"
        return "required key is missing"
    message = error["msg"]
    return message.removeprefix("Value error, ")


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at ``loc``: walk the models along the path, through lists and the keys of mappings."""
    model: Any = Workflow
    keyed = False  # the next part is a key of a mapping (a hyperparameter's name), not a field
    for part in loc:
        if isinstance(part, int) or keyed:
            keyed = False
            continue
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return []
        keyed = _is_mapping(field.annotation)
        model = _model_in(field.annotation)
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def _is_mapping(annotation: Any) -> bool:
    return typing.get_origin(annotation) is dict or any(_is_mapping(arg) for arg in typing.get_args(annotation))


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
