"""Asking for clones of a running member: validation, naming, registration, the order to the source.

The clones are registered as members of the run at once (the runner submits them, and they wait
for their state); the source learns of the order at its next step boundary and forks without
stopping (see :mod:`resilient_flows.training._fork`).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from resilient_flows.errors import CloneError
from resilient_flows.rundir import CloneOrder, EventLog, member_layout, run_layout, write_clone_order
from resilient_flows.training import (
    BUILTIN_PARAMS,
    OPTIMIZER_KEYS,
    STRUCTURAL,
    MemberSpec,
    ParentSpec,
    fill_command,
    read_spec,
    register_member,
    registered_members,
)


def allowed_overrides(spec: MemberSpec) -> list[str]:
    """What a clone of ``spec`` may change: seed, steps, optimizer hyperparameters, workload params."""
    declared = BUILTIN_PARAMS.get(spec.workload)
    workload = set(declared.model_fields) - STRUCTURAL if declared is not None else set()
    return sorted({"seed", "steps", *OPTIMIZER_KEYS, *workload, *(set(spec.params) - STRUCTURAL)})


def check_overrides(source: MemberSpec, per_clone: list[dict[str, Any]]) -> None:
    """Raise :class:`CloneError` for an override no clone of ``source`` can apply."""
    allowed = allowed_overrides(source)
    for changes in per_clone:
        for key in changes:
            if key in STRUCTURAL:
                raise CloneError(f"override {key!r} would change the shape of {source.name}'s model; a clone keeps it")
            if key not in allowed:
                raise CloneError(
                    f"unknown hyperparameter {key!r} for member {source.name}; allowed: {', '.join(allowed)}"
                )
        if "steps" in changes and (isinstance(changes["steps"], bool) or not isinstance(changes["steps"], int)):
            raise CloneError(f"override steps must be an integer, got {changes['steps']!r}")


def request_clone(
    run_dir: str | os.PathLike,
    member: str,
    n: int = 1,
    overrides: list[dict[str, Any]] | dict[str, Any] | None = None,
    at_step: int | None = None,
    ranks: int | None = None,
) -> list[str]:
    """Fork member ``member`` into ``n`` clones, at its next step boundary or after ``at_step``; their names.

    ``overrides`` is one mapping for every clone, or one per clone. An unchanged clone continues
    bit for bit like its source would. The member may be running or not started yet. ``ranks``
    runs the clones on another number of ranks than the source (its ``parallel`` mode kept): the
    clone restores the source's checkpoint resharded into its own layout, and then continues
    within floating-point reduction-order noise of the source, not bit for bit.
    """
    run_dir = Path(run_dir)
    source = read_spec(run_dir, member)
    if source is None:
        names = ", ".join(s.name for s in registered_members(run_dir)) or "none"
        raise CloneError(f"{run_dir} has no member {member!r}; its members: {names}")
    if member_layout(run_dir, member).has_result():
        raise CloneError(f"member {member!r} has finished: only a running member can be cloned")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise CloneError(f"the number of clones must be a positive integer, got {n!r}")
    if at_step is not None and (isinstance(at_step, bool) or not isinstance(at_step, int) or at_step < 0):
        raise CloneError(f"at_step must be a non-negative integer, got {at_step!r}")
    if ranks is not None and (isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1):
        raise CloneError(f"a clone needs at least one rank, got ranks={ranks!r}")
    per_clone = _per_clone(overrides, n)
    check_overrides(source, per_clone)

    request = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    requested_at = time.time()
    names = _new_names(run_dir, member, n)
    for name, changes in zip(names, per_clone, strict=True):
        parent = ParentSpec(member, request, changes, requested_at)
        register_member(run_dir, _clone_spec(source, name, changes, parent, ranks or source.ranks))
    write_clone_order(run_dir, member, CloneOrder(request, tuple(names), requested_at, at_step))
    EventLog(run_dir).emit("clone_requested", member, request=request, clones=names, overrides=per_clone)
    return names


def _per_clone(overrides: list[dict[str, Any]] | dict[str, Any] | None, n: int) -> list[dict[str, Any]]:
    if overrides is None:
        return [{} for _ in range(n)]
    if isinstance(overrides, dict):
        return [dict(overrides) for _ in range(n)]
    if len(overrides) != n:
        raise CloneError(f"{len(overrides)} sets of overrides for {n} clones: give one set, or one per clone")
    return [dict(o) for o in overrides]


def _new_names(run_dir: Path, member: str, n: int) -> list[str]:
    taken = {p.name for p in run_layout(run_dir).members.iterdir()}
    names, k = [], 1
    while len(names) < n:
        name = f"{member}.c{k}"
        if name not in taken:
            names.append(name)
        k += 1
    return names


def _clone_spec(source: MemberSpec, name: str, changes: dict[str, Any], parent: ParentSpec, ranks: int) -> MemberSpec:
    params = {**source.params, **{k: v for k, v in changes.items() if k not in ("seed", "steps")}}
    seed, steps = int(changes.get("seed", source.seed)), int(changes.get("steps", source.steps))
    *node_local, shared = source.checkpoint.tiers  # the planner names node-local tiers <root>/<member>
    tiers = [replace(tier, path=str(PurePosixPath(tier.path).parent / name)) for tier in node_local]
    checkpoint = replace(source.checkpoint, tiers=(*tiers, shared))
    command = source.command
    if source.command_template is not None:  # the clone's own command line: {lr} is its lr
        workdir = None if source.workdir is None else Path(source.workdir)
        values = {**params, "name": name, "seed": seed, "steps": steps}
        command = fill_command(source.command_template, values, workdir)
    return replace(
        source.with_ranks(ranks),
        name=name,
        params=params,
        seed=seed,
        steps=steps,
        command=command,
        checkpoint=checkpoint,
        faults=(),
        parent=parent,
    )
