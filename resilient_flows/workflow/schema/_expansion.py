"""From the workflow's entries to what runs: one :class:`MemberSpec` per member, one
:class:`StageSpec` per stage.

A member entry with ``seeds``, ``count`` or ``grid`` stands for several members, and a campaign
for its initial population; each spec carries the family it came from, the checkpointing it
inherits, the faults aimed at it and the site's places (node-local and node-memory roots).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, cast

from resilient_flows.checkpoint._config import MEMBER_SHARED, CheckpointConfig, TierSpec
from resilient_flows.training import FaultSpec, MemberSpec, StageSpec, fill_command, stage_output
from resilient_flows.workflow.schema._fields import to_seconds
from resilient_flows.workflow.schema._models import (
    CheckpointSection,
    ExploreConfig,
    FaultConfig,
    MemberConfig,
    StageConfig,
)

#: Steps between checkpoints while ``interval: auto`` measures what a checkpoint costs.
AUTO_WARMUP_STEPS = 10
#: Node MTBF for ``interval: auto`` when neither the workflow nor the site gives one: a workstation's year.
DEFAULT_NODE_MTBF_S = 365 * 86400.0


def expand_member(member: MemberConfig) -> list[tuple[str, int, dict[str, Any]]]:
    """(name, seed, params) per member: the grid's product times the seeds, in file order."""
    seeds = member.seeds or ([member.seed + i for i in range(member.count)] if member.count else [member.seed])
    keys = list(member.grid or {})
    points = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(member.grid or {}).values())]
    variants = [(seed, {**member.params, **point}) for point in points for seed in seeds]
    if len(variants) == 1:
        return [(member.name, *variants[0])]
    return [(f"{member.name}-{i}", seed, params) for i, (seed, params) in enumerate(variants)]


def campaign_members(campaign: ExploreConfig) -> list[MemberConfig]:
    """The campaign's initial population, as member entries of one member each."""
    from resilient_flows.workflow._explore import campaign_points

    return [
        MemberConfig(
            name=f"{campaign.name}-{i}",
            workload=campaign.workload,
            command=campaign.command,
            grace=campaign.grace,
            steps=campaign.steps,
            params={**campaign.params, **point},
            seed=campaign.seed + i,
            threads=campaign.threads,
        )
        for i, point in enumerate(campaign_points(campaign))
    ]


def families(members: Sequence[MemberConfig], explore: Sequence[ExploreConfig]) -> list[tuple[str, MemberConfig]]:
    """Each member entry with the family its members belong to: its own name, or its campaign's."""
    return [
        *((member.name, member) for member in members),
        *((campaign.name, member) for campaign in explore for member in campaign_members(campaign)),
    ]


def checkpoint_config(
    section: CheckpointSection,
    local_dir: str | None,
    site_node_mtbf_s: float | None = None,
    memory_dir: str | None = None,
    peer_dir: str | None = None,
    peer_capacity: int | None = None,
) -> CheckpointConfig:
    """The member's checkpointing, its tiers placed on the site: the one conversion of a workflow's
    ``checkpoint:`` section. A tier named in ``section`` that the site lacks (``local_dir`` or
    ``memory_dir`` None) is left out, and the tier after it counts the checkpoints of the one
    before. A ``peer`` tier needs a node-local tier before it, that the site has; its capacity None
    is decided where the member runs. The shared tier is the member's own checkpoint directory."""
    auto = section.interval == "auto"
    steps = AUTO_WARMUP_STEPS if auto else section.interval if isinstance(section.interval, int) else None
    seconds = None if auto or isinstance(section.interval, int) else to_seconds(section.interval, "interval")
    node = to_seconds(section.node_mtbf, "node_mtbf") if section.node_mtbf is not None else site_node_mtbf_s
    every = section.persist_every if isinstance(section.persist_every, dict) else {"shared": section.persist_every}
    memory = memory_dir if "memory" in section.tiers else None
    local = local_dir if "local" in section.tiers else None
    peer = peer_dir if "peer" in section.tiers and (memory or local) else None
    tiers = [TierSpec(memory, name="memory")] if memory is not None else []
    if local is not None:
        tiers.append(TierSpec(local, every.get("local", 1) if tiers else 1, name="local"))
    if peer is not None:
        tiers.append(TierSpec(peer, name="peer", peer=True, capacity=peer_capacity))
    tiers.append(TierSpec(MEMBER_SHARED, every.get("shared", 1) if tiers else 1, name="shared"))
    return CheckpointConfig(
        tiers=tuple(tiers),
        interval_steps=steps,
        interval_s=seconds,
        keep=section.keep,
        overlap=section.overlap,
        auto=auto,
        process_mtbf_s=to_seconds(section.process_mtbf, "process_mtbf"),
        node_mtbf_s=node if node is not None else DEFAULT_NODE_MTBF_S,
    )


@dataclass(frozen=True)
class SpecBuilder:
    """What a member's or a stage's spec draws on besides its own entry: the workflow's checkpoint
    default, its faults and its file's directory (where command members run and workload modules
    are imported from first), and the site's facts.

    ``local_root`` is this run's directory on node-local scratch (``memory_root`` in node memory),
    ``node_mtbf_s`` the site's node MTBF (for ``interval: auto``), ``stop_grace_s`` the site's
    grace for command members that name none, ``network_interface`` the site's interface between
    nodes (members of several ranks), ``peer_root`` where nodes keep other nodes' copies (the
    ``peer`` tier) and ``peer_capacity`` its bound per node (None: decided where the member runs).
    """

    checkpoint: CheckpointSection
    faults: Sequence[FaultConfig]
    directory: Path | None
    local_root: str | None = None
    node_mtbf_s: float | None = None
    stop_grace_s: float | None = None
    memory_root: str | None = None
    network_interface: str | None = None
    peer_root: str | None = None
    peer_capacity: int | None = None

    def member_specs(self, family: str, member: MemberConfig) -> list[MemberSpec]:
        """A spec per member the entry ``member`` of ``family`` stands for."""
        return [self._member_spec(family, member, *expanded) for expanded in expand_member(member)]

    def stage_spec(self, stage: StageConfig) -> StageSpec:
        every_n = stage.every if isinstance(stage.every, int) else None
        every_s = None if every_n is not None else to_seconds(stage.every, "every")
        inputs = {name: stage_output(name) for name in stage.after}
        spec = StageSpec(stage.name, stage.loop, stage.params, every_n, every_s, stage.keep, inputs)
        return replace(spec, faults=self._faults(stage.name))

    def _faults(self, name: str) -> tuple[FaultSpec, ...]:
        return tuple(FaultSpec(f.kind, f.at_step) for f in self.faults if f.member == name)

    def _member_spec(
        self, family: str, member: MemberConfig, name: str, seed: int, params: dict[str, Any]
    ) -> MemberSpec:
        local = None if self.local_root is None else str(PurePosixPath(self.local_root) / name)
        memory = None if self.memory_root is None else str(PurePosixPath(self.memory_root) / name)
        peer = None if self.peer_root is None else str(PurePosixPath(self.peer_root) / name)
        command = argv = None
        if member.command is not None:
            argv = cast(list[str], member.command)  # validating the member made its command an argv
            values = {**params, "name": name, "seed": seed, "steps": member.steps}
            command = fill_command(list(argv), values, self.directory)
        return MemberSpec(
            name=name,
            workload=member.workload or "",
            command=command,
            command_template=None if argv is None else list(argv),
            workdir=None if self.directory is None else str(self.directory),
            grace_s=None if command is None else member.grace or self.stop_grace_s,
            params=params,
            seed=seed,
            steps=member.steps,
            checkpoint=checkpoint_config(
                member.checkpoint or self.checkpoint, local, self.node_mtbf_s, memory, peer, self.peer_capacity
            ),
            faults=self._faults(name),
            evaluate=member.evaluate,
            threads=member.threads,
            ranks=member.ranks,
            nodes=member.nodes,
            min_nodes=member.min_nodes,
            network_interface=self.network_interface,
            parallel=member.parallel,
            inputs={stage: stage_output(stage) for stage in member.after},
            family=family,
            stall_timeout_s=member.stall_timeout,
        )
