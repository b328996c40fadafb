"""The run contract: what a command member's process finds in its environment.

A member given as ``command:`` runs any program; resilient-flows tells it where it is and what to
do through these variables, a stable interface that scripts may read directly or through
:func:`resilient_flows.training.from_env`:

=====================================  ===========================================================
``RESILIENT_FLOWS_RUN_DIR``            the run directory (absolute)
``RESILIENT_FLOWS_MEMBER``             the member's name
``RESILIENT_FLOWS_CHECKPOINT_DIR``     the shared checkpoint tier: ``<run>/members/<name>/checkpoints``
``RESILIENT_FLOWS_LOCAL_DIR``          the node-local tier on this node; empty when there is none
``RESILIENT_FLOWS_MEMORY_DIR``         a tier in node memory before it (``/dev/shm``); empty when none
``RESILIENT_FLOWS_PEER_DIR``           where this node keeps other nodes' shards (the peer tier);
                                       empty when none
``RESILIENT_FLOWS_PEER_CAPACITY``      the peer tier's bound in bytes per node
``RESILIENT_FLOWS_ATTEMPT``            which attempt this is, 1 for the first
``RESILIENT_FLOWS_PARAMS``             the member's params as JSON, with ``seed`` and ``steps``
``RESILIENT_FLOWS_CHECKPOINT_INTERVAL`` steps between checkpoints; empty when the member
                                       checkpoints by time only
=====================================  ===========================================================

Exit status 75 (``EX_TEMPFAIL``) means "stopped after committing a checkpoint": the member is
requeued without spending a retry. Exit status 127 or 126 (a shell's "command not found" and "not
executable") means that the program could not be started: the member fails at once, since no
retry would find it. This module imports neither torch nor Parsl: the process that
launches a command sets the contract, the script reads it.

A command's params are its own business: they reach it as ``RESILIENT_FLOWS_PARAMS``. A workload
function (``workload: package.module:function``, called with a
:class:`~resilient_flows.training.TrainContext`) may declare the params it takes as an attribute,
``train.params = Params`` (a pydantic model or a dataclass: names, types, defaults); members
whose params it does not declare are refused by ``validate``, by ``run`` before anything is
queued, and by the member itself before it trains (see :mod:`resilient_flows.training._params`).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resilient_flows.envvars import expand_env
from resilient_flows.errors import WorkflowError
from resilient_flows.rundir import member_layout
from resilient_flows.training._spec import MemberSpec

#: The exit status of a member that stopped on request after committing a checkpoint
#: (``EX_TEMPFAIL`` from sysexits.h: try again later): requeued without spending a retry.
EXIT_PREEMPTED = 75

#: The exit status of a rank of a member on several ranks that saw a peer rank gone (its
#: connection closed or reset, or no answer within the group's keepalive): the machine's fault,
#: retried without spending a retry. ``EX_PROTOCOL`` from sysexits.h: the other end went away.
EXIT_PEER_LOST = 76

#: The exit statuses of a program that could not be started, as a shell reports it: found but not
#: executable (126), not found (127). The member fails at once: no retry would start it.
EXIT_CANNOT_RUN = (126, 127)

#: Signals a batch system sends before it stops a job (walltime, preemption): a member commits a
#: checkpoint at its next step boundary and exits with :data:`EXIT_PREEMPTED`.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

_PREFIX = "RESILIENT_FLOWS_"

#: The contract's variables by field of :class:`RunContract`.
ENV_NAMES = {
    "run_dir": f"{_PREFIX}RUN_DIR",
    "member": f"{_PREFIX}MEMBER",
    "checkpoint_dir": f"{_PREFIX}CHECKPOINT_DIR",
    "local_dir": f"{_PREFIX}LOCAL_DIR",
    "memory_dir": f"{_PREFIX}MEMORY_DIR",
    "peer_dir": f"{_PREFIX}PEER_DIR",
    "peer_capacity": f"{_PREFIX}PEER_CAPACITY",
    "attempt": f"{_PREFIX}ATTEMPT",
    "params": f"{_PREFIX}PARAMS",
    "checkpoint_interval": f"{_PREFIX}CHECKPOINT_INTERVAL",
}


def node_local_dir(spec: MemberSpec) -> str | None:
    """The member's node-local tier on this node: a site may name the node in it (``${VAR}``),
    so it is expanded where the member runs, never where it was planned."""
    local = spec.checkpoint.local_dir
    return None if local is None else expand_env(local, f"member {spec.name}", "node-local checkpoint directory")


def node_memory_dir(spec: MemberSpec) -> str | None:
    """The member's tier in node memory on this node, expanded where the member runs."""
    memory = spec.checkpoint.memory_dir
    return None if memory is None else expand_env(memory, f"member {spec.name}", "node-memory checkpoint directory")


def node_peer_dir(spec: MemberSpec) -> str | None:
    """Where this node keeps other nodes' copies of the member's shards, expanded where it runs."""
    peer = spec.checkpoint.peer_dir
    return None if peer is None else expand_env(peer, f"member {spec.name}", "peer checkpoint directory")


def peer_capacity(spec: MemberSpec) -> int:
    """The peer tier's bound per node: the site's ``peer_memory``, else a quarter of this node's
    memory, so that copies of other nodes' shards never crowd out the training itself."""
    if spec.checkpoint.peer_capacity is not None:
        return spec.checkpoint.peer_capacity
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


@dataclass(frozen=True)
class RunContract:
    """One attempt of one member, as its process sees it (see the module's table)."""

    run_dir: Path
    member: str
    checkpoint_dir: Path
    attempt: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    local_dir: Path | None = None
    checkpoint_interval: int | None = None
    memory_dir: Path | None = None
    peer_dir: Path | None = None
    peer_capacity: int | None = None

    @classmethod
    def for_member(cls, spec: MemberSpec, run_dir: str | os.PathLike, attempt: int) -> RunContract:
        """The contract of ``attempt`` of ``spec`` in ``run_dir``; call it where the member runs."""
        local, memory, peer = node_local_dir(spec), node_memory_dir(spec), node_peer_dir(spec)
        return cls(
            run_dir=Path(run_dir).resolve(),
            member=spec.name,
            checkpoint_dir=member_layout(run_dir, spec.name).checkpoints.resolve(),
            attempt=attempt,
            params={**spec.params, "seed": spec.seed, "steps": spec.steps},
            local_dir=None if local is None else Path(local),
            checkpoint_interval=spec.checkpoint.interval_steps,
            memory_dir=None if memory is None else Path(memory),
            peer_dir=None if peer is None else Path(peer),
            peer_capacity=None if peer is None else peer_capacity(spec),
        )

    def to_env(self) -> dict[str, str]:
        """The variables to add to the command's environment."""
        return {
            ENV_NAMES["run_dir"]: str(self.run_dir),
            ENV_NAMES["member"]: self.member,
            ENV_NAMES["checkpoint_dir"]: str(self.checkpoint_dir),
            ENV_NAMES["local_dir"]: "" if self.local_dir is None else str(self.local_dir),
            ENV_NAMES["memory_dir"]: "" if self.memory_dir is None else str(self.memory_dir),
            ENV_NAMES["peer_dir"]: "" if self.peer_dir is None else str(self.peer_dir),
            ENV_NAMES["peer_capacity"]: "" if self.peer_capacity is None else str(self.peer_capacity),
            ENV_NAMES["attempt"]: str(self.attempt),
            ENV_NAMES["params"]: json.dumps(self.params),
            ENV_NAMES["checkpoint_interval"]: "" if self.checkpoint_interval is None else str(self.checkpoint_interval),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RunContract:
        """The contract of this process; a :class:`WorkflowError` naming the first variable that is
        missing or malformed (a script started outside a workflow has none of them)."""
        env = os.environ if environ is None else environ

        def get(key: str, required: bool = True) -> str:
            value = env.get(ENV_NAMES[key], "")
            if required and not value:
                raise WorkflowError(
                    f"{ENV_NAMES[key]} is not set: this script expects to run as a workflow's command member"
                )
            return value

        try:
            params = json.loads(get("params", required=False) or "{}")
            if not isinstance(params, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            raise WorkflowError(f"{ENV_NAMES['params']} is not a JSON object of params ({exc})") from None
        local, interval, attempt = get("local_dir", False), get("checkpoint_interval", False), get("attempt", False)
        memory, peer, capacity = get("memory_dir", False), get("peer_dir", False), get("peer_capacity", False)
        return cls(
            run_dir=Path(get("run_dir")),
            member=get("member"),
            checkpoint_dir=Path(get("checkpoint_dir")),
            attempt=_positive(attempt or "1", ENV_NAMES["attempt"]),
            params=params,
            local_dir=Path(local) if local else None,
            checkpoint_interval=_positive(interval, ENV_NAMES["checkpoint_interval"]) if interval else None,
            memory_dir=Path(memory) if memory else None,
            peer_dir=Path(peer) if peer else None,
            peer_capacity=_positive(capacity, ENV_NAMES["peer_capacity"]) if capacity else None,
        )

    def checkpointer_settings(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~resilient_flows.checkpoint.Checkpointer` for this member's
        tiers: a list of them, fastest first, when there is a memory or a peer tier."""
        if self.memory_dir is None and self.peer_dir is None:
            return {"directory": self.checkpoint_dir, "local_dir": self.local_dir}
        peer = None if self.peer_dir is None else (self.peer_dir, self.peer_capacity)
        return {"tiers": member_tiers(self.checkpoint_dir, self.local_dir, self.memory_dir, peer=peer)}


def member_tiers(
    shared: str | os.PathLike,
    local: str | os.PathLike | None,
    memory: str | os.PathLike | None,
    local_every: int = 1,
    shared_every: int = 1,
    peer: tuple[str | os.PathLike, int | None] | None = None,
    buddies: Any = None,
) -> list[Any]:
    """A member's tiers as :class:`~resilient_flows.checkpoint.TierSpec`, fastest first, named as
    workflows name them (``memory``, ``local``, ``peer``, ``shared``); the first takes every
    checkpoint, the peer tier every one that reached the tier before it. ``peer`` is the peer
    tier's directory and bound per node, left out without a node-local tier before it;
    ``buddies`` how a member on one node reaches other nodes' services for it (a ``BuddyLink``)."""
    from resilient_flows.checkpoint import TierSpec  # imports torch: only where the member runs

    tiers = [TierSpec(memory, name="memory")] if memory is not None else []
    if local is not None:
        tiers.append(TierSpec(local, persist_every=local_every if tiers else 1, name="local"))
    if peer is not None and tiers:
        tiers.append(TierSpec(peer[0], name="peer", peer=True, capacity=peer[1], buddies=buddies))
    return [*tiers, TierSpec(shared, persist_every=shared_every if tiers else 1, name="shared")]


def _positive(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise WorkflowError(f"{name} must be a positive integer, got {text!r}")
    return value
