"""What the workflow's models share: the strict base, the name alphabet, durations, the checks of a
workload and a command, and paths confined to the run directory.

Member names become directory names in the run directory, so they are restricted to a safe
alphabet; every other path a workflow names is resolved inside the run directory.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Annotated, Any

from pydantic import ConfigDict, Field, ValidationInfo

from resilient_flows.training import BUILTIN_WORKLOADS
from resilient_flows.units import parse_duration

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
FAULT_KINDS = ("kill", "preempt", "error")
#: Checkpoint tiers a workflow may name, fastest first: node memory, node-local disk, shared file system.
TIERS = ("memory", "local", "peer", "shared")


#: Every model's configuration: an unknown key is an error, and a validated workflow does not change.
STRICT = ConfigDict(extra="forbid", frozen=True)


def to_seconds(value: Any, what: str) -> float:
    try:
        return parse_duration(value, what)
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def positive_seconds(value: Any, what: str) -> float:
    seconds = to_seconds(value, what)
    if seconds <= 0:
        raise ValueError(f"{what} must be positive, got {value!r}")
    return seconds


def check_workload(value: str) -> str:
    """``value`` if it names a built-in workload or a ``module:function``."""
    module, _, function = value.partition(":")
    if value not in BUILTIN_WORKLOADS and not (module and function):
        raise ValueError(
            f"unknown workload {value!r}: a built-in ({', '.join(BUILTIN_WORKLOADS)}) or 'module:function'"
        )
    return value


def check_one_way_to_run(what: str, workload: str | None, command: str | list[Any] | None) -> None:
    """Exactly one of ``workload`` and ``command``; ``what`` names the member or campaign."""
    choice = "give 'workload' (a training function) or 'command' (your own script)"
    if workload is not None and command is not None:
        raise ValueError(f"{what}: {choice}, not both")
    if workload is None and command is None:
        raise ValueError(f"{what}: {choice}")


def command_without_workload(data: Any) -> Any:
    """An entry with a command needs no workload key; without either, ``workload`` is missing."""
    if isinstance(data, dict) and "command" in data and "workload" not in data:
        return {**data, "workload": None}
    return data


def workflow_directory(info: ValidationInfo) -> Path | None:
    """The workflow file's directory, which :func:`~resilient_flows.workflow.schema.load_workflow`
    passes as validation context."""
    context = info.context or {}
    return context.get("directory")


def dotted(loc: tuple[Any, ...]) -> str:
    """A key's path as the workflow file spells it: ``members[0].params.lr``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def confined(value: str) -> str:
    """``value`` as a relative path that cannot leave the directory it is resolved in."""
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ValueError(f"path {value!r} must be relative and stay inside the run directory")
    return value


def run_path(run_dir: Path, relative: str) -> Path:
    """``relative`` (already :func:`confined`) resolved in ``run_dir``."""
    return run_dir / confined(relative)
