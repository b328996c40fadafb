"""Run one member to completion (or preemption), and evaluate members' latest checkpoints.

These are the bodies of the Parsl apps; they know nothing of Parsl, so that they can also run in
a plain process, under ``mpiexec``, or in a test.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from resilient_flows.checkpoint import read_checkpoint
from resilient_flows.rundir import EventLog, member_layout
from resilient_flows.rundir._heartbeat import Heartbeat, analytics_task
from resilient_flows.training._context import TrainContext
from resilient_flows.training._params import check_params, with_defaults
from resilient_flows.training._pool import PoolWatch
from resilient_flows.training._spec import OPTIMIZER_KEYS, MemberSpec
from resilient_flows.training._workloads import check_call, resolve_workload


def run_member(spec: dict[str, Any], run_dir: str, comm: Any = None) -> dict[str, Any]:
    """Train one member from its latest checkpoint to its last step; its result.

    Raises :class:`~resilient_flows.training.Preempted` after committing a checkpoint when asked to
    stop. ``comm`` of several ranks (mpi4py, or a torch.distributed ProcessGroup) makes them one
    member: one process group for training and the checkpointer; without it, a spec of several
    ``ranks`` forms the group from its launcher's environment (srun, torchrun, PBS).

    A workload that does not import, or params it does not declare, raise
    :class:`~resilient_flows.errors.WorkloadError` before anything is trained or recorded.
    """
    member = MemberSpec.from_dict(spec)
    workload = resolve_workload(member.workload, member.evaluate, member.workdir)
    check_call(workload.train, f"workload {member.workload} of member {member.name}", "ctx")
    check_params(member.workload, workload.params, member.params, exempt=_clone_optimizer_overrides(member))
    member = dataclasses.replace(member, params=with_defaults(workload.params, member.params))
    ctx = TrainContext(member, run_dir, comm=comm)
    try:
        result = workload.train(ctx)
    finally:
        ctx.close()
    if not isinstance(result, dict):
        result = {"member": member.name, "value": result}
    if ctx.checkpointer.rank == 0:
        ctx.layout.write_result(result)
        ctx.events.emit("finished", member.name, attempt=ctx.attempt, **_scalars(result))
    return result


def evaluate_members(specs: list[dict[str, Any]], run_dir: str, request: str = "analytics") -> dict[str, Any]:
    """Evaluate each member's newest committed checkpoint while the members keep training.

    Reads only committed checkpoints, without cleaning anything: a member writing its next
    checkpoint meanwhile is never disturbed. Members without a checkpoint yet, or whose workload
    has no evaluation, are reported as such.
    """
    EventLog(run_dir).emit("analytics_started", None, request=request, pid=os.getpid())
    with Heartbeat(run_dir, analytics_task(request), attempt=1, pool=PoolWatch.find()):
        report = _evaluate(specs, run_dir)
    EventLog(run_dir).emit("analytics", None, request=request, members=report)
    return report


def _evaluate(specs: list[dict[str, Any]], run_dir: str) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for raw in specs:
        member = MemberSpec.from_dict(raw)
        workload = resolve_workload(member.workload, member.evaluate, member.workdir)
        found = read_checkpoint(member_layout(run_dir, member.name).checkpoints)
        if found is None:
            report[member.name] = {"step": None, "note": "no committed checkpoint yet"}
        elif workload.evaluate is None:
            report[member.name] = {"step": found[0], "note": f"workload {member.workload} has no evaluate function"}
        else:
            step, state = found
            params = with_defaults(workload.params, member.params)
            report[member.name] = {"step": step, **workload.evaluate({**params, "steps": member.steps}, state)}
    return report


def _scalars(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if isinstance(v, int | float | str) and k not in ("member", "attempts")}


def _clone_optimizer_overrides(member: MemberSpec) -> frozenset[str]:
    """The optimizer hyperparameters a clone's overrides set (``eps``, ``betas``): they go into the
    optimizer's parameter groups at the fork, so a workload need not declare them."""
    changes = member.parent.overrides if member.parent is not None else {}
    return frozenset(key for key in changes if key in OPTIMIZER_KEYS)
