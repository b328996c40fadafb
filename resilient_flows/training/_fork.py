"""Forking a running member into clones, as seen by the member: the source side and the clone side.

Source: at a step boundary with a pending order, the member takes one ordinary asynchronous
checkpoint (its stall is a checkpoint's stall) and keeps training. When that checkpoint commits in
a tier, the checkpoint engine's ``on_commit`` hook hard-links it into each clone's tier of the
same kind (node-local into node-local, shared into shared), so a clone restores it as its own
checkpoint through the fastest tier it can see, and neither side's retention can pull it from
under the other.

Clone: before its first step it waits for that checkpoint. If the source died mid-transfer (its
attempt counter moved on, or its process is gone), finished without forking, or the wait times
out, the clone adopts the source's newest committed checkpoint instead and says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilient_flows.checkpoint import Checkpointer, Tier, TrainState
from resilient_flows.procgroup import process_runs
from resilient_flows.rundir import TaskLayout, member_dir, member_layout
from resilient_flows.rundir._control import CloneOrder
from resilient_flows.training._contract import member_checkpoint
from resilient_flows.training._members import read_spec
from resilient_flows.training._spec import OPTIMIZER_KEYS, MemberSpec, ParentSpec

logger = logging.getLogger(__name__)

#: How long a clone waits for its source's checkpoint before taking the source's newest one.
SEED_TIMEOUT_S = float(os.environ.get("RESILIENT_FLOWS_CLONE_TIMEOUT", "300"))
_POLL_S = 0.02


def mark_forking(run_dir: Path, source: str, order: CloneOrder, step: int, attempt: int) -> None:
    """Turn a pending order into one being served, so that a restarted source does not serve it twice."""
    layout = member_layout(run_dir, source)
    layout.write_fork_marker(
        order.request, {"step": step, "attempt": attempt, "pid": os.getpid(), "host": socket.gethostname()}
    )
    layout.clone_order(order.request).unlink(missing_ok=True)


class Handoff:
    """The ``on_commit`` hook of a fork checkpoint: link it into every clone's tier of that kind."""

    def __init__(self, run_dir: Path, source: str, orders: list[CloneOrder], rank: int, world_size: int) -> None:
        self.run_dir = run_dir
        self.source = source
        self.orders = orders
        self.rank, self.world_size = rank, world_size
        self.clones = [_read_spec(run_dir, name) for order in orders for name in order.clones]
        self.forked_at = time.time()

    def __call__(self, tier: Tier, step: int) -> None:
        for clone in self.clones:
            if clone is None:
                continue
            try:
                self._hand(clone, tier, step)
            except OSError as exc:
                logger.warning("cannot hand step %d (%s tier) to clone %s: %s", step, tier.name, clone.name, exc)
                if tier.name != "shared":
                    continue  # the shared tier's hand-off follows
                with contextlib.suppress(OSError):  # the clone falls back to the newest committed checkpoint
                    member_layout(self.run_dir, clone.name).write_handoff(
                        {"step": step, "forked_at": self.forked_at, "failed": f"{tier.name} tier: {exc}"}
                    )
        if tier.name == "shared" and self.rank == 0:
            for order in self.orders:
                member_layout(self.run_dir, self.source).remove_fork_marker(order.request)

    def _hand(self, clone: MemberSpec, tier: Tier, step: int) -> None:
        if self.rank == 0:  # when the source served the order: a clone's clock starts there at the earliest
            member_layout(self.run_dir, clone.name).write_handoff({"step": step, "forked_at": self.forked_at})
        if tier.name == "local":
            local = member_checkpoint(clone, self.run_dir).tier("local")  # on this node: expanded here
            if self.world_size == 1 and local is not None:
                Tier(local.path, "local").adopt(tier.step_dir(step), step)
        elif self.rank == 0:
            Tier(member_layout(self.run_dir, clone.name).checkpoints, "shared").adopt(tier.step_dir(step), step)


@dataclass(frozen=True)
class Seed:
    """How a clone got its state: the step, the path it came by, when its source served the
    order (None after a fallback) and when the clone started receiving."""

    step: int
    transport: str
    receiving_at: float
    forked_at: float | None = None
    fallback: str | None = None


def wait_for_seed(run_dir: Path, spec: MemberSpec, checkpointer: Checkpointer, timeout: float = SEED_TIMEOUT_S) -> Seed:
    """Block until this clone's tier holds the source's checkpoint; adopt the source's newest on failure."""
    parent = spec.parent
    assert parent is not None
    deadline = time.monotonic() + timeout
    while True:
        step = checkpointer.latest_step()
        if step is not None:
            local = checkpointer.local is not None and step in checkpointer.local.committed_steps()
            transport = "node-local tier (hard link)" if local else "shared tier (hard link)"
            return Seed(step, transport, time.time(), forked_at=_forked_at(member_dir(run_dir, spec.name)))
        problem = _handoff_problem(run_dir, parent) or _failed_handoff(member_layout(run_dir, spec.name))
        if problem is None and time.monotonic() > deadline:
            problem = f"no checkpoint from {parent.member} within {timeout:.0f} s"
        if problem is not None:
            return _fall_back(run_dir, parent, checkpointer, problem)
        time.sleep(_POLL_S)


def _handoff_problem(run_dir: Path, parent: ParentSpec) -> str | None:
    """Why the source's hand-off for this request will never arrive, or None while it still may."""
    source = member_layout(run_dir, parent.member)
    try:
        forking = source.read_fork_marker(parent.request)
    except FileNotFoundError:
        forking = None
    except ValueError:
        return None  # being written (an oversized one never ends: the deadline does)
    if forking is None:
        pending = source.clone_order(parent.request).exists()
        if pending and source.has_result():
            return f"{parent.member} finished before it could fork"
        return None
    if source.has_result():  # it hands the checkpoint over before it finishes: it failed to
        return f"{parent.member} finished without handing over its checkpoint of step {forking['step']}"
    attempts = _read_attempts(source)
    lost = f"before its checkpoint of step {forking['step']} committed"
    if attempts is not None and attempts > forking["attempt"]:
        return f"{parent.member} was restarted (attempt {attempts}) {lost}"
    if forking["host"] == socket.gethostname() and not process_runs(forking["pid"]):
        return f"{parent.member}'s process {forking['pid']} died {lost}"
    return None


def _fall_back(run_dir: Path, parent: ParentSpec, checkpointer: Checkpointer, problem: str) -> Seed:
    source = Tier(member_layout(run_dir, parent.member).checkpoints, "shared")
    for step in source.committed_steps():
        with contextlib.suppress(OSError):  # pruned while we linked it: take the next one
            checkpointer.shared.adopt(source.step_dir(step), step)
            logger.warning(
                "clone of %s: %s; starting from its newest committed checkpoint, step %d", parent.member, problem, step
            )
            return Seed(step, "shared tier (fallback)", time.time(), fallback=f"{problem}; took step {step}")
    raise RuntimeError(f"clone of {parent.member}: {problem}, and {parent.member} has no committed checkpoint")


class CloneStart:
    """A clone's first start, as its member sees it: wait for the source's checkpoint before the
    restore, apply the overrides to the state restored from it, and report ``cloned``.

    ``broadcast`` gives rank 0's value to every rank; ``emit`` writes a member event (rank 0).
    """

    def __init__(
        self, run_dir: Path, spec: MemberSpec, rank: int, broadcast: Callable[[Any], Any], emit: Callable[..., None]
    ) -> None:
        self.run_dir, self.spec, self.rank = run_dir, spec, rank
        self._broadcast, self._emit = broadcast, emit
        self.layout = member_layout(run_dir, spec.name)
        self.seed: Seed | None = None

    def wait(self, checkpointer: Checkpointer) -> None:
        """Before the first restore of a clone: block until its tiers hold its seed."""
        if self.spec.parent is not None and _read_seed_step(self.layout) is None:
            seed = wait_for_seed(self.run_dir, self.spec, checkpointer) if self.rank == 0 else None
            self.seed = self._broadcast(seed)

    def restored(self, state: TrainState, step: int | None) -> bool:
        """After the restore of ``step``: whether it is the clone's seed, with the overrides applied
        (after the state, so that they win)."""
        parent = self.spec.parent
        seed_step = self.seed.step if self.seed is not None else _read_seed_step(self.layout)
        if parent is None or step is None or step != seed_step:
            return False
        apply_overrides(state, parent.overrides)
        return True

    def report(self, restored_step: int | None) -> None:
        """A clone about to take its first step from its source's state says so (``cloned``). Its
        clock starts at the request, or when the source served the order if that was later."""
        parent, seed = self.spec.parent, self.seed
        if parent is None or seed is None or restored_step != seed.step:
            return
        start = max(parent.requested_at, seed.forked_at or 0.0)
        record = {"step": seed.step, "transport": seed.transport, "fallback": seed.fallback}
        if self.rank == 0:
            self.layout.write_seed({"parent": parent.member, **record})
        self._emit(
            "cloned",
            parent=parent.member,
            request=parent.request,
            overrides=parent.overrides,
            standby_s=round(seed.receiving_at - start, 4),
            readiness_s=round(time.time() - start, 4),
            **record,
        )


def _read_seed_step(layout: TaskLayout) -> int | None:
    try:
        return int(layout.read_seed()["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


#: Optimizer hyperparameters an override may change; anything else changes the workload's params.


def apply_overrides(state: TrainState, overrides: dict[str, Any]) -> dict[str, Any]:
    """Set overridden optimizer hyperparameters in every parameter group; what was changed."""
    changed: dict[str, Any] = {}
    optimizer = state.optimizer
    if optimizer is None:
        return changed
    for key, value in overrides.items():
        if key not in OPTIMIZER_KEYS:
            continue
        for group in optimizer.param_groups:
            if key in group:
                group[key] = tuple(value) if isinstance(group[key], tuple) else value
                changed[key] = value
        if key == "lr" and state.scheduler is not None and hasattr(state.scheduler, "base_lrs"):
            state.scheduler.base_lrs = [value for _ in state.scheduler.base_lrs]
    return changed


def _read_spec(run_dir: Path, name: str) -> MemberSpec | None:
    try:
        return read_spec(run_dir, name)
    except (OSError, ValueError, TypeError) as exc:
        logger.warning("cannot read the spec of clone %s: %s", name, exc)
        return None


def _failed_handoff(clone: TaskLayout) -> str | None:
    """Why the source could not hand this clone its checkpoint, as the source recorded it; or None."""
    try:
        failed = clone.read_handoff().get("failed")
    except (OSError, ValueError, AttributeError):
        return None
    return f"the hand-off failed: {failed}" if isinstance(failed, str) else None


def _forked_at(directory: Path) -> float | None:
    try:
        return float(TaskLayout(directory).read_handoff()["forked_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _read_attempts(layout: TaskLayout) -> int | None:
    try:
        return layout.read_attempts()
    except (OSError, ValueError):
        return None
