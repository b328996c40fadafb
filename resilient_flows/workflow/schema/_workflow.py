"""The whole workflow file: its sections, the checks across them, and its members' and stages' specs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, PrivateAttr, ValidationInfo, model_validator

from resilient_flows.training import MemberSpec, StageSpec
from resilient_flows.workflow._yamlsource import YamlSource
from resilient_flows.workflow.schema._checks import (
    check_analytics,
    check_clones,
    check_faults,
    check_order,
    check_something_to_run,
)
from resilient_flows.workflow.schema._expansion import SpecBuilder, expand_member, families
from resilient_flows.workflow.schema._fields import STRICT, Name, dotted, workflow_directory
from resilient_flows.workflow.schema._models import (
    AnalyticsConfig,
    CheckpointSection,
    CloneConfig,
    CoschedConfig,
    ExploreConfig,
    FaultConfig,
    MemberConfig,
    ReportConfig,
    SiteConfig,
    StageConfig,
)


class Workflow(BaseModel):
    model_config = STRICT

    name: Name
    site: SiteConfig = SiteConfig(name="local")
    retries: Annotated[int, Field(ge=0)] = 2
    #: Stops in a row (exit 75, a preemption) without a newer committed checkpoint that cost no
    #: retry; each further one costs one of ``retries``.
    free_stops: Annotated[int, Field(ge=0)] = 3
    checkpoint: CheckpointSection = CheckpointSection()
    stages: list[StageConfig] = []
    members: list[MemberConfig] = []
    explore: list[ExploreConfig] = []
    faults: list[FaultConfig] = []
    clones: list[CloneConfig] = []
    analytics: list[AnalyticsConfig] = []
    cosched: CoschedConfig = CoschedConfig()
    report: ReportConfig = ReportConfig()
    monitoring: Annotated[
        bool,
        Field(
            description="record the run in Parsl's monitoring database, `<run>/parsl/monitoring.db`, for "
            "`parsl-visualize` (needs the `monitoring` extra); a resume adds to the same database"
        ),
    ] = False
    _directory: Path | None = PrivateAttr(default=None)  # the file's: where command members run
    _source: YamlSource | None = PrivateAttr(default=None)  # the file's text: the lines of its keys

    @model_validator(mode="after")
    def _remember_directory(self, info: ValidationInfo) -> Workflow:
        self._directory = workflow_directory(info)
        self._source = (info.context or {}).get("source")
        return self

    def locate(self, loc: tuple[Any, ...]) -> str:
        """``file:line: key`` of the key at ``loc``, as a schema error names it; the key alone in
        a workflow that was not read from a file (a run's plan)."""
        key = dotted(loc) or "workflow"
        return key if self._source is None else f"{self._source.path}:{self._source.line(loc)}: {key}"

    @model_validator(mode="after")
    def _cross_references(self) -> Workflow:
        check_something_to_run(self.members, self.explore, self.stages)
        names = [name for member in self.all_members() for name, _, _ in expand_member(member)]
        check_order(names, self.stages, self.members)
        check_faults(self.faults, names, [stage.name for stage in self.stages])
        specs = {spec.name: spec for spec in self.member_specs(None)}
        check_clones(self.clones, specs)
        check_analytics(self.analytics, names, sorted(name for name, spec in specs.items() if spec.command))
        return self

    def all_members(self) -> list[MemberConfig]:
        """The members as written, then each campaign's initial population."""
        return [member for _, member in families(self.members, self.explore)]

    def names_tier(self, tier: str) -> bool:
        """Whether any member's checkpointing names ``tier``."""
        return any(tier in (member.checkpoint or self.checkpoint).tiers for member in self.all_members())

    def member_specs(
        self,
        local_root: str | None,
        node_mtbf_s: float | None = None,
        stop_grace_s: float | None = None,
        memory_root: str | None = None,
        network_interface: str | None = None,
        peer_root: str | None = None,
        peer_capacity: int | None = None,
    ) -> list[MemberSpec]:
        """One spec per expanded member, with the site's facts (see :class:`SpecBuilder`)."""
        builder = SpecBuilder(
            self.checkpoint,
            self.faults,
            self._directory,
            local_root=local_root,
            node_mtbf_s=node_mtbf_s,
            stop_grace_s=stop_grace_s,
            memory_root=memory_root,
            network_interface=network_interface,
            peer_root=peer_root,
            peer_capacity=peer_capacity,
        )
        return [
            spec
            for family, member in families(self.members, self.explore)
            for spec in builder.member_specs(family, member)
        ]

    def stage_specs(self) -> list[StageSpec]:
        builder = SpecBuilder(self.checkpoint, self.faults, self._directory)
        return [builder.stage_spec(stage) for stage in self.stages]
