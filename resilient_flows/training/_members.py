"""A run's members as the runner registers them: their specs, and the newest step each committed.

A member's spec file (:attr:`~resilient_flows.rundir.TaskLayout.spec`) registers it (planned ones
when the run starts, clones when they are requested); the runner submits every registered member
it has not submitted yet. The run directory says where the files lie
(:meth:`~resilient_flows.rundir.RunLayout.spec_files`); this module reads them as
:class:`~resilient_flows.training._spec.MemberSpec`.
"""

from __future__ import annotations

import os
from pathlib import Path

from resilient_flows.errors import DamagedFileError, FileTooLargeError
from resilient_flows.rundir import DamageLog, TaskLayout, member_layout, run_layout
from resilient_flows.training._spec import MemberSpec


def register_member(run_dir: str | os.PathLike, spec: MemberSpec) -> Path:
    layout = member_layout(run_dir, spec.name)
    layout.write_spec(spec.to_dict())
    return layout.root


def read_spec(run_dir: str | os.PathLike, name: str) -> MemberSpec | None:
    """The registered spec of member ``name``, or None if there is no such member."""
    try:
        return _load_spec(member_layout(run_dir, name))
    except FileNotFoundError:
        return None


def registered_members(
    run_dir: str | os.PathLike, known: dict[Path, MemberSpec] | None = None, damage: DamageLog | None = None
) -> list[MemberSpec]:
    """Every member of a run, planned ones and clones, in the order they were registered.

    A spec is written once, when its member is registered: pass the same ``known`` dict to
    every call of a polling loop and each spec file is parsed once. A damaged spec is
    :class:`~resilient_flows.errors.DamagedFileError`, or with ``damage`` (a view) recorded there
    and its member left out.
    """
    paths = run_layout(run_dir).spec_files()
    known = {} if known is None else known
    for path in paths:
        if path in known:
            continue
        try:
            known[path] = _load_spec(TaskLayout(path.parent))
        except (DamagedFileError, FileTooLargeError) as exc:
            if damage is None:
                raise
            damage.file(path, exc.problem if isinstance(exc, DamagedFileError) else str(exc))
    return [known[path] for path in paths if path in known]


def _load_spec(layout: TaskLayout) -> MemberSpec:
    """The spec in ``layout``; one that is JSON but no spec (a field missing or unknown) is damaged too."""
    document = layout.read_spec()
    try:
        return MemberSpec.from_dict(document)
    except (KeyError, TypeError, ValueError) as exc:
        raise DamagedFileError(layout.spec, "member spec", f"not a member spec ({exc})") from None


def latest_committed_step(run_dir: str | os.PathLike, spec: MemberSpec) -> int:
    """The newest step committed in any of the member's tiers; -1 when none is."""
    placed = spec.checkpoint.placed(member_layout(run_dir, spec.name).root)  # paths as planned: not on the node
    return newest_committed([Path(tier.path) for tier in placed.tiers if not tier.peer])


def newest_committed(directories: list[Path]) -> int:
    """The newest step committed in any of these checkpoint directories; -1 when none is."""
    from resilient_flows.checkpoint import Tier  # imports torch: not for the command line's status

    return max(
        (s for path in directories if path.is_dir() for s in Tier(path, "any").committed_steps()[:1]), default=-1
    )
