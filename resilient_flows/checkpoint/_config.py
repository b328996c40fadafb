"""One checkpoint configuration, the same value from a workflow's YAML to the :class:`Checkpointer`.

A workflow's ``checkpoint:`` section is validated into a :class:`CheckpointConfig` once, by the
planner, which also fills in the places the site gives a member (its node-local, node-memory and
peer directories). The member's spec carries that value whole, the run contract carries it whole
(as strict JSON, see :meth:`CheckpointConfig.to_json`), and the training side hands it to
``Checkpointer.from_config`` as it is: a new tier option is added here and nowhere in between.

Nothing here imports torch: the planner and the runner build and read these values.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resilient_flows.errors import CheckpointConfigError

if TYPE_CHECKING:
    from resilient_flows.checkpoint._registry import BuddyLink

#: The tier a member's configuration names by default: its own shared checkpoint directory,
#: relative to the member's directory in the run directory (see :meth:`CheckpointConfig.placed`).
MEMBER_SHARED = "checkpoints"


@dataclass(frozen=True)
class TierSpec:
    """One storage tier, in a list ordered fastest first.

    Parameters
    ----------
    path:
        The tier's directory. Every tier but the last is node-local (``/dev/shm/...``,
        ``/local/scratch/...``): each node keeps its own ranks' shards there. The last one is
        shared by every node (the parallel file system) and survives the job.
    persist_every:
        Every ``persist_every``-th checkpoint sent to the previous tier is also sent on to this
        one, in the background. The first tier gets every checkpoint (it must be 1 there).
    name:
        How messages and ``on_commit`` call the tier. Default: ``"local"`` for the first of
        several, ``"local-<index>"`` for the next node-local ones, ``"peer"`` for a peer tier,
        ``"shared"`` for the last.
    peer:
        A peer tier (between the node-local tiers and the shared one): a node-local directory,
        best in node memory, where each node keeps a copy of the shards of the previous node of
        a ring over the ranks' nodes. A member that loses a node restores that node's shards from
        its buddy instead of the shared tier. With one node there is no buddy, and the tier stays
        empty.
    capacity:
        A peer tier's bound, in bytes per node: each node keeps as many of its buddy's
        checkpoints as fit (at most ``keep``), and none when one does not fit. None in a member's
        configuration: a quarter of the memory of the node it runs on.
    buddies:
        A peer tier for ranks that all run on one node: how to reach the checkpoint transfer
        services of other nodes (:class:`~resilient_flows.checkpoint._registry.BuddyLink`). A fact
        of the running attempt, never part of the JSON form.
    """

    path: str | os.PathLike
    persist_every: int = 1
    name: str | None = None
    peer: bool = False
    capacity: int | None = None
    buddies: BuddyLink | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": os.fspath(self.path),
            "persist_every": self.persist_every,
            "name": self.name,
            "peer": self.peer,
            "capacity": self.capacity,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "tier") -> TierSpec:
        """A tier from its JSON form; a :class:`CheckpointConfigError` names an unknown option."""
        if not isinstance(data, Mapping):
            raise CheckpointConfigError(f"{where} must be an object of tier options, got {data!r}")
        known = {"path", "persist_every", "name", "peer", "capacity"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CheckpointConfigError(
                f"{where}: unknown tier option {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
        if "path" not in data:
            raise CheckpointConfigError(f"{where}.path is missing: every tier is a directory")
        return cls(**data)


@dataclass(frozen=True)
class CheckpointConfig:
    """When and where a member checkpoints: its tiers, fastest first, and its cadence.

    ``interval_steps`` and ``interval_s`` may both be set: whichever comes first triggers a
    checkpoint. ``keep`` committed checkpoints stay in each tier; ``overlap`` copies parameters
    and optimizer state behind the next forward/backward pass. With ``auto`` the member replaces
    both intervals and the last tier's ``persist_every`` by the recommender's choice once it has
    measured its checkpoints (failure rates from the two MTBFs).

    A relative tier path is relative to the member's directory (:meth:`placed`); the default is
    one shared tier, the member's own ``checkpoints`` directory. Every value is checked when the
    configuration is made: a :class:`CheckpointConfigError` names the field.
    """

    tiers: tuple[TierSpec, ...] = (TierSpec(MEMBER_SHARED, name="shared"),)
    interval_steps: int | None = 10
    interval_s: float | None = None
    keep: int = 3
    overlap: bool = False
    auto: bool = False
    process_mtbf_s: float | None = None
    node_mtbf_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tiers", check_tiers(self.tiers))
        check_positive_int("keep", self.keep)
        if self.interval_steps is not None:
            check_positive_int("interval_steps", self.interval_steps)
        for name in ("interval_s", "process_mtbf_s", "node_mtbf_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                raise CheckpointConfigError(f"{name} must be a number of seconds > 0, got {value!r}")
        for name in ("overlap", "auto"):
            if not isinstance(getattr(self, name), bool):
                raise CheckpointConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @property
    def shared(self) -> TierSpec:
        """The last tier: the one that survives the job."""
        return self.tiers[-1]

    def tier(self, name: str) -> TierSpec | None:
        return next((tier for tier in self.tiers if tier.name == name), None)

    def placed(
        self,
        member_dir: str | os.PathLike,
        expand: Callable[[str], str] = lambda path: path,
        node_memory: Callable[[], int] | None = None,
    ) -> CheckpointConfig:
        """This configuration where the member runs: relative paths under ``member_dir``, each
        path through ``expand`` (a site may name the node in a node-local path, ``${VAR}``), and a
        peer tier without a capacity bounded by a quarter of the node's memory (``node_memory``)."""
        memory = node_memory or _node_memory
        tiers = []
        for tier in self.tiers:
            path = Path(expand(os.fspath(tier.path)))
            path = path if path.is_absolute() else Path(member_dir) / path
            capacity = memory() // 4 if tier.peer and tier.capacity is None else tier.capacity
            tiers.append(replace(tier, path=str(path), capacity=capacity))
        return replace(self, tiers=tuple(tiers))

    def to_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**values, "tiers": [tier.to_dict() for tier in self.tiers]}

    @classmethod
    def from_dict(cls, data: Any, where: str = "checkpoint") -> CheckpointConfig:
        """A configuration from its JSON form; a :class:`CheckpointConfigError` names the first
        unknown or bad field (``where`` says what held it)."""
        if not isinstance(data, Mapping):
            raise CheckpointConfigError(f"{where} must be an object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CheckpointConfigError(f"{where}: unknown option {unknown[0]!r} (known: {', '.join(sorted(known))})")
        values = dict(data)
        if "tiers" in values:
            if not isinstance(values["tiers"], list | tuple):
                raise CheckpointConfigError(f"{where}.tiers must be a list of tiers, got {values['tiers']!r}")
            tiers = values["tiers"]
            values["tiers"] = tuple(TierSpec.from_dict(t, f"{where}.tiers[{i}]") for i, t in enumerate(tiers))
        try:
            return cls(**values)
        except CheckpointConfigError as exc:
            raise CheckpointConfigError(f"{where}: {exc}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str = "checkpoint") -> CheckpointConfig:
        """The configuration :meth:`to_json` wrote; strict JSON only (no NaN, no Infinity)."""
        try:
            data = json.loads(text, parse_constant=_refuse_constant)
        except ValueError as exc:
            raise CheckpointConfigError(f"{where} is not a JSON checkpoint configuration ({exc})") from None
        return cls.from_dict(data, where)


def check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointConfigError(f"{name} must be an integer >= 1, got {value!r}")


def check_tiers(tiers: Any) -> tuple[TierSpec, ...]:
    """``tiers`` as named :class:`TierSpec`, fastest first: a path alone is one tier, and every
    rule a list of tiers must follow is checked here, each failure naming the tier's field."""
    if isinstance(tiers, str | os.PathLike):
        tiers = [tiers]
    if not isinstance(tiers, Sequence) or not tiers:
        raise CheckpointConfigError(f"tiers must be a path or a non-empty list of TierSpec or paths, got {tiers!r}")
    specs = [tier if isinstance(tier, TierSpec) else _path_tier(tier, index) for index, tier in enumerate(tiers)]
    seen: dict[Path, int] = {}
    for index, spec in enumerate(specs):
        _check_tier(spec, index, len(specs))
        where = Path(spec.path).resolve()
        if where in seen:
            raise CheckpointConfigError(
                f"tiers[{index}].path and tiers[{seen[where]}].path are the same directory {where}"
            )
        seen[where] = index
    if sum(spec.peer for spec in specs) > 1:
        raise CheckpointConfigError("tiers: at most one peer tier, since each node keeps one buddy's copies")
    names = [spec.name or _tier_name(i, len(specs), spec.peer) for i, spec in enumerate(specs)]
    for index, name in enumerate(names):
        if names.index(name) != index:
            raise CheckpointConfigError(f"tiers[{index}].name {name!r} is also tiers[{names.index(name)}]'s")
    return tuple(replace(spec, name=name) for spec, name in zip(specs, names, strict=True))


def _path_tier(path: Any, index: int) -> TierSpec:
    if not isinstance(path, str | os.PathLike):
        raise CheckpointConfigError(f"tiers[{index}] must be a TierSpec or a path, got {path!r}")
    return TierSpec(path)


def _check_tier(spec: TierSpec, index: int, count: int) -> None:
    where = f"tiers[{index}]"
    if not isinstance(spec.path, str | os.PathLike) or not os.fspath(spec.path):
        raise CheckpointConfigError(f"{where}.path must be a directory, got {spec.path!r}")
    check_positive_int(f"{where}.persist_every", spec.persist_every)
    if index == 0 and spec.persist_every != 1:
        raise CheckpointConfigError(
            f"{where}.persist_every must be 1 (the first tier gets every save), got {spec.persist_every}"
        )
    if spec.name is not None and (not isinstance(spec.name, str) or not spec.name):
        raise CheckpointConfigError(f"{where}.name must be a non-empty string, got {spec.name!r}")
    if not isinstance(spec.peer, bool):
        raise CheckpointConfigError(f"{where}.peer must be true or false, got {spec.peer!r}")
    if spec.peer and not 0 < index < count - 1:
        raise CheckpointConfigError(
            f"{where} is a peer tier: it goes after a node-local tier and before the shared one, "
            "since it copies what the first tier committed and cannot outlive the nodes"
        )
    if spec.buddies is not None and not spec.peer:
        raise CheckpointConfigError(f"{where}.buddies reach other nodes' copies: only a peer tier has them")
    if spec.capacity is not None:
        if not spec.peer:
            raise CheckpointConfigError(f"{where}.capacity bounds a peer tier's bytes per node; this tier is no peer")
        check_positive_int(f"{where}.capacity", spec.capacity)


def _tier_name(index: int, count: int, peer: bool) -> str:
    if peer:
        return "peer"
    if index == count - 1:
        return "shared"
    return "local" if index == 0 else f"local-{index}"


def _node_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")
