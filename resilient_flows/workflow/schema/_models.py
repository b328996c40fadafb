"""The sections of a workflow file, each a strict pydantic model that checks its own fields.

Unknown keys and wrong types are errors; :mod:`~resilient_flows.workflow.schema._loading` names the
key and its line. What an entry turns into when the workflow runs is
:mod:`~resilient_flows.workflow.schema._expansion`'s business; what holds across sections is
:mod:`~resilient_flows.workflow.schema._checks`'.
"""

from __future__ import annotations

import math
import random
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from resilient_flows.cosched import BASELINES
from resilient_flows.sites import SiteOptions
from resilient_flows.training import STAGE_ARGUMENTS, check_command
from resilient_flows.training._spec import ParallelMode
from resilient_flows.workflow.schema._fields import (
    FAULT_KINDS,
    STRICT,
    TIERS,
    Name,
    check_one_way_to_run,
    check_workload,
    command_without_workload,
    confined,
    positive_seconds,
    to_seconds,
    workflow_directory,
)


class _Section(BaseModel):
    model_config = STRICT


class SiteConfig(SiteOptions):
    """``site: polaris``, or the site with its blocks' size, walltime, queue and account changed:
    ``site: {name: polaris, nodes: 4, walltime: 2h, queue: debug, account: MYPROJ}`` (see
    :mod:`resilient_flows.sites._options`). ``--site`` replaces the site and its options; ``--set``
    changes options of whichever site runs."""

    name: Annotated[str, Field(min_length=1)]

    @model_validator(mode="before")
    @classmethod
    def _just_a_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


class CheckpointSection(_Section):
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
    tiers: list[Literal["memory", "local", "peer", "shared"]] = ["local", "shared"]
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
            to_seconds(value, "interval")
        return value

    @field_validator("process_mtbf", "node_mtbf")
    @classmethod
    def _mtbf(cls, value: int | str | None, info: ValidationInfo) -> int | str | None:
        if value is not None and to_seconds(value, cast(str, info.field_name)) <= 0:  # a field validator's
            raise ValueError(f"{info.field_name} must be longer than 0 s")
        return value

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, value: list[str]) -> list[str]:
        if "shared" not in value:
            raise ValueError("'shared' must be among the tiers: a checkpoint must survive the node")
        if value != [tier for tier in TIERS if tier in value] or len(set(value)) != len(value):
            raise ValueError(f"tiers go fastest first, each once: a selection of {', '.join(TIERS)} in that order")
        if "peer" in value and not {"memory", "local"} & set(value):
            raise ValueError("'peer' copies what a node-local tier committed: name 'memory' or 'local' before it")
        return value

    @model_validator(mode="after")
    def _persist_every(self) -> CheckpointSection:
        if isinstance(self.persist_every, dict):
            for tier in self.persist_every:
                if tier not in self.tiers[1:]:
                    raise ValueError(
                        f"persist_every names {tier!r}, which is not one of the tiers after the first "
                        f"({', '.join(self.tiers[1:])}): the first tier takes every checkpoint"
                    )
        return self


class MemberConfig(_Section):
    """One entry of ``members``; ``seeds``, ``count`` and ``grid`` expand it into several members.

    ``ranks`` processes (``mpiexec -n ranks``) train each member in one torch.distributed process
    group; ``parallel`` is how the built-in workloads and ``ctx.wrap`` share the model between
    them: ``ddp`` (replicated, gradients averaged; the default) or ``fsdp`` (FSDP2, sharded).
    ``nodes`` spreads them over that many nodes of a Slurm block (``srun``); ``ranks`` stays the
    total, a multiple of ``nodes``, and is one per node when only ``nodes`` is given.
    ``min_nodes`` lets it shrink: when its block lost nodes and has fewer than ``nodes`` but at
    least ``min_nodes`` left, the retry runs at once on those, as many ranks per node, restoring its
    checkpoint resharded, instead of waiting for a new block.

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
    min_nodes: int | None = None  # None: it never shrinks
    parallel: ParallelMode = "ddp"
    threads: Annotated[int, Field(ge=1)] = 1
    checkpoint: CheckpointSection | None = None  # None: the workflow's
    after: list[Name] = []  # stages whose output it reads: it starts once they finished
    stall_timeout: float | None = None  # seconds of silence before an attempt is lost; None: the runner's rule

    @field_validator("stall_timeout", mode="before")
    @classmethod
    def _stall_timeout(cls, value: Any) -> float | None:
        return None if value is None else positive_seconds(value, "stall_timeout")

    @model_validator(mode="before")
    @classmethod
    def _workload_or_command(cls, data: Any) -> Any:
        return command_without_workload(data)

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
    def _command(cls, value: str | list[Any] | None, info: ValidationInfo) -> str | list[Any] | None:
        if value is None or "params" not in info.data or "grid" not in info.data:
            return value  # params or grid failed: that error is the one to show
        names = {*info.data["params"], *(info.data["grid"] or {})}
        return check_command(value, names, info.data.get("name", "?"), workflow_directory(info))

    @field_validator("grace", mode="before")
    @classmethod
    def _grace(cls, value: Any) -> float | None:
        return None if value is None else positive_seconds(value, "grace")

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
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            raise ValueError(
                f"member {self.name!r}: min_nodes ({self.min_nodes}) must be between 1 and nodes ({self.nodes}): "
                "the fewest nodes it may shrink to after a node loss"
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
        return [
            key
            for key in ("evaluate", "parallel", "ranks", "nodes", "min_nodes")
            if getattr(self, key) != fields[key].default
        ]


class StageConfig(_Section):
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
        elif to_seconds(value, "every") <= 0:
            raise ValueError("every must be longer than 0 s")
        return value

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, Any]) -> dict[str, Any]:
        reserved = sorted(set(value) & set(STAGE_ARGUMENTS))
        if reserved:
            raise ValueError(f"{', '.join(reserved)} are passed by the runner, not params")
        return value


class FaultConfig(_Section):
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


class CloneConfig(_Section):
    """``{member: m0, at_step: 500, n: 2, overrides: [{lr: 0.01}, {lr: 0.1}]}``: fork m0 after step 500.

    ``ranks: M`` runs the clones on M ranks (FSDP or DDP as the source), resharding its state.
    """

    member: str
    at_step: Annotated[int, Field(ge=0)]
    n: Annotated[int, Field(ge=1)] = 1
    overrides: list[dict[str, Any]] | dict[str, Any] = {}
    ranks: Annotated[int, Field(ge=1)] | None = None


class HyperparameterSpace(_Section):
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

    def _bounds(self) -> tuple[float, float]:
        """The range, which the validator makes sure of where there are no values."""
        if self.range is None:
            raise ValueError("a hyperparameter needs 'values' or 'range'")
        return self.range

    def grid(self) -> list[Any]:
        if self.values is None:
            raise ValueError("a grid needs 'values' for every hyperparameter")
        return list(self.values)

    def sample(self, rng: random.Random) -> Any:
        if self.values is not None:
            return rng.choice(self.values)
        low, high = self._bounds()
        if self.log:
            return math.exp(rng.uniform(math.log(low), math.log(high)))
        return rng.uniform(low, high)

    def perturb(self, current: Any, rng: random.Random, factors: tuple[float, float]) -> Any:
        """Ray Tune's explore step: scale a continuous value, move a choice to a neighbour."""
        if self.values is not None:
            index = self.values.index(current) if current in self.values else 0
            return self.values[min(max(index + rng.choice((-1, 1)), 0), len(self.values) - 1)]
        low, high = self._bounds()
        return min(max(float(current) * rng.choice(factors), low), high)


class ExploreConfig(_Section):
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
        return command_without_workload(data)

    @field_validator("workload")
    @classmethod
    def _workload(cls, value: str | None) -> str | None:
        return None if value is None else check_workload(value)

    @field_validator("grace", mode="before")
    @classmethod
    def _grace(cls, value: Any) -> float | None:
        return None if value is None else positive_seconds(value, "grace")

    @field_validator("command")
    @classmethod
    def _command(cls, value: str | list[Any] | None, info: ValidationInfo) -> str | list[Any] | None:
        if value is None or "params" not in info.data or "hyperparameters" not in info.data:
            return value
        names = {*info.data["params"], *info.data["hyperparameters"]}
        return check_command(value, names, info.data.get("name", "?"), workflow_directory(info))

    @model_validator(mode="after")
    def _grid_needs_values(self) -> ExploreConfig:
        check_one_way_to_run(f"campaign {self.name!r}", self.workload, self.command)
        if self.strategy == "grid" and any(s.values is None for s in self.hyperparameters.values()):
            raise ValueError("strategy grid needs 'values' for every hyperparameter")
        if self.strategy == "pbt" and self.interval >= self.steps:
            raise ValueError(f"pbt interval {self.interval} must be shorter than steps {self.steps}")
        return self


class AnalyticsWhen(_Section):
    """Fire once ``member`` has logged step ``step``."""

    member: str
    step: Annotated[int, Field(ge=0)]


class AnalyticsConfig(_Section):
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
            to_seconds(value, cast(str, info.field_name))  # set for a field validator
        return value

    @model_validator(mode="after")
    def _one_trigger(self) -> AnalyticsConfig:
        if (self.after is None) == (self.when is None):
            raise ValueError("give 'after' (a time) or 'when' (a member and a step), one of them")
        return self

    @property
    def after_s(self) -> float | None:
        return None if self.after is None else to_seconds(self.after, "after")

    @property
    def duration_s(self) -> float:
        return to_seconds(self.duration, "duration")


class CoschedConfig(_Section):
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
        to_seconds(value, "max_delay")
        return value

    @property
    def max_delay_s(self) -> float:
        return to_seconds(self.max_delay, "max_delay")


class ReportConfig(_Section):
    """Where the report goes, relative to the run directory."""

    plot: str = "report/loss.png"
    summary: str = "report/summary.txt"
    #: The dashboard as a page that needs no server; its assets go beside it, in ``assets/``.
    page: str = "report/index.html"

    @field_validator("plot", "summary", "page")
    @classmethod
    def _inside(cls, value: str) -> str:
        return confined(value)
