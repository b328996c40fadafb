"""A member's ranks: the process group it forms or joins, and its model wrapped to train across it."""

from __future__ import annotations

from typing import Any

from torch import nn

from resilient_flows.errors import LaunchError
from resilient_flows.training._distributed import DistributedInfo, comm_size, init_process_group, shutdown_process_group
from resilient_flows.training._spec import MemberSpec


def join_member_ranks(spec: MemberSpec, comm: Any) -> DistributedInfo | None:
    """The member's process group when it has several ranks: formed (or joined) here.

    ``comm`` of several ranks carries the rendezvous; without one, the launcher's environment
    must hold as many processes as the spec's ``ranks``.
    """
    given = comm_size(comm)
    if given <= 1 and spec.ranks == 1:
        return None
    try:
        info = init_process_group(comm=comm if given > 1 else None, interface=spec.network_interface)
    except LaunchError as exc:
        raise LaunchError(f"member {spec.name} ({spec.ranks} ranks): {exc}") from exc
    if given <= 1 and info.world_size != spec.ranks:
        shutdown_process_group()
        raise LaunchError(
            f"member {spec.name} has ranks: {spec.ranks}, but {info.launcher} started {info.world_size} process(es)"
        )
    return info


def wrap_model(model: Any, spec: MemberSpec, distributed: DistributedInfo | None) -> Any:
    """``model`` made to train across the member's ranks, per its ``parallel`` (see
    :meth:`~resilient_flows.training.TrainContext.wrap`). A model that cannot be wrapped is
    refused before anything is changed, on any rank count."""
    got = None
    if not isinstance(model, nn.Module):
        got = f"a {type(model).__name__}"
    elif not any(True for _ in model.parameters()):
        got = f"a {type(model).__name__} without parameters"
    if got is not None:
        raise LaunchError(
            f"member {spec.name} (workload {spec.workload}): parallel: {spec.parallel} needs a torch "
            f"nn.Module with parameters to wrap, got {got}"
        )
    if distributed is None:
        return model
    device = distributed.device
    model.to(device)
    if spec.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, process_group=distributed.group)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(distributed.group, device.type)
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)
    return fully_shard(model, mesh=mesh)
