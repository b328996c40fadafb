"""Turn a site YAML, in Globus Compute's endpoint style, into a ``parsl.Config``.

Each mapping with a ``type:`` key names a Parsl class (an executor, provider or launcher); its
other keys are that class's constructor arguments, checked against its signature (the names,
and the types where the class annotates them) so that a typo is reported with the file, the key
and the allowed names instead of surfacing as a TypeError deep inside Parsl; ``validate`` builds
the configuration as ``run`` does, so both say the same line. Only the public classes
(``__all__``) of Parsl's executor, provider and launcher packages, the providers of
:mod:`resilient_flows.sites.cobalt` and the block error handler of
:mod:`resilient_flows.sites._blockerrors` (``block_error_handler: {type:
PatientBlockErrorHandler, patience_s: 300}``) can be named: a site file selects configuration,
it does not import arbitrary code.

Beyond its constructor's arguments, any provider takes ``status_polling_interval``: the seconds
between Parsl's looks at its blocks, which Parsl fixes per provider class (60 s for Slurm and PBS
Pro: a lost pilot job waits up to a minute for its replacement). A cluster whose scheduler is
cheap to ask, such as the local ones the tests start, sets a few seconds.

A ``HighThroughputExecutor`` also takes ``warm_workers`` (``true``/``false``, default false:
Parsl's own pool): its blocks then fork their workers from a server that imported torch,
resilient-flows and the run's workloads once (see :mod:`resilient_flows.sites._warmpool`), so
that a member retried after its worker died trains again within a fraction of a second. It
replaces the executor's ``launch_cmd``, so the two are not given together. With warm workers on a
``LocalProvider``, ``standby_pool: true`` keeps one more block started and preloaded, idle, that
takes over at once when a block's pool is lost (see :mod:`resilient_flows.workflow._standby`).
Only a workflow runner tells a waiting pool to go, so only its configuration has standby blocks
(``standby_blocks``): in a plain Parsl script (:func:`~resilient_flows.sites.load_site`) the same
site's pools are warm and start at once. Every ``HighThroughputExecutor``'s interchange starts
without Parsl's run-time type checks (see :mod:`resilient_flows.sites._typechecks`), unless the
site gives its own ``interchange_launch_cmd``.

String values may use the environment (``${NAME}``, ``${NAME:-default}``, ``${NAME:?hint}``,
``$${`` for a literal ``${``; see :mod:`resilient_flows.envvars`), so that one site file serves
every user of a machine. The top-level ``facts:`` mapping describes the
machine for resilient-flows (see :mod:`resilient_flows.sites._facts`) and never reaches Parsl.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import os
import typing
from typing import Any

import parsl.executors
import parsl.launchers
import parsl.providers
import typeguard
from parsl.config import Config
from parsl.executors.status_handling import BlockProviderExecutor
from parsl.jobs.error_handlers import simple_error_handler
from parsl.providers.base import ExecutionProvider

from resilient_flows.envvars import expand_env
from resilient_flows.errors import SiteConfigError
from resilient_flows.sites import cobalt
from resilient_flows.sites._blockerrors import PatientBlockErrorHandler
from resilient_flows.sites._parsl import DEFAULT_PRELOAD, interchange_launch_cmd, warm_launch_cmd

_NAMESPACES = (parsl.executors, parsl.providers, parsl.launchers, cobalt)
#: Our classes a site file names beside Parsl's (``block_error_handler: {type: ...}``).
_OURS = (PatientBlockErrorHandler,)
#: The key any provider takes beside its constructor's arguments (see the module's docstring).
POLL_KEY = "status_polling_interval"
#: The key a ``HighThroughputExecutor`` takes beside its constructor's arguments (see the module's docstring).
WARM_KEY = "warm_workers"
#: The key that gives a warm ``HighThroughputExecutor`` on a ``LocalProvider`` a standby block.
STANDBY_KEY = "standby_pool"


def _classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for module in _NAMESPACES:
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                found.setdefault(name, obj)
    for cls in _OURS:
        found.setdefault(cls.__name__, cls)
    return found


def build_config(data: dict[str, Any], where: str, *, standby_blocks: bool = False, **overrides: Any) -> Config:
    """A ``parsl.Config`` from a site mapping; ``overrides`` replace top-level Config arguments.
    Executors that ask for a ``standby_pool`` get standby blocks only with ``standby_blocks``, for
    a runner that activates them.

    The ``facts`` mapping is left out, and ``${...}`` references are expanded in everything else
    (not in ``overrides``, which are Python values already).
    """
    data = expand_env({k: v for k, v in data.items() if k != "facts"}, where)
    data.update(overrides)
    executors = data.pop("executors", None)
    if not isinstance(executors, list) or not executors:
        raise SiteConfigError(f"{where}: 'executors' must be a non-empty list of executor mappings")
    classes = _classes()
    built = [
        _build(spec, f"{where}: executors[{i}]", classes, standby_blocks=standby_blocks)
        for i, spec in enumerate(executors)
    ]
    for executor in built:
        _tolerate_lost_blocks(executor)
    _check_keys(Config, data, where, exclude={"executors"})
    return Config(executors=built, **data)


def _tolerate_lost_blocks(executor: Any) -> None:
    """A block that exits (a killed pool, a cancelled or preempted pilot job) or cannot start for a
    moment is replaced; the executor is given up only when blocks keep failing (see
    :mod:`resilient_flows.sites._blockerrors`). A handler the caller chose is kept."""
    if isinstance(executor, BlockProviderExecutor) and executor.block_error_handler is simple_error_handler:
        executor.block_error_handler = PatientBlockErrorHandler()


def _build(spec: Any, where: str, classes: dict[str, type], standby_blocks: bool = False) -> Any:
    if not isinstance(spec, dict) or "type" not in spec:
        raise SiteConfigError(f"{where}: expected a mapping with a 'type' key naming a Parsl class")
    spec = dict(spec)
    name = spec.pop("type")
    cls = classes.get(name)
    if cls is None:
        close = difflib.get_close_matches(str(name), classes, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise SiteConfigError(
            f"{where}: unknown type {name!r}{hint} (Parsl executors, providers and launchers, "
            "CobaltProvider and PatientBlockErrorHandler)"
        )
    provider = issubclass(cls, ExecutionProvider)
    poll_s = None
    if provider and POLL_KEY in spec:
        poll_s = _poll_seconds(spec.pop(POLL_KEY), f"{where} ({name}): {POLL_KEY}")
    warm = _warm(cls, spec, f"{where} ({name})")
    standby = _standby(spec, warm, f"{where} ({name})")
    _check_keys(cls, spec, f"{where} ({name})", extra={POLL_KEY} if provider else frozenset())
    args = {key: _value(key, value, f"{where}.{key}", classes) for key, value in spec.items()}
    if warm:
        args["launch_cmd"] = warm_launch_cmd(DEFAULT_PRELOAD, standby=standby and standby_blocks)
    if issubclass(cls, parsl.executors.HighThroughputExecutor):
        _lean_interchange(cls, args)
    _check_types(cls, args, f"{where} ({name})")
    try:
        built = cls(**args)
    except (TypeError, ValueError, typeguard.TypeCheckError) as exc:
        raise SiteConfigError(f"{where} ({name}): {exc}") from None
    if poll_s is not None:
        built.__class__ = _polled(cls, poll_s)
    return built


def _lean_interchange(cls: type, args: dict[str, Any]) -> None:
    """Start the executor's interchange without Parsl's run-time type checks (see the module's
    docstring), unless the site gives its own command or the class takes none as a list (Parsl's
    ``MPIExecutor`` annotates a string, which HTEX would run as one program's name: it keeps
    Parsl's command)."""
    lean = interchange_launch_cmd()
    if lean is None or "interchange_launch_cmd" in args:
        return
    try:
        _check_types(cls, {"interchange_launch_cmd": lean}, "")
    except SiteConfigError:
        return
    args["interchange_launch_cmd"] = lean


def _warm(cls: type, spec: dict[str, Any], where: str) -> bool:
    """Whether the executor ``spec`` (its ``warm_workers`` key taken out) asks for warm workers."""
    if WARM_KEY not in spec:
        return False
    value = spec.pop(WARM_KEY)
    if not issubclass(cls, parsl.executors.HighThroughputExecutor):
        raise SiteConfigError(f"{where}: {WARM_KEY} applies to a HighThroughputExecutor (its worker pool) only")
    if not isinstance(value, bool):
        raise SiteConfigError(f"{where}: {WARM_KEY} must be true or false, got {value!r}")
    if value and spec.get("launch_cmd"):
        raise SiteConfigError(f"{where}: {WARM_KEY} replaces launch_cmd: give one of them")
    return value


def _standby(spec: dict[str, Any], warm: bool, where: str) -> bool:
    """Whether the executor ``spec`` (its ``standby_pool`` key taken out) asks for a standby block:
    only warm pools can wait preloaded, and only on this machine is a spare block cheap."""
    if STANDBY_KEY not in spec:
        return False
    value = spec.pop(STANDBY_KEY)
    if not isinstance(value, bool):
        raise SiteConfigError(f"{where}: {STANDBY_KEY} must be true or false, got {value!r}")
    if not value:
        return False
    if not warm:
        raise SiteConfigError(f"{where}: {STANDBY_KEY} needs {WARM_KEY}: true (a standby waits preloaded)")
    provider = spec.get("provider")
    if not isinstance(provider, dict) or provider.get("type") != "LocalProvider":
        raise SiteConfigError(
            f"{where}: {STANDBY_KEY} applies to a LocalProvider's blocks only (elsewhere a standby is a batch job)"
        )
    return True


def _poll_seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise SiteConfigError(f"{where} must be a positive number of seconds, got {value!r}")
    return value


@functools.cache
def _polled(cls: type, seconds: float) -> type:
    """``cls`` polled every ``seconds``: Parsl's providers declare their interval as a property of
    the class, so a provider of a site that sets its own becomes an instance of this subclass,
    which differs in nothing else (its name, module and behaviour are ``cls``'s)."""
    namespace = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        POLL_KEY: property(lambda self: seconds, doc=f"Every {seconds:g} s, as the site file sets."),
    }
    return type(cls.__name__, (cls,), namespace)


def _value(key: str, value: Any, where: str, classes: dict[str, type]) -> Any:
    if isinstance(value, dict) and "type" in value:
        return _build(value, where, classes)
    if key == "max_workers_per_node" and value == "auto":
        return os.cpu_count() or 1
    return value


def _check_types(cls: type, args: dict[str, Any], where: str) -> None:
    """Each argument of a Parsl class of the type its parameter is annotated with, where it is
    annotated (ours check their own arguments, with messages that say what they are for)."""
    if not cls.__module__.startswith("parsl."):
        return
    try:
        hints = typing.get_type_hints(cls.__init__)
    except (NameError, TypeError, AttributeError):  # an annotation that does not resolve: Parsl checks it
        return
    for key, value in args.items():
        if key not in hints:
            continue
        try:
            typeguard.check_type(value, hints[key])
        except typeguard.TypeCheckError:
            expected = inspect.formatannotation(hints[key])
            raise SiteConfigError(f"{where}: {key} must be {expected}, got {value!r}") from None


def _check_keys(
    cls: type,
    spec: dict[str, Any],
    where: str,
    exclude: frozenset[str] | set[str] = frozenset(),
    extra: frozenset[str] | set[str] = frozenset(),
) -> None:
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = sorted({n for n in params if n not in exclude and n != "self"} | set(extra))
    for key in spec:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SiteConfigError(f"{where}: unknown key {key!r}{hint}; allowed: {', '.join(allowed)}")
