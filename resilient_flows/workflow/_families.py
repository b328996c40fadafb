"""Members grouped by family: what the views of a large run show instead of a row per member.

A family is the workflow entry its members were expanded from (a ``count``/``seeds``/``grid``
member, a campaign); clones inherit their source's. A table of a thousand rows or a plot of a
thousand lines says nothing; a row or a band per family, the few best members and every member
in trouble do.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotations: the command line reads GROUP_ABOVE without the status machinery
    from resilient_flows.workflow._status import MemberStatus


#: Views list every member up to this many, and group them by family above.
GROUP_ABOVE = 20

#: Member states in the order a member usually goes through them (columns of the family table).
STATES = ("planned", "queued", "running", "retrying", "preempted", "failed", "finished", "retired")

_CLONE_SUFFIX = re.compile(r"(\.c\d+)+$")
_INDEX_SUFFIX = re.compile(r"-\d+$")


def family_of(name: str, recorded: str = "") -> str:
    """``recorded`` when the plan has it; for plans written before families were recorded, the
    member's name without its clone suffixes (``.c1``) and a trailing ``-<digits>``."""
    return recorded or _INDEX_SUFFIX.sub("", _CLONE_SUFFIX.sub("", name))


def group_by_family(statuses: Iterable[MemberStatus]) -> dict[str, list[MemberStatus]]:
    """Members by family, families in the order of their first member."""
    groups: dict[str, list[MemberStatus]] = {}
    for status in statuses:
        groups.setdefault(family_of(status.name, status.family), []).append(status)
    return groups


@dataclass(frozen=True)
class FamilyStats:
    """One family at a glance: ``states`` counts members by state, ``steps_done`` sums the steps
    its members trained (their newest metrics line) against ``steps_total``; losses are each
    member's newest, None while no member logged one."""

    family: str
    members: int
    states: dict[str, int]
    steps_done: int
    steps_total: int
    best_loss: float | None
    median_loss: float | None
    failures: int


def family_stats(statuses: Iterable[MemberStatus]) -> list[FamilyStats]:
    """:class:`FamilyStats` of each family, in the order of :func:`group_by_family`."""
    stats = []
    for family, members in group_by_family(statuses).items():
        losses = [s.loss for s in members if s.loss is not None]
        states: dict[str, int] = dict.fromkeys(STATES, 0)
        for s in members:
            states[s.state] += 1
        stats.append(
            FamilyStats(
                family=family,
                members=len(members),
                states=states,
                steps_done=sum(0 if s.step is None else s.step + 1 for s in members),
                steps_total=sum(s.steps for s in members),
                best_loss=min(losses, default=None),
                median_loss=statistics.median(losses) if losses else None,
                failures=sum(s.failures for s in members),
            )
        )
    return stats


def best_members(statuses: Iterable[MemberStatus], n: int) -> list[MemberStatus]:
    """The ``n`` members with the lowest newest loss, lowest first (ties by name)."""
    scored = [s for s in statuses if s.loss is not None]
    return sorted(scored, key=lambda s: (s.loss, s.name))[:n]


def troubled_members(statuses: Iterable[MemberStatus]) -> list[MemberStatus]:
    """Every member that failed or is being retried, in run order."""
    return [s for s in statuses if s.state in ("failed", "retrying")]


def describe_families(members: Iterable[tuple[str, str]]) -> list[str]:
    """One line per family of ``members`` ((name, recorded family) pairs, in plan order), such as
    ``cnn: 200 members (cnn-0 .. cnn-199)``."""
    groups: dict[str, list[str]] = {}
    for name, recorded in members:
        groups.setdefault(family_of(name, recorded), []).append(name)
    lines = []
    for family, names in groups.items():
        count = f"{len(names)} member" + ("s" if len(names) > 1 else "")
        if names == [family]:
            lines.append(f"{family}: {count}")
        else:
            shown = ", ".join(names) if len(names) <= 2 else f"{names[0]} .. {names[-1]}"
            lines.append(f"{family}: {count} ({shown})")
    return lines
