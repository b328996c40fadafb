"""Before anything is queued: every function a workflow names imports as a worker will import it,
and every member's params are what its workload declares.

A member that cannot import its workload fails at every attempt, and on a cluster only after the
queue wait; no retry fixes it. ``validate`` and ``run`` therefore import each ``module:function``
(workloads, evaluate functions, stages' loops) once, in a process like a worker's
(:func:`~resilient_flows.training._probe.probe_functions`), and check each member's params, its
grid point or campaign sample included, against the declaration of its workload
(:mod:`~resilient_flows.training._params`). The built-ins are checked here, without torch. The
first problem is one line naming the file, line and key that caused it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from resilient_flows.errors import WorkloadError
from resilient_flows.training import (
    BUILTIN_PARAMS,
    LOOP,
    FunctionCheck,
    MemberSpec,
    Problem,
    StageSpec,
    params_problem,
    probe_functions,
)
from resilient_flows.workflow.schema import Workflow


def check_functions(workflow: Workflow, members: Sequence[MemberSpec], stages: Sequence[StageSpec]) -> None:
    """Raise :class:`WorkloadError` for the first function of ``workflow`` that cannot run, or the
    first member whose params its workload refuses, in the order they run (stages, then members);
    ``and N more`` counts the others."""
    found = probe_functions(_checks(members, stages))
    imports = {problem.ref: problem for problem in found if problem.member is None}
    refused = {problem.member: problem for problem in [*found, *_builtin_problems(members)] if problem.member}
    ordered: dict[str, tuple[tuple[Any, ...], str]] = {}  # by function, stage or member: where, and what
    for index, stage in enumerate(stages):
        if stage.loop in imports:
            ordered.setdefault(stage.loop, (_naming(workflow, stage.loop), imports[stage.loop].message))
        elif stage.name in refused:
            problem = refused[stage.name]
            loc = _key(("stages", index), {"params": stage.params}, problem.param)
            ordered.setdefault(stage.name, (loc, problem.message))
    for spec in members:
        for ref in (spec.workload, spec.evaluate):
            if ref in imports:
                ordered.setdefault(ref, (_naming(workflow, ref), imports[ref].message))
        if spec.name in refused:
            problem = refused[spec.name]
            named = "" if spec.family == spec.name else f"member {spec.name!r}: "
            loc = _param_source(workflow, spec.family, problem.param)
            ordered.setdefault(spec.name, (loc, f"{named}{problem.message}"))
    if ordered:
        (loc, message), *others = ordered.values()
        more = f" (and {len(others)} more)" if others else ""
        raise WorkloadError(f"{workflow.locate(loc)}: {message}{more}")


def _builtin_problems(members: Sequence[MemberSpec]) -> list[Problem]:
    problems = []
    for spec in members:
        declared = BUILTIN_PARAMS.get(spec.workload)
        refused = None if declared is None else params_problem(spec.workload, declared, spec.params)
        if refused is not None:
            problems.append(Problem(spec.workload, refused[1], spec.name, refused[0]))
    return problems


def _checks(members: Sequence[MemberSpec], stages: Sequence[StageSpec]) -> list[FunctionCheck]:
    """One check per function the workflow names, each workload's with the params of its members."""
    runs: dict[tuple[str, str, str | None], list[tuple[str, dict[str, Any]]]] = {}  # -> who runs it, how
    for stage in stages:
        runs.setdefault((stage.loop, LOOP, None), []).append((stage.name, stage.params))
    for spec in members:
        if ":" in spec.workload:
            runs.setdefault((spec.workload, "workload", spec.workdir), []).append((spec.name, spec.params))
        if spec.evaluate:
            runs.setdefault((spec.evaluate, "evaluate function", spec.workdir), [])
    return [FunctionCheck(ref, what, tuple(given), where) for (ref, what, where), given in runs.items()]


def _naming(workflow: Workflow, ref: str) -> tuple[Any, ...]:
    """Where ``ref`` is first named: a stage's loop, a member's workload or evaluate function, a
    campaign's workload."""
    for index, stage in enumerate(workflow.stages):
        if stage.loop == ref:
            return ("stages", index, "loop")
    for index, entry in enumerate(workflow.members):
        for key in ("workload", "evaluate"):
            if getattr(entry, key) == ref:
                return ("members", index, key)
    for index, campaign in enumerate(workflow.explore):
        if campaign.workload == ref:
            return ("explore", index, "workload")
    return ()


def _param_source(workflow: Workflow, family: str, param: str | None) -> tuple[Any, ...]:
    """Where the entry ``family`` (a member entry or a campaign) gives ``param``: its grid or its
    hyperparameters before its params, as they override them."""
    for index, entry in enumerate(workflow.members):
        if entry.name == family:
            return _key(("members", index), {"grid": entry.grid or {}, "params": entry.params}, param)
    for index, campaign in enumerate(workflow.explore):
        if campaign.name == family:
            sources = {"hyperparameters": campaign.hyperparameters, "params": campaign.params}
            return _key(("explore", index), sources, param)
    return ()


def _key(entry: tuple[Any, ...], sources: dict[str, dict[str, Any]], param: str | None) -> tuple[Any, ...]:
    key = next((key for key, given in sources.items() if param in given), None)
    return (*entry, key, param) if key is not None else (*entry, "params")
