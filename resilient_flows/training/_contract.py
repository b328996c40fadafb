"""The run contract: what a command member's process finds in its environment.

A member given as ``command:`` runs any program; resilient-flows tells it where it is and what to
do through these variables, a stable interface that scripts may read directly or through
:func:`resilient_flows.training.from_env`:

=====================================  ===========================================================
``RESILIENT_FLOWS_RUN_DIR``            the run directory (absolute)
``RESILIENT_FLOWS_MEMBER``             the member's name
``RESILIENT_FLOWS_CHECKPOINT_DIR``     the shared checkpoint tier: ``<run>/members/<name>/checkpoints``
``RESILIENT_FLOWS_CHECKPOINT``         the member's whole checkpoint configuration as JSON (a
                                       :class:`~resilient_flows.checkpoint.CheckpointConfig`:
                                       its tiers on this node, fastest first, with their paths
                                       and cadences, the interval, ``keep``)
``RESILIENT_FLOWS_ATTEMPT``            which attempt this is, 1 for the first
``RESILIENT_FLOWS_PARAMS``             the member's params as JSON, with ``seed`` and ``steps``
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

from resilient_flows.checkpoint._config import CheckpointConfig, TierSpec
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
    "checkpoint": f"{_PREFIX}CHECKPOINT",
    "attempt": f"{_PREFIX}ATTEMPT",
    "params": f"{_PREFIX}PARAMS",
}


def member_checkpoint(spec: MemberSpec, run_dir: str | os.PathLike) -> CheckpointConfig:
    """The member's checkpoint configuration on this node: its shared tier in the member's
    directory, its node-local paths expanded (a site may name the node in them, ``${VAR}``, so this
    runs where the member runs, never where it was planned), a peer tier's capacity decided."""
    where = f"member {spec.name}"
    root = member_layout(run_dir, spec.name).root.resolve()
    return spec.checkpoint.placed(root, lambda path: expand_env(path, where, "checkpoint tier path"))


@dataclass(frozen=True)
class RunContract:
    """One attempt of one member, as its process sees it (see the module's table).

    ``checkpoint`` is None for a process whose launcher set no configuration: it then checkpoints
    with the defaults to ``checkpoint_dir`` alone (see :meth:`checkpoint_config`)."""

    run_dir: Path
    member: str
    checkpoint_dir: Path
    attempt: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    checkpoint: CheckpointConfig | None = None

    @classmethod
    def for_member(cls, spec: MemberSpec, run_dir: str | os.PathLike, attempt: int) -> RunContract:
        """The contract of ``attempt`` of ``spec`` in ``run_dir``; call it where the member runs."""
        checkpoint = member_checkpoint(spec, run_dir)
        return cls(
            run_dir=Path(run_dir).resolve(),
            member=spec.name,
            checkpoint_dir=Path(checkpoint.shared.path),
            attempt=attempt,
            params={**spec.params, "seed": spec.seed, "steps": spec.steps},
            checkpoint=checkpoint,
        )

    def checkpoint_config(self) -> CheckpointConfig:
        """The configuration the member checkpoints with: the contract's, or the defaults' with
        one tier, ``checkpoint_dir``."""
        if self.checkpoint is not None:
            return self.checkpoint
        return CheckpointConfig(tiers=(TierSpec(str(self.checkpoint_dir), name="shared"),))

    def to_env(self) -> dict[str, str]:
        """The variables to add to the command's environment."""
        return {
            ENV_NAMES["run_dir"]: str(self.run_dir),
            ENV_NAMES["member"]: self.member,
            ENV_NAMES["checkpoint_dir"]: str(self.checkpoint_dir),
            ENV_NAMES["checkpoint"]: "" if self.checkpoint is None else self.checkpoint.to_json(),
            ENV_NAMES["attempt"]: str(self.attempt),
            ENV_NAMES["params"]: json.dumps(self.params),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RunContract:
        """The contract of this process; a :class:`WorkflowError` naming the first variable that is
        missing or malformed (a script started outside a workflow has none of them), or a
        :class:`~resilient_flows.errors.CheckpointConfigError` naming the variable and the field of
        a checkpoint configuration that is not one."""
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
        checkpoint, attempt = get("checkpoint", False), get("attempt", False)
        return cls(
            run_dir=Path(get("run_dir")),
            member=get("member"),
            checkpoint_dir=Path(get("checkpoint_dir")),
            attempt=_positive(attempt or "1", ENV_NAMES["attempt"]),
            params=params,
            checkpoint=CheckpointConfig.from_json(checkpoint, ENV_NAMES["checkpoint"]) if checkpoint else None,
        )


def _positive(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise WorkflowError(f"{name} must be a positive integer, got {text!r}")
    return value
