"""What resilient-flows needs to know about a machine that Parsl does not: the ``facts:`` of a site.

A site file's top-level ``facts:`` mapping sits beside its Parsl configuration and never reaches
Parsl::

    facts:
      nodes: 2                      # nodes per block (one batch job) that members may span
      spare_nodes: 1                # more nodes per block, held in reserve: a member whose node
                                    # dies restarts on one at once, in the same block; default 0
      cores_per_node: 32            # or "auto": this machine's core count
      gpus_per_node: 4              # default 0
      local_scratch: /local/scratch # node-local disk: the local checkpoint tier; null if none
      shared_fs: /eagle/${PROJECT}  # the parallel file system: the shared tier; null if none
      node_mtbf: 1825d              # mean time between failures of one node; null if unknown
      walltime: "01:00:00"          # of one block: 6h, 90m or HH:MM:SS; null if unlimited; the runner
                                    # moves members to a fresh block before it (workflow._walltime)
      stall_timeout: 2m             # silence after which a running attempt is lost; default 60s
      stop_grace: 90s               # a command member's time to exit after a forwarded stop signal;
                                    # default 60s; a member's own grace: wins
      orphan_timeout: 5m            # a runner gone this long: its members checkpoint and stop, its
                                    # blocks are cancelled; default 5m
      network_interface: hsn0       # the nodes' interface for torch.distributed (GLOO_SOCKET_IFNAME);
                                    # default: the one the host name resolves to
      standby_after: 30s            # how long a run's first block runs before a standby pool starts
                                    # beside it (executors with standby_pool: true); 0s: at once;
                                    # default 30s

Durations take the units of :func:`resilient_flows.units.parse_duration` (s, m, h, d);
``walltime`` also takes Parsl's ``HH:MM:SS``, so a YAML anchor can share it with the provider.
String values expand ``${VAR}`` like the rest of the file (see :mod:`resilient_flows.sites._build`).
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from typing import Any

from resilient_flows.envvars import expand_env
from resilient_flows.errors import SiteConfigError
from resilient_flows.rundir import DEFAULT_ORPHAN_TIMEOUT_S, MIN_ORPHAN_TIMEOUT_S
from resilient_flows.units import parse_duration, parse_size

_REQUIRED = ("nodes", "cores_per_node")
_OPTIONAL = (
    "gpus_per_node",
    "local_scratch",
    "memory_scratch",
    "shared_fs",
    "node_mtbf",
    "walltime",
    "stall_timeout",
    "stop_grace",
    "orphan_timeout",
    "network_interface",
    "peer_memory",
    "spare_nodes",
    "standby_after",
)

#: Seconds a running attempt may stay silent before it is declared lost, unless the site says.
DEFAULT_STALL_TIMEOUT_S = 60.0
#: Seconds a run's first block runs before its standby pool starts, unless the site says.
DEFAULT_STANDBY_AFTER_S = 30.0


@dataclass(frozen=True)
class SiteFacts:
    """The machine behind a site, as its ``facts:`` describe it.

    ``node_mtbf_s`` and ``walltime_s`` are seconds, ``None`` when the site file says ``null``
    (unknown MTBF, no walltime limit). ``local_scratch``, ``memory_scratch`` (node memory as a
    file system, ``/dev/shm``: a checkpoint tier faster than the disk, for workflows that name the
    ``memory`` tier) and ``shared_fs`` are absolute paths or ``None`` when the machine has no such
    storage. ``stall_timeout_s`` is the least silence
    (no heartbeat) after which the runner declares an attempt lost (see
    :mod:`resilient_flows.workflow._watchdog`); a slow machine or file system wants more.
    ``stop_grace_s`` is how long a command member has to commit and exit after a forwarded stop
    signal before it is killed: set it below the time between the batch system's warning signal
    and its kill. ``None``: the launcher's default, unless the member says. ``orphan_timeout_s``
    is how long the runner may be gone before its members stop and its blocks are cancelled
    (see :mod:`resilient_flows.rundir._lease`). ``network_interface`` names the interface the
    nodes reach each other on, for members whose ranks span nodes (exported to them as
    ``GLOO_SOCKET_IFNAME``): a node with several networks otherwise leaves gloo to guess from
    its host name. ``None``: gloo's own choice. ``peer_memory`` bounds, in bytes per node, what a
    node keeps of other nodes' checkpoints in the ``peer`` tier (``None``: a quarter of the node's
    memory, measured where the member runs). ``spare_nodes``: nodes each block holds beyond
    ``nodes``, in reserve for the members of a node that dies (see :mod:`resilient_flows.sites._spares`).
    ``standby_after_s``: how long a run's first block runs before the runner starts a standby pool
    beside it (see :mod:`resilient_flows.workflow._standby`); 0: at once.
    """

    name: str
    nodes: int
    cores_per_node: int
    gpus_per_node: int = 0
    local_scratch: str | None = None
    memory_scratch: str | None = None
    shared_fs: str | None = None
    node_mtbf_s: float | None = None
    walltime_s: float | None = None
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    stop_grace_s: float | None = None
    orphan_timeout_s: float = DEFAULT_ORPHAN_TIMEOUT_S
    network_interface: str | None = None
    peer_memory: int | None = None
    spare_nodes: int = 0
    standby_after_s: float = DEFAULT_STANDBY_AFTER_S


def parse_facts(raw: Any, name: str, where: str) -> SiteFacts:
    """:class:`SiteFacts` from the ``facts`` mapping of the site file ``where``."""
    if not isinstance(raw, dict):
        raise SiteConfigError(
            f"{where}: needs a 'facts' mapping with {', '.join(_REQUIRED)} (optional: {', '.join(_OPTIONAL)})"
        )
    raw = expand_env(raw, where, "facts")
    allowed = _REQUIRED + _OPTIONAL
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SiteConfigError(f"{where}: facts: unknown key {key!r}{hint}; allowed: {', '.join(sorted(allowed))}")
    for key in _REQUIRED:
        if key not in raw:
            raise SiteConfigError(f"{where}: facts: missing {key!r}")

    cores = raw["cores_per_node"]
    return SiteFacts(
        name=name,
        nodes=count(raw["nodes"], "nodes", where, least=1),
        cores_per_node=(os.cpu_count() or 1) if cores == "auto" else count(cores, "cores_per_node", where, least=1),
        gpus_per_node=count(raw.get("gpus_per_node", 0), "gpus_per_node", where, least=0),
        local_scratch=_path(raw.get("local_scratch"), "local_scratch", where),
        memory_scratch=_path(raw.get("memory_scratch"), "memory_scratch", where),
        shared_fs=_path(raw.get("shared_fs"), "shared_fs", where),
        node_mtbf_s=_seconds(raw.get("node_mtbf"), "node_mtbf", where),
        walltime_s=_seconds(raw.get("walltime"), "walltime", where, clock=True),
        stall_timeout_s=_seconds(raw.get("stall_timeout"), "stall_timeout", where) or DEFAULT_STALL_TIMEOUT_S,
        stop_grace_s=_seconds(raw.get("stop_grace"), "stop_grace", where),
        orphan_timeout_s=_orphan_timeout(raw.get("orphan_timeout"), where),
        network_interface=_interface(raw.get("network_interface"), where),
        peer_memory=_size(raw.get("peer_memory"), "peer_memory", where),
        spare_nodes=count(raw.get("spare_nodes", 0), "spare_nodes", where, least=0),
        standby_after_s=_standby_after(raw.get("standby_after"), where),
    )


def _size(value: Any, key: str, where: str) -> int | None:
    if value is None:
        return None
    try:
        result = parse_size(value, f"facts.{key}")
    except ValueError as exc:
        raise SiteConfigError(f"{where}: facts.{key} must be a size like 8GiB or null: {exc}") from None
    if result <= 0:
        raise SiteConfigError(f"{where}: facts.{key} must be positive, got {value!r}")
    return result


def _orphan_timeout(value: Any, where: str) -> float:
    seconds = _seconds(value, "orphan_timeout", where)
    if seconds is None:
        return DEFAULT_ORPHAN_TIMEOUT_S
    if seconds < MIN_ORPHAN_TIMEOUT_S:
        raise SiteConfigError(
            f"{where}: facts.orphan_timeout must be at least {MIN_ORPHAN_TIMEOUT_S:g}s (two renewals of the "
            f"runner's lease), got {value!r}"
        )
    return seconds


def count(value: Any, key: str, where: str, least: int) -> int:
    """``value`` of ``facts.key``, an integer of at least ``least``; SiteConfigError naming the file otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        extra = " or 'auto'" if key == "cores_per_node" else ""
        raise SiteConfigError(f"{where}: facts.{key} must be an integer >= {least}{extra}, got {value!r}")
    return value


def _path(value: Any, key: str, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not os.path.isabs(value):
        raise SiteConfigError(f"{where}: facts.{key} must be an absolute path or null, got {value!r}")
    return value


def _interface(value: Any, where: str) -> str | None:
    """An interface name as the kernel spells it (``rf0``, ``hsn0``), or a comma-separated list of
    them as gloo takes it; anything else would only fail later, on the nodes."""
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[^\s,/:]{1,15}(,[^\s,/:]{1,15})*", value):
        raise SiteConfigError(
            f"{where}: facts.network_interface must be an interface name such as eth0 (or names, comma-separated) "
            f"or null, got {value!r}"
        )
    return value


def parse_clock(value: Any) -> float:
    """Seconds of a walltime: Parsl's ``HH:MM:SS``, or a duration like ``6h``; ValueError otherwise."""
    if isinstance(value, str) and value.count(":") == 2:
        hours, minutes, seconds = (int(part) for part in value.split(":"))
        return float(hours * 3600 + minutes * 60 + seconds)
    return parse_duration(value, "walltime")


def _standby_after(value: Any, where: str) -> float:
    """Seconds, zero included (a standby at once), the default where the site says nothing."""
    if value is None:
        return DEFAULT_STANDBY_AFTER_S
    try:
        return parse_duration(value, "facts.standby_after")
    except ValueError as exc:
        raise SiteConfigError(f"{where}: facts.standby_after must be a duration like 30s or 0s: {exc}") from None


def _seconds(value: Any, key: str, where: str, clock: bool = False) -> float | None:
    if value is None:
        return None
    try:
        result = parse_clock(value) if clock else parse_duration(value, f"facts.{key}")
    except ValueError as exc:
        form = "a duration like 6h or HH:MM:SS" if clock else "a duration like 1825d"
        raise SiteConfigError(f"{where}: facts.{key} must be {form} or null: {exc}") from None
    if result <= 0:
        raise SiteConfigError(f"{where}: facts.{key} must be positive, got {value!r}")
    return result
