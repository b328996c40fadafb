"""The workflow file: typed, strict, and expanded into one :class:`MemberSpec` per ensemble member.

Unknown keys and wrong types are errors naming the key and its line (see :func:`load_workflow`).
Member names become directory names in the run directory, so they are restricted to a safe
alphabet; every other path a workflow names is resolved inside the run directory.
"""

from __future__ import annotations

import collections
import difflib
import itertools
import math
import random
import typing
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from resilient_flows.clone import check_overrides
from resilient_flows.cosched import BASELINES
from resilient_flows.errors import CloneError, WorkflowError
from resilient_flows.training.builtins import BUILTIN_WORKLOADS
from resilient_flows.training.command_line import check_command, fill_command
from resilient_flows.training.spec import PARALLEL_MODES, CheckpointSpec, FaultSpec, MemberSpec, StageSpec
from resilient_flows.training.stage import stage_output
from resilient_flows.units import parse_duration
from resilient_flows.workflow.yamlsource import YamlSource

__all__ = [
    "AnalyticsConfig",
    "CheckpointConfig",
    "CloneConfig",
    "ExploreConfig",
    "FaultConfig",
    "HyperparameterSpace",
    "MemberConfig",
    "StageConfig",
    "Workflow",
    "load_workflow",
]

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
FAULT_KINDS = ("kill", "preempt", "error")
#: Checkpoint tiers a workflow may name, fastest first: node memory, node-local disk, shared file system.
TIERS = ("memory", "local", "shared")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: Steps between checkpoints while ``interval: auto`` measures what a checkpoint costs.
AUTO_WARMUP_STEPS = 10
#: Node MTBF for ``interval: auto`` when neither the workflow nor the site gives one: a workstation's year.
DEFAULT_NODE_MTBF_S = 365 * 86400.0


def _duration(value: Any, what: str) -> float:
    try:
        return parse_duration(value, what)
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def _positive_duration(value: Any, what: str) -> float:
    seconds = _duration(value, what)
    if seconds <= 0:
        raise ValueError(f"{what} must be positive, got {value!r}")
    return seconds


def check_workload(value: str) -> str:
    """``value`` if it names a built-in workload or a ``module:function``."""
    module, _, function = value.partition(":")
    if value not in BUILTIN_WORKLOADS and not (module and function):
        raise ValueError(
            f"unknown workload {value!r}: a built-in ({', '.join(BUILTIN_WORKLOADS)}) or 'module:function'"
        )
    return value


def check_one_way_to_run(what: str, workload: str | None, command: list[str] | str | None) -> None:
    """Exactly one of ``workload`` and ``command``; ``what`` names the member or campaign."""
    choice = "give 'workload' (a training function) or 'command' (your own script)"
    if workload is not None and command is not None:
        raise ValueError(f"{what}: {choice}, not both")
    if workload is None and command is None:
        raise ValueError(f"{what}: {choice}")


def _directory(info: ValidationInfo) -> Path | None:
    """The workflow file's directory, which :func:`load_workflow` passes as validation context."""
    context = info.context or {}
    return context.get("directory")


class CheckpointConfig(_Strict):
    """``interval`` is a number of steps (``25``), a duration (``30s``) or ``auto``.

    ``auto`` checkpoints every ``AUTO_WARMUP_STEPS`` steps until the member has measured its own
    checkpoint stall, flush time and pace, then asks the checkpoint-interval recommender
    (:mod:`resilient_flows.mlc`) for the interval and ``persist_every``, with ``process_mtbf`` as
    the mean time between crashes and the site's ``node_mtbf`` (or ``node_mtbf`` here) between
    lost nodes.
    """

    interval: int | str = 10
    keep: Annotated[int, Field(ge=1)] = 3
    overlap: bool = False
    tiers: list[Literal["memory", "local", "shared"]] = ["local", "shared"]
    persist_every: Annotated[int, Field(ge=1)] | dict[Literal["local", "shared"], Annotated[int, Field(ge=1)]] = 1
    process_mtbf: int | str = "7d"
    node_mtbf: int | str | None = None

    @field_validator("interval")
    @classmethod
    def _interval(cls, value: int | str) -> int | str:
        if isinstance(value, int):
            if value < 1:
                raise ValueError("a step interval must be at least 1")
        elif value != "auto":
            _duration(value, "interval")
        return value

    @field_validator("process_mtbf", "node_mtbf")
    @classmethod
    def _mtbf(cls, value: int | str | None, info: ValidationInfo) -> int | str | None:
        if value is not None and _duration(value, info.field_name) <= 0:
            raise ValueError(f"{info.field_name} must be longer than 0 s")
        return value

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, value: list[str]) -> list[str]:
        if "shared" not in value:
            raise ValueError("'shared' must be among the tiers: a checkpoint must survive the node")
        if value != [tier for tier in TIERS if tier in value] or len(set(value)) != len(value):
            raise ValueError(f"tiers go fastest first, each once: a selection of {', '.join(TIERS)} in that order")
        return value

    @model_validator(mode="after")
    def _persist_every(self) -> CheckpointConfig:
        if isinstance(self.persist_every, dict):
            for tier in self.persist_every:
                if tier not in self.tiers[1:]:
                    raise ValueError(
                        f"persist_every names {tier!r}, which is not one of the tiers after the first "
                        f"({', '.join(self.tiers[1:])}): the first tier takes every checkpoint"
                    )
        return self

    def spec(
        self, local_dir: str | None, site_node_mtbf_s: float | None = None, memory_dir: str | None = None
    ) -> CheckpointSpec:
        """The member's checkpointing; a tier named here that the site lacks (``local_dir`` or
        ``memory_dir`` None) is left out, and the tier after it counts the checkpoints of the one
        before."""
        auto = self.interval == "auto"
        steps = AUTO_WARMUP_STEPS if auto else self.interval if isinstance(self.interval, int) else None
        seconds = None if auto or isinstance(self.interval, int) else _duration(self.interval, "interval")
        node = _duration(self.node_mtbf, "node_mtbf") if self.node_mtbf is not None else site_node_mtbf_s
        every = self.persist_every if isinstance(self.persist_every, dict) else {"shared": self.persist_every}
        memory = memory_dir if "memory" in self.tiers else None
        return CheckpointSpec(
            interval_steps=steps,
            interval_s=seconds,
            keep=self.keep,
            overlap=self.overlap,
            persist_every=every.get("shared", 1),
            local_every=every.get("local", 1) if memory else 1,
            local_dir=local_dir if "local" in self.tiers else None,
            memory_dir=memory,
            auto=auto,
            process_mtbf_s=_duration(self.process_mtbf, "process_mtbf"),
            node_mtbf_s=node if node is not None else DEFAULT_NODE_MTBF_S,
        )


class MemberConfig(_Strict):
    """One entry of ``members``; ``seeds``, ``count`` and ``grid`` expand it into several members.

    ``ranks`` processes (``mpiexec -n ranks``) train each member in one torch.distributed process
    group; ``parallel`` is how the built-in workloads and ``ctx.wrap`` share the model between
    them: ``ddp`` (replicated, gradients averaged; the default) or ``fsdp`` (FSDP2, sharded).
    ``nodes`` spreads them over that many nodes of a Slurm block (``srun``); ``ranks`` stays the
    total, a multiple of ``nodes``, and is one per node when only ``nodes`` is given.

    ``command`` (an argv list, or a string split like a shell would) runs a program instead of a
    ``workload``; ``{param}`` in it is filled from each member's params (and ``{name}``,
    ``{seed}``, ``{steps}``). ``grace`` is how long it has to exit after a forwarded stop signal.
    """

    name: Name
    workload: str | None  # required unless there is a command (see _workload_or_command)
    steps: Annotated[int, Field(ge=0)]
    params: dict[str, Any] = {}
    seed: int = 0
    seeds: list[int] | None = None
    count: Annotated[int, Field(ge=1)] | None = None
    grid: dict[str, list[Any]] | None = None
    command: str | list[str | int | float] | None = None
    grace: float | None = None  # seconds; None: the default of command members
    evaluate: str | None = None
    ranks: int = 1
    nodes: Annotated[int, Field(ge=1)] = 1
    parallel: Literal[PARALLEL_MODES] = "ddp"
    threads: Annotated[int, Field(ge=1)] = 1
    checkpoint: CheckpointConfig | None = None  # None: the workflow's
    after: list[Name] = []  # stages whose output it reads: it starts once they finished
    stall_timeout: float | None = None  # seconds of silence before an attempt is lost; None: the runner's rule

    @field_validator("stall_timeout", mode="before")
    @classmethod
    def _stall_timeout(cls, value: Any) -> float | None:
        return None if value is None else _positive_duration(value, "stall_timeout")

    @model_validator(mode="before")
    @classmethod
    def _workload_or_command(cls, data: Any) -> Any:
        """A member with a command needs no workload key; without either, ``workload`` is missing."""
        if isinstance(data, dict) and "command" in data and "workload" not in data:
            return {**data, "workload": None}
        return data

    @model_validator(mode="before")
    @classmethod
    def _a_rank_per_node(cls, data: Any) -> Any:
        """``nodes: 2`` alone means one rank on each: the common case needs no arithmetic."""
        if isinstance(data, dict) and "nodes" in data and "ranks" not in data:
            return {**data, "ranks": data["nodes"]}
        return data

    @field_validator("workload")
    @classmethod
    def _workload(cls, value: str | None) -> str | None:
        return None if value is None else check_workload(value)

    @field_validator("command")
    @classmethod
    def _command(cls, value: str | list[Any] | None, info: ValidationInfo) -> list[str] | None:
        if value is None or "params" not in info.data or "grid" not in info.data:
            return value  # params or grid failed: that error is the one to show
        names = {*info.data["params"], *(info.data["grid"] or {})}
        return check_command(value, names, info.data.get("name", "?"), _directory(info))

    @field_validator("grace", mode="before")
    @classmethod
    def _grace(cls, value: Any) -> float | None:
        return None if value is None else _positive_duration(value, "grace")

    @field_validator("ranks")
    @classmethod
    def _ranks(cls, value: int, info: ValidationInfo) -> int:
        if value < 1:
            raise ValueError(f"member {info.data.get('name', '?')!r} needs at least one rank, got ranks: {value}")
        return value

    @model_validator(mode="after")
    def _one_way_to_seed(self) -> MemberConfig:
        check_one_way_to_run(f"member {self.name!r}", self.workload, self.command)
        if self.command is not None:
            given = self._workload_only_settings()
            if given:
                raise ValueError(
                    f"member {self.name!r}: {', '.join(given)} apply to workloads; a command launches its own "
                    "ranks (put torchrun, srun or mpiexec in it)"
                )
        elif self.grace is not None:
            raise ValueError(f"member {self.name!r}: grace applies to command members only")
        if self.ranks % self.nodes:
            raise ValueError(
                f"member {self.name!r}: ranks ({self.ranks}, the total) must be a multiple of nodes ({self.nodes})"
            )
        if self.seeds is not None and self.count is not None:
            raise ValueError("give 'seeds' or 'count', not both")
        if self.grid is not None and any(not values for values in self.grid.values()):
            raise ValueError("every 'grid' entry needs at least one value")
        return self

    def _workload_only_settings(self) -> list[str]:
        """The workload-only keys whose values differ from their defaults.

        Judged by value, not by whether the key was written: the run's plan stores every field,
        defaults included, and must validate again when ``status`` or ``resume`` reads it.
        """
        fields = type(self).model_fields
        return [key for key in ("evaluate", "parallel", "ranks", "nodes") if getattr(self, key) != fields[key].default]

    def expand(self) -> list[tuple[str, int, dict[str, Any]]]:
        """(name, seed, params) per member: the grid's product times the seeds, in file order."""
        seeds = self.seeds or ([self.seed + i for i in range(self.count)] if self.count else [self.seed])
        keys = list(self.grid or {})
        points = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(self.grid or {}).values())]
        variants = [(seed, {**self.params, **point}) for point in points for seed in seeds]
        if len(variants) == 1:
            return [(self.name, *variants[0])]
        return [(f"{self.name}-{i}", seed, params) for i, (seed, params) in enumerate(variants)]


class StageConfig(_Strict):
    """A checkpointed array loop (a simulation, a preparation) that members or later stages read.

    ``loop`` is ``module:function``, called as ``function(ctx, output=..., inputs=..., **params)``
    with a :class:`resilient_flows.resilience.Context`; ``every`` is a number of iterations or a
    duration between checkpoints; ``after`` names earlier stages whose output it reads.
    """

    name: Name
    loop: str
    params: dict[str, Any] = {}
    every: int | str = 10
    keep: Annotated[int, Field(ge=1)] = 3
    after: list[Name] = []

    @field_validator("loop")
    @classmethod
    def _loop(cls, value: str) -> str:
        module, _, function = value.partition(":")
        if not (module and function):
            raise ValueError(f"loop must be 'module:function', got {value!r}")
        return value

    @field_validator("every")
    @classmethod
    def _every(cls, value: int | str) -> int | str:
        if isinstance(value, int):
            if value < 1:
                raise ValueError("an iteration interval must be at least 1")
        elif _duration(value, "every") <= 0:
            raise ValueError("every must be longer than 0 s")
        return value

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, Any]) -> dict[str, Any]:
        reserved = sorted(set(value) & {"ctx", "output", "inputs"})
        if reserved:
            raise ValueError(f"{', '.join(reserved)} are passed by the runner, not params")
        return value

    def spec(self) -> StageSpec:
        every_n = self.every if isinstance(self.every, int) else None
        every_s = None if every_n is not None else _duration(self.every, "every")
        inputs = {name: stage_output(name) for name in self.after}
        return StageSpec(self.name, self.loop, self.params, every_n, every_s, self.keep, inputs)


class FaultConfig(_Strict):
    """``{kill: m1, at_step: 30}``: on its first attempt, member m1 is killed after step 30 (a stage:
    after iteration 30)."""

    kill: str | None = None
    preempt: str | None = None
    error: str | None = None
    at_step: Annotated[int, Field(ge=0)]

    @model_validator(mode="after")
    def _one_kind(self) -> FaultConfig:
        given = [k for k in FAULT_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"name exactly one of {', '.join(FAULT_KINDS)} (the member to hit)")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in FAULT_KINDS if getattr(self, k) is not None)

    @property
    def member(self) -> str:
        return getattr(self, self.kind)


class CloneConfig(_Strict):
    """``{member: m0, at_step: 500, n: 2, overrides: [{lr: 0.01}, {lr: 0.1}]}``: fork m0 after step 500.

    ``ranks: M`` runs the clones on M ranks (FSDP or DDP as the source), resharding its state.
    """

    member: str
    at_step: Annotated[int, Field(ge=0)]
    n: Annotated[int, Field(ge=1)] = 1
    overrides: list[dict[str, Any]] | dict[str, Any] = {}
    ranks: Annotated[int, Field(ge=1)] | None = None


class HyperparameterSpace(_Strict):
    """``{values: [...]}`` (choices) or ``{range: [low, high], log: true}`` (continuous)."""

    values: Annotated[list[Any], Field(min_length=1)] | None = None
    range: tuple[float, float] | None = None
    log: bool = False

    @model_validator(mode="after")
    def _one_kind(self) -> HyperparameterSpace:
        if (self.values is None) == (self.range is None):
            raise ValueError("give 'values' (choices) or 'range' ([low, high]), not both")
        if self.range is not None:
            low, high = self.range
            if not low < high or (self.log and low <= 0):
                raise ValueError(f"range {list(self.range)} needs low < high (and low > 0 with log)")
        return self

    def grid(self) -> list[Any]:
        if self.values is None:
            raise ValueError("a grid needs 'values' for every hyperparameter")
        return list(self.values)

    def sample(self, rng: random.Random) -> Any:
        if self.values is not None:
            return rng.choice(self.values)
        low, high = self.range
        if self.log:
            return math.exp(rng.uniform(math.log(low), math.log(high)))
        return rng.uniform(low, high)

    def perturb(self, current: Any, rng: random.Random, factors: tuple[float, float]) -> Any:
        """Ray Tune's explore step: scale a continuous value, move a choice to a neighbour."""
        if self.values is not None:
            index = self.values.index(current) if current in self.values else 0
            return self.values[min(max(index + rng.choice((-1, 1)), 0), len(self.values) - 1)]
        low, high = self.range
        return min(max(float(current) * rng.choice(factors), low), high)


class ExploreConfig(_Strict):
    """A campaign: ``population`` members (``grid``: the grid's points) of one workload."""

    name: Name
    strategy: Literal["pbt", "random", "grid"]
    workload: str | None  # required unless there is a command
    steps: Annotated[int, Field(ge=1)]
    hyperparameters: Annotated[dict[str, HyperparameterSpace], Field(min_length=1)]
    params: dict[str, Any] = {}
    command: str | list[str | int | float] | None = None
    grace: float | None = None
    population: Annotated[int, Field(ge=2)] = 4
    interval: Annotated[int, Field(ge=1)] = 100
    fraction: Annotated[float, Field(gt=0, le=0.5)] = 0.25
    perturb: tuple[float, float] = (0.8, 1.2)
    resample_probability: Annotated[float, Field(ge=0, le=1)] = 0.25
    window: Annotated[int, Field(ge=1)] | None = None
    seed: int = 0
    threads: Annotated[int, Field(ge=1)] = 1

    @model_validator(mode="before")
    @classmethod
    def _workload_or_command(cls, data: Any) -> Any:
        return MemberConfig._workload_or_command(data)

    @field_validator("workload")
    @classmethod
    def _workload(cls, value: str | None) -> str | None:
        return None if value is None else check_workload(value)

    @field_validator("grace", mode="before")
    @classmethod
    def _grace(cls, value: Any) -> float | None:
        return None if value is None else _positive_duration(value, "grace")

    @field_validator("command")
    @classmethod
    def _command(cls, value: str | list[Any] | None, info: ValidationInfo) -> list[str] | None:
        if value is None or "params" not in info.data or "hyperparameters" not in info.data:
            return value
        names = {*info.data["params"], *info.data["hyperparameters"]}
        return check_command(value, names, info.data.get("name", "?"), _directory(info))

    @model_validator(mode="after")
    def _grid_needs_values(self) -> ExploreConfig:
        check_one_way_to_run(f"campaign {self.name!r}", self.workload, self.command)
        if self.strategy == "grid" and any(s.values is None for s in self.hyperparameters.values()):
            raise ValueError("strategy grid needs 'values' for every hyperparameter")
        if self.strategy == "pbt" and self.interval >= self.steps:
            raise ValueError(f"pbt interval {self.interval} must be shorter than steps {self.steps}")
        return self

    def members(self) -> list[MemberConfig]:
        from resilient_flows.workflow.explore import campaign_points

        return [
            MemberConfig(
                name=f"{self.name}-{i}",
                workload=self.workload,
                command=self.command,
                grace=self.grace,
                steps=self.steps,
                params={**self.params, **point},
                seed=self.seed + i,
                threads=self.threads,
            )
            for i, point in enumerate(campaign_points(self))
        ]


class AnalyticsWhen(_Strict):
    """Fire once ``member`` has logged step ``step``."""

    member: str
    step: Annotated[int, Field(ge=0)]


class AnalyticsConfig(_Strict):
    """Evaluate members' latest checkpoints while they keep training: ``after`` this long, or ``when``
    a member reaches a step.

    Without ``slots`` the request queues like any task. With ``slots``, it is on demand: it needs
    that many worker slots now, goes ahead of queued members, and when too few are free the
    workflow's ``cosched`` policy decides which members to preempt (they checkpoint, stop and are
    requeued) or how long it waits.
    """

    after: int | str | None = None
    when: AnalyticsWhen | None = None
    members: list[str] | Literal["all"] = "all"
    name: Name = "analytics"
    slots: Annotated[int, Field(ge=1)] | None = None
    duration: int | str = "60s"

    @field_validator("after", "duration")
    @classmethod
    def _durations(cls, value: int | str | None, info: ValidationInfo) -> int | str | None:
        if value is not None:
            _duration(value, info.field_name)
        return value

    @model_validator(mode="after")
    def _one_trigger(self) -> AnalyticsConfig:
        if (self.after is None) == (self.when is None):
            raise ValueError("give 'after' (a time) or 'when' (a member and a step), one of them")
        return self

    @property
    def after_s(self) -> float | None:
        return None if self.after is None else _duration(self.after, "after")

    @property
    def duration_s(self) -> float:
        return _duration(self.duration, "duration")


class CoschedConfig(_Strict):
    """How on-demand analytics make room: the policy of :func:`resilient_flows.cosched.decide` and its weights."""

    policy: str = "dp"
    alpha: Annotated[float, Field(ge=0)] = 1.0
    beta: Annotated[float, Field(ge=0)] = 1.0
    max_delay: int | str = "10m"

    @field_validator("policy")
    @classmethod
    def _policy(cls, value: str) -> str:
        allowed = ("dp", *BASELINES)  # every policy of decide() but the exhaustive reference
        if value not in allowed:
            raise ValueError(f"unknown policy {value!r}; one of {', '.join(allowed)}")
        return value

    @field_validator("max_delay")
    @classmethod
    def _max_delay(cls, value: int | str) -> int | str:
        _duration(value, "max_delay")
        return value

    @property
    def max_delay_s(self) -> float:
        return _duration(self.max_delay, "max_delay")


class ReportConfig(_Strict):
    """Where the report goes, relative to the run directory."""

    plot: str = "report/loss.png"
    summary: str = "report/summary.txt"

    @field_validator("plot", "summary")
    @classmethod
    def _inside(cls, value: str) -> str:
        return confined(value)


class Workflow(_Strict):
    name: Name
    site: str = "local"
    retries: Annotated[int, Field(ge=0)] = 2
    #: Stops in a row (exit 75, a preemption) without a newer committed checkpoint that cost no
    #: retry; each further one costs one of ``retries``.
    free_stops: Annotated[int, Field(ge=0)] = 3
    checkpoint: CheckpointConfig = CheckpointConfig()
    stages: list[StageConfig] = []
    members: list[MemberConfig] = []
    explore: list[ExploreConfig] = []
    faults: list[FaultConfig] = []
    clones: list[CloneConfig] = []
    analytics: list[AnalyticsConfig] = []
    cosched: CoschedConfig = CoschedConfig()
    report: ReportConfig = ReportConfig()
    _directory: Path | None = PrivateAttr(default=None)  # the file's: where command members run

    @model_validator(mode="after")
    def _remember_directory(self, info: ValidationInfo) -> Workflow:
        self._directory = _directory(info)
        return self

    def all_members(self) -> list[MemberConfig]:
        """The members as written, then each campaign's initial population."""
        return [member for _, member in self._families()]

    def names_tier(self, tier: str) -> bool:
        """Whether any member's checkpointing names ``tier``."""
        return any(tier in (member.checkpoint or self.checkpoint).tiers for _, member in self._families())

    def _families(self) -> list[tuple[str, MemberConfig]]:
        """Each member entry with the family its members belong to: its own name, or its campaign's."""
        return [
            *((member.name, member) for member in self.members),
            *((campaign.name, member) for campaign in self.explore for member in campaign.members()),
        ]

    @model_validator(mode="after")
    def _names(self) -> Workflow:
        if not self.members and not self.explore and not self.stages:
            raise ValueError("give 'members', 'stages' or an 'explore' campaign: there is nothing to run")
        names = [name for member in self.all_members() for name, _, _ in member.expand()]
        stages = [stage.name for stage in self.stages]
        duplicates = sorted(n for n, count in collections.Counter([*names, *stages]).items() if count > 1)
        if duplicates:
            raise ValueError(f"member and stage names must be unique; repeated: {', '.join(duplicates)}")
        for index, stage in enumerate(self.stages):
            unknown = [name for name in stage.after if name not in stages[:index]]
            if unknown:
                raise ValueError(
                    f"stage {stage.name!r} runs after {', '.join(map(repr, unknown))}, which must be a stage "
                    f"listed before it ({', '.join(stages[:index]) or 'none is'})"
                )
        for member in self.members:
            unknown = [name for name in member.after if name not in stages]
            if unknown:
                raise ValueError(
                    f"member {member.name!r} runs after {', '.join(map(repr, unknown))}, "
                    f"which is not a stage ({', '.join(stages) or 'there are none'})"
                )
        known = {*names, *stages}
        for fault in self.faults:
            if fault.member not in known:
                raise ValueError(
                    f"fault names {fault.member!r}, which is not one of the members or stages "
                    f"{', '.join([*names, *stages])}"
                )
        specs = {spec.name: spec for spec in self.member_specs(None)}
        commands = sorted(name for name, spec in specs.items() if spec.command)
        for clone in self.clones:
            if clone.member not in specs:
                raise ValueError(f"clone names member {clone.member!r}, which is not one of {', '.join(names)}")
            per_clone = clone.overrides if isinstance(clone.overrides, list) else [clone.overrides] * clone.n
            if len(per_clone) != clone.n:
                raise ValueError(f"{len(per_clone)} sets of overrides for {clone.n} clones")
            try:
                check_overrides(specs[clone.member], per_clone)
            except CloneError as exc:
                raise ValueError(str(exc)) from None
        for request in self.analytics:
            unknown = [] if request.members == "all" else sorted(set(request.members) - set(names))
            if unknown:
                raise ValueError(f"analytics names unknown members {', '.join(unknown)}")
            chosen = names if request.members == "all" else request.members
            evaluated = [name for name in chosen if name in commands]
            if evaluated:
                raise ValueError(
                    f"analytics {request.name!r} would evaluate command members ({', '.join(evaluated)}), "
                    "which have no evaluate function: list the workload members under 'members'"
                )
            if request.when is not None and request.when.member not in names:
                raise ValueError(
                    f"analytics {request.name!r} waits for member {request.when.member!r}, "
                    f"which is not one of {', '.join(names)}"
                )
        return self

    def member_specs(
        self,
        local_root: str | None,
        node_mtbf_s: float | None = None,
        stop_grace_s: float | None = None,
        memory_root: str | None = None,
        network_interface: str | None = None,
    ) -> list[MemberSpec]:
        """One spec per expanded member; ``local_root`` is this run's directory on node-local scratch
        (``memory_root`` in node memory), ``node_mtbf_s`` the site's node MTBF (for ``interval:
        auto``), ``stop_grace_s`` the site's grace for command members that name none,
        ``network_interface`` the site's interface between nodes (members of several ranks)."""
        specs = []
        for family, member in self._families():
            for name, seed, params in member.expand():
                local = None if local_root is None else str(PurePosixPath(local_root) / name)
                memory = None if memory_root is None else str(PurePosixPath(memory_root) / name)
                faults = tuple(FaultSpec(f.kind, f.at_step) for f in self.faults if f.member == name)
                command = None
                if member.command is not None:
                    values = {**params, "name": name, "seed": seed, "steps": member.steps}
                    command = fill_command(list(member.command), values, self._directory)
                specs.append(
                    MemberSpec(
                        name=name,
                        workload=member.workload or "",
                        command=command,
                        command_template=None if command is None else list(member.command),
                        workdir=None if command is None or self._directory is None else str(self._directory),
                        grace_s=None if command is None else member.grace or stop_grace_s,
                        params=params,
                        seed=seed,
                        steps=member.steps,
                        checkpoint=(member.checkpoint or self.checkpoint).spec(local, node_mtbf_s, memory),
                        faults=faults,
                        evaluate=member.evaluate,
                        threads=member.threads,
                        ranks=member.ranks,
                        nodes=member.nodes,
                        network_interface=network_interface,
                        parallel=member.parallel,
                        inputs={stage: stage_output(stage) for stage in member.after},
                        family=family,
                        stall_timeout_s=member.stall_timeout,
                    )
                )
        return specs

    def stage_specs(self) -> list[StageSpec]:
        return [
            replace(
                stage.spec(), faults=tuple(FaultSpec(f.kind, f.at_step) for f in self.faults if f.member == stage.name)
            )
            for stage in self.stages
        ]


def confined(value: str) -> str:
    """``value`` as a relative path that cannot leave the directory it is resolved in."""
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ValueError(f"path {value!r} must be relative and stay inside the run directory")
    return value


def load_workflow(path: str | Path) -> Workflow:
    """The workflow in ``path``; a :class:`WorkflowError` naming the line and key of the first problem."""
    source = YamlSource.read(path)
    return parse_workflow(source)


def parse_workflow(source: YamlSource) -> Workflow:
    if not isinstance(source.data, dict):
        raise WorkflowError(f"{source.path}: expected a mapping with 'name' and 'members'")
    try:
        return Workflow.model_validate(source.data, context={"directory": Path(source.path).resolve().parent})
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: (e["type"] != "extra_forbidden", source.line(tuple(e["loc"])) or 0))
        first = errors[0]
        loc = tuple(first["loc"])
        line = source.line(loc)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise WorkflowError(f"{source.path}:{line}: {_dotted(loc) or 'workflow'}: {_explain(first)}{more}") from None


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _explain(error: dict[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(tuple(error["loc"])[:-1])
        close = difflib.get_close_matches(str(error["loc"][-1]), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown key{hint}; allowed: {', '.join(allowed)}"
    if kind == "missing":
        if error["loc"][-1] == "workload":
            return "required key is missing; give 'workload' (a training function) or 'command' (your own script)"
        return "required key is missing"
    message = error["msg"]
    return message.removeprefix("Value error, ")


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at ``loc``: walk the models along the path, through lists and the keys of mappings."""
    model: Any = Workflow
    keyed = False  # the next part is a key of a mapping (a hyperparameter's name), not a field
    for part in loc:
        if isinstance(part, int) or keyed:
            keyed = False
            continue
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return []
        keyed = _is_mapping(field.annotation)
        model = _model_in(field.annotation)
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def _is_mapping(annotation: Any) -> bool:
    return typing.get_origin(annotation) is dict or any(_is_mapping(arg) for arg in typing.get_args(annotation))


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def run_path(run_dir: Path, relative: str) -> Path:
    """``relative`` (already :func:`confined`) resolved in ``run_dir``."""
    return run_dir / confined(relative)
