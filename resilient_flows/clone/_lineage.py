"""The family tree of a run's members: who was cloned from whom, at which step, with what changes."""

from __future__ import annotations

import os
from pathlib import Path

from rich.tree import Tree

from resilient_flows.rundir import member_layout
from resilient_flows.training import MemberSpec, registered_members


def lineage_tree(run_dir: str | os.PathLike, states: dict[str, str] | None = None) -> Tree:
    """A ``rich`` tree of the run's members; ``states`` adds each member's state (from ``status``)."""
    run_dir = Path(run_dir)
    members = registered_members(run_dir)
    children: dict[str | None, list[MemberSpec]] = {}
    for spec in members:
        children.setdefault(spec.parent.member if spec.parent else None, []).append(spec)
    tree = Tree(f"[bold]{run_dir.name}[/]")

    def add(node: Tree, spec: MemberSpec) -> None:
        label = f"[bold]{spec.name}[/]"
        if states and spec.name in states:
            label += f"  {states[spec.name]}"
        if spec.parent is not None:
            seed = _seed(run_dir, spec.name)
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


def _seed(run_dir: Path, name: str) -> dict | None:
    try:
        return member_layout(run_dir, name).read_seed()
    except (OSError, ValueError):
        return None
