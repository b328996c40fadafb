"""The run's recorded plan: written into its run directory when the run is created, read back by
every later command, with the members (clones) registered since.

The plan (:class:`~resilient_flows.workflow._plan.Plan`: the validated workflow, the site and
every member's spec) is recorded as JSON (no pickle); its file, and where it and the rest of the
run lie, are :mod:`resilient_flows.rundir`'s (:mod:`~resilient_flows.rundir._planfile`).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from resilient_flows.errors import WorkflowError
from resilient_flows.rundir import (
    DamageLog,
    encode_plan,
    read_plan_document,
    refuse_occupied,
    run_layout,
    write_plan,
)
from resilient_flows.training import MemberSpec, register_member, registered_members
from resilient_flows.workflow._plan import Plan
from resilient_flows.workflow.schema import Workflow


def default_run_dir(workflow: Workflow) -> Path:
    return Path("runs") / f"{workflow.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def create_run_dir(path: Path, plan: Plan, source_text: str) -> Path:
    """Create ``path`` for a new run; refuses one that already holds a run, which ``resume`` continues."""
    layout = run_layout(path)
    refuse_occupied(layout)
    document = {
        "site": plan.site,
        # every field, defaults included: a resume keeps the settings the run started with
        "workflow": plan.workflow.model_dump(mode="json"),
        "members": [m.to_dict() for m in plan.members],
    }
    text = encode_plan(document)
    try:
        layout.members.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(path, exc, "cannot create the run directory", "; choose another with --run-dir") from None
    require_writable(path, "; choose another with --run-dir")
    layout.write_workflow(source_text)
    for member in plan.members:
        register_member(path, member)
    write_plan(layout, text)
    return path.resolve()


def require_writable(path: Path, hint: str = "") -> None:
    """Refuse a run directory this process cannot write (a read-only mount, another user's).

    Found here it is one line before anything starts; found by the runner's first write, it is a
    traceback after Parsl has started, or a member that fails at every retry. Root bypasses
    permission bits, so the answer comes from a real write, not from ``os.access``.
    """
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".writable-"):
            pass
    except OSError as exc:
        raise _unwritable(path, exc, "cannot write to the run directory", hint) from None


def _unwritable(path: Path, exc: OSError, what: str, hint: str) -> WorkflowError:
    """The one line for a run directory that cannot be written; ``hint`` follows the reason."""
    return WorkflowError(f"{what} {path}: {exc.strerror or exc}{hint}")


def run_members(
    path: Path, plan: Plan, known: dict[Path, MemberSpec] | None = None, damage: DamageLog | None = None
) -> list[MemberSpec]:
    """The plan's members in plan order, then the clones requested since, oldest request first
    (``known``: specs already read; ``damage``: where a view records damaged specs, see
    :func:`registered_members`)."""
    planned = {m.name for m in plan.members}
    return [*plan.members, *(m for m in registered_members(path, known, damage) if m.name not in planned)]


class MemberIndex:
    """:func:`run_members` for a polling loop: the member directories are listed again only when
    the members' directory changed (a clone registered), not on every poll of a run of thousands
    of members.

    A clone's directory appears before its spec file; directories seen without one are looked at
    again on every call until it is there. ``damage``: where a view records damaged specs (see
    :func:`run_members`).
    """

    def __init__(self, path: Path, plan: Plan, damage: DamageLog | None = None) -> None:
        self.path = path
        self.plan = plan
        self.damage = damage
        self._known: dict[Path, MemberSpec] = {}
        self._mtime: int | None = None
        self._members: list[MemberSpec] = []
        self._clones: list[MemberSpec] = []
        self._incomplete = False

    def members(self) -> list[MemberSpec]:
        root = run_layout(self.path).members
        mtime = root.stat().st_mtime_ns if root.is_dir() else None
        if mtime != self._mtime or self._incomplete:
            self._mtime = mtime
            self._members = run_members(self.path, self.plan, self._known, self.damage)
            self._clones = [m for m in self._members if m.parent is not None]
            directories = 0 if mtime is None else sum(1 for e in os.scandir(root) if e.is_dir(follow_symlinks=False))
            self._incomplete = directories > len(self._known)
        return self._members

    def clones(self) -> list[MemberSpec]:
        """The members that are clones, as of the last :meth:`members`."""
        return self._clones


def read_plan(path: Path) -> Plan:
    """The plan of the run in ``path``."""
    layout = run_layout(path)
    document = read_plan_document(layout)
    try:
        workflow = Workflow.model_validate(document["workflow"])
        members = tuple(MemberSpec.from_dict(m) for m in document["members"])
        return Plan(workflow, str(document["site"]), members)
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkflowError(f"{layout.plan}: not a plan this version understands ({exc})") from None
