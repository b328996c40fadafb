"""The family tree of a run's members: who was cloned from whom, at which step, with what changes;
as a tree for people (:func:`lineage_tree`) and as a document for scripts (:func:`lineage_document`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.tree import Tree

from resilient_flows.errors import DamagedFileError, FileTooLargeError
from resilient_flows.rundir import DamageLog, member_layout
from resilient_flows.training import MemberSpec, registered_members

#: The version of the ``lineage --json`` document; README.md ("Output for scripts") lists its fields.
LINEAGE_VERSION = 1


def lineage_tree(
    run_dir: str | os.PathLike, states: dict[str, str] | None = None, damage: DamageLog | None = None
) -> Tree:
    """A ``rich`` tree of the run's members; ``states`` adds each member's state (from ``status``);
    a damaged seed is recorded in ``damage`` and shown as none."""
    run_dir = Path(run_dir)
    members = registered_members(run_dir, damage=damage)
    children: dict[str | None, list[MemberSpec]] = {}
    for spec in members:
        children.setdefault(spec.parent.member if spec.parent else None, []).append(spec)
    tree = Tree(f"[bold]{run_dir.name}[/]")

    def add(node: Tree, spec: MemberSpec) -> None:
        label = f"[bold]{spec.name}[/]"
        if states and spec.name in states:
            label += f"  {states[spec.name]}"
        if spec.parent is not None:
            seed = clone_seed(run_dir, spec.name, damage)
            fork = "waiting for its state" if seed is None else f"from step {seed['step']} via {seed['transport']}"
            changes = ", ".join(f"{k}={v}" for k, v in spec.parent.overrides.items()) or "unchanged"
            label += f"  ({fork}; {changes})"
            if seed is not None and seed.get("fallback"):
                label += f"  [yellow]fallback: {seed['fallback']}[/]"
        branch = node.add(label)
        for child in children.get(spec.name, []):
            add(branch, child)

    for root in children.get(None, []):
        add(tree, root)
    return tree


def lineage_document(
    run_dir: str | os.PathLike, progress: dict[str, dict[str, Any]], damage: DamageLog
) -> dict[str, Any]:
    """``lineage --json``: every member in the order registered, with its parent (null for a
    planned member) and a clone's seed (null while it waits for its state), plus the fields
    ``progress`` has for it (its state and steps, from ``status``); the tree follows from the parents."""
    members = []
    for spec in registered_members(run_dir, damage=damage):
        parent = spec.parent
        seed = None if parent is None else clone_seed(Path(run_dir), spec.name, damage)
        members.append(
            {
                "name": spec.name,
                "parent": None
                if parent is None
                else {"member": parent.member, "request": parent.request, "overrides": dict(parent.overrides)},
                "seed": None
                if seed is None
                else {"step": seed["step"], "transport": seed["transport"], "fallback": seed.get("fallback")},
                **progress.get(spec.name, {}),
            }
        )
    return {
        "version": LINEAGE_VERSION,
        "run_dir": str(run_dir),
        "members": members,
        "damage": damage.documents(run_dir),
    }


def clone_seed(run_dir: Path, name: str, damage: DamageLog | None) -> dict[str, Any] | None:
    """A clone's seed; None while there is none, or when it is unreadable (then recorded in
    ``damage``: damaged, oversized, or without the step and transport it always has)."""
    layout = member_layout(run_dir, name)
    try:
        seed = layout.read_seed()
        if "step" not in seed or "transport" not in seed:
            raise DamagedFileError(layout.seed, "clone seed", "without its step or transport")
    except FileNotFoundError:
        return None
    except (DamagedFileError, FileTooLargeError, OSError) as exc:
        if damage is not None:
            damage.file(layout.seed, exc.problem if isinstance(exc, DamagedFileError) else str(exc))
        return None
    return seed
