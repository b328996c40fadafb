"""What must hold across a workflow's sections: names unique, stages in order, and every fault,
clone and analytics request naming a member or stage that exists.

Each section's model checks its own fields; these checks need the expanded member names (a
``grid`` or ``count`` entry stands for several), so the :class:`Workflow` runs them once its
sections are valid. Each raises :class:`ValueError`, which pydantic reports like a field's error.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

from resilient_flows.clone import check_overrides
from resilient_flows.errors import CloneError
from resilient_flows.training import MemberSpec
from resilient_flows.workflow.schema._models import (
    AnalyticsConfig,
    CloneConfig,
    ExploreConfig,
    FaultConfig,
    MemberConfig,
    StageConfig,
)


def check_something_to_run(
    members: Sequence[MemberConfig], explore: Sequence[ExploreConfig], stages: Sequence[StageConfig]
) -> None:
    if not members and not explore and not stages:
        raise ValueError("give 'members', 'stages' or an 'explore' campaign: there is nothing to run")


def check_order(names: Sequence[str], stages: Sequence[StageConfig], members: Sequence[MemberConfig]) -> None:
    """Member and stage ``names`` unique; each stage after earlier stages only, each member after stages."""
    stage_names = [stage.name for stage in stages]
    duplicates = sorted(n for n, count in collections.Counter([*names, *stage_names]).items() if count > 1)
    if duplicates:
        raise ValueError(f"member and stage names must be unique; repeated: {', '.join(duplicates)}")
    for index, stage in enumerate(stages):
        unknown = [name for name in stage.after if name not in stage_names[:index]]
        if unknown:
            raise ValueError(
                f"stage {stage.name!r} runs after {', '.join(map(repr, unknown))}, which must be a stage "
                f"listed before it ({', '.join(stage_names[:index]) or 'none is'})"
            )
    for member in members:
        unknown = [name for name in member.after if name not in stage_names]
        if unknown:
            raise ValueError(
                f"member {member.name!r} runs after {', '.join(map(repr, unknown))}, "
                f"which is not a stage ({', '.join(stage_names) or 'there are none'})"
            )


def check_faults(faults: Sequence[FaultConfig], names: Sequence[str], stages: Sequence[str]) -> None:
    known = {*names, *stages}
    for fault in faults:
        if fault.member not in known:
            raise ValueError(
                f"fault names {fault.member!r}, which is not one of the members or stages "
                f"{', '.join([*names, *stages])}"
            )


def check_clones(clones: Sequence[CloneConfig], specs: Mapping[str, MemberSpec]) -> None:
    """Each clone of a member that exists, with overrides its source accepts, one set per clone."""
    for clone in clones:
        if clone.member not in specs:
            raise ValueError(f"clone names member {clone.member!r}, which is not one of {', '.join(specs)}")
        per_clone = clone.overrides if isinstance(clone.overrides, list) else [clone.overrides] * clone.n
        if len(per_clone) != clone.n:
            raise ValueError(f"{len(per_clone)} sets of overrides for {clone.n} clones")
        try:
            check_overrides(specs[clone.member], per_clone)
        except CloneError as exc:
            raise ValueError(str(exc)) from None


def check_analytics(analytics: Sequence[AnalyticsConfig], names: Sequence[str], commands: Sequence[str]) -> None:
    """Each request evaluates members that exist and have an evaluate function (``commands`` have none)."""
    for request in analytics:
        unknown = [] if request.members == "all" else sorted(set(request.members) - set(names))
        if unknown:
            raise ValueError(f"analytics names unknown members {', '.join(unknown)}")
        chosen = names if request.members == "all" else request.members
        evaluated = [name for name in chosen if name in commands]
        if evaluated:
            raise ValueError(
                f"analytics {request.name!r} would evaluate command members ({', '.join(evaluated)}), "
                "which have no evaluate function: list the workload members under 'members'"
            )
        if request.when is not None and request.when.member not in names:
            raise ValueError(
                f"analytics {request.name!r} waits for member {request.when.member!r}, "
                f"which is not one of {', '.join(names)}"
            )
