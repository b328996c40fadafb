"""What one ensemble member is, as a plain value that travels to a Parsl worker.

The workflow planner produces these from YAML; a worker receives one as a JSON-compatible dict,
so nothing on the worker side unpickles objects a workflow file described.
"""

from __future__ import annotations

import math
import os
import signal
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, get_args

from resilient_flows.checkpoint._config import CheckpointConfig
from resilient_flows.errors import WorkflowError

#: How a member's ranks share the model: replicated (DDP) or sharded (FSDP2).
ParallelMode = Literal["ddp", "fsdp"]
PARALLEL_MODES: tuple[ParallelMode, ...] = get_args(ParallelMode)


@dataclass(frozen=True)
class FaultSpec:
    """A fault injected once, on a member's first attempt, for demonstrations and tests.

    ``kill`` sends SIGKILL to the worker process, ``error`` raises an exception, ``preempt`` sends
    the worker SIGTERM as a batch system does before a walltime.
    """

    kind: str
    at_step: int

    def fire(self, where: str) -> None:
        """Hit this process now; ``where`` names the task and its step for the error."""
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "preempt":
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            raise RuntimeError(f"injected error in {where}")


#: Overrides of a clone that go into every optimizer parameter group (see :class:`ParentSpec`).
OPTIMIZER_KEYS = ("lr", "momentum", "weight_decay", "dampening", "betas", "eps", "alpha", "rho", "lr_decay")


@dataclass(frozen=True)
class ParentSpec:
    """Where a clone comes from: its source member, the request, and what it changes.

    ``overrides`` are applied after the source's state is restored: optimizer hyperparameters
    (``lr``, ``momentum``, ``weight_decay``, ...) go into every parameter group, ``seed`` and
    ``steps`` replace the member's, other keys replace the workload's ``params``.
    """

    member: str
    request: str
    overrides: dict[str, Any] = field(default_factory=dict)
    requested_at: float = 0.0


@dataclass(frozen=True)
class MemberSpec:
    """One ensemble member. ``inputs`` maps the stages it reads to their output directories,
    relative to the run directory (``ctx.inputs`` resolves them).

    ``ranks`` processes train it data-parallel; ``parallel`` says how ``ctx.wrap`` shares the
    model between them (``ddp`` or ``fsdp``), and has no effect on one rank, so that a resume
    with another rank count needs no other change. ``nodes`` spreads the ranks evenly over that
    many nodes (``ranks`` is the total, a multiple of ``nodes``), started by ``srun`` in a Slurm
    block; ``network_interface`` is the site's interface between nodes (``GLOO_SOCKET_IFNAME``).
    ``min_nodes`` (None: ``nodes``) is the fewest nodes it may shrink to when its block lost some:
    an attempt there runs at once on the nodes left, ``ranks_per_node`` on each (see
    :mod:`resilient_flows.training._shrink`), rather than waiting for a new block.

    ``family`` is the workflow entry it was expanded from (a ``count``/``seeds``/``grid`` member, a
    campaign; clones inherit their source's): views of large runs group members by it.
    ``checkpoint`` is the member's whole checkpoint configuration, its node-local tiers placed by
    the planner (their paths may name the node, ``${VAR}``, expanded where the member runs).
    ``stall_timeout_s``: how long a running attempt may stay silent (no heartbeat) before the
    runner declares it lost; None leaves it to the runner (10x its step time, at least the site's).

    ``workdir`` is the workflow file's directory: a ``module:function`` workload is imported from
    it first (a module beside the workflow file needs no install), and a command runs in it.
    A command member runs ``command`` (an argv, placeholders already filled) instead of a
    workload, whose name is then empty; a stop signal forwarded to it is followed by SIGKILL after
    ``grace_s`` seconds (None: the default, 60 s).
    ``command_template`` is the command as the workflow wrote it, placeholders unfilled, so that a
    clone with other params gets its own command line.
    See :mod:`resilient_flows.training._contract` for what the command finds in its environment.
    """

    name: str
    workload: str
    params: dict[str, Any]
    seed: int = 0
    steps: int = 100
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    faults: tuple[FaultSpec, ...] = ()
    evaluate: str | None = None
    threads: int = 1
    ranks: int = 1
    parallel: str = "ddp"
    nodes: int = 1
    min_nodes: int | None = None
    network_interface: str | None = None
    parent: ParentSpec | None = None
    inputs: dict[str, str] = field(default_factory=dict)
    family: str = ""
    stall_timeout_s: float | None = None
    command: list[str] | None = None
    workdir: str | None = None
    grace_s: float | None = None
    command_template: list[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.ranks, int) or self.ranks < 1:
            raise WorkflowError(f"member {self.name!r} needs at least one rank, got ranks: {self.ranks}")
        if not isinstance(self.nodes, int) or self.nodes < 1 or self.ranks % self.nodes:
            raise WorkflowError(
                f"member {self.name!r}: ranks ({self.ranks}, the total) must be a multiple of nodes ({self.nodes})"
            )
        if self.min_nodes is not None and (
            not isinstance(self.min_nodes, int) or not 1 <= self.min_nodes <= self.nodes
        ):
            raise WorkflowError(
                f"member {self.name!r}: min_nodes must be between 1 and nodes ({self.nodes}), got {self.min_nodes!r}"
            )
        if self.parallel not in PARALLEL_MODES:
            raise WorkflowError(
                f"member {self.name!r}: parallel must be one of {', '.join(PARALLEL_MODES)}, got {self.parallel!r}"
            )

    @property
    def ranks_per_node(self) -> int:
        return self.ranks // self.nodes

    @property
    def trains_in_worker(self) -> bool:
        """Whether an attempt trains in its Parsl worker's own process (a one-rank workload
        member) rather than in processes the worker starts (a command, or ranks under a
        launcher): what decides its app, and whether its pools import torch ahead for it."""
        return not self.command and self.ranks == 1

    def with_ranks(self, ranks: int) -> MemberSpec:
        """This member on ``ranks`` ranks (a resume or clone of another size), on as many of its
        nodes as still take an equal share of them: 4 ranks on 2 nodes resized to 3 run on one.
        ``min_nodes`` stays, down to the new node count."""
        nodes = math.gcd(self.nodes, ranks)
        least = None if self.min_nodes is None else min(self.min_nodes, nodes)
        return replace(self, ranks=ranks, nodes=nodes, min_nodes=least)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "checkpoint": self.checkpoint.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemberSpec:
        values = dict(data)
        values["checkpoint"] = CheckpointConfig.from_dict(
            values.get("checkpoint", {}), f"member {data.get('name')!r}: checkpoint"
        )
        values["faults"] = tuple(FaultSpec(**f) for f in values.get("faults", ()))
        if values.get("parent") is not None:
            values["parent"] = ParentSpec(**values["parent"])
        return cls(**values)


@dataclass(frozen=True)
class StageSpec:
    """A workflow stage: a checkpointed array loop (``loop`` is ``module:function``) that runs
    before the members reading its output.

    It checkpoints every ``every_n`` iterations, or every ``every_s`` seconds; ``inputs`` maps the
    earlier stages it reads to their output directories, relative to the run directory; a
    fault's ``at_step`` is an iteration (it hits after the iteration ran, before its checkpoint).
    """

    name: str
    loop: str
    params: dict[str, Any] = field(default_factory=dict)
    every_n: int | None = 10
    every_s: float | None = None
    keep: int = 3
    inputs: dict[str, str] = field(default_factory=dict)
    faults: tuple[FaultSpec, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StageSpec:
        values = dict(data)
        values["faults"] = tuple(FaultSpec(**f) for f in values.get("faults", ()))
        return cls(**values)
