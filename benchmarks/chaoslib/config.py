"""What a chaos run is made of, shared by every part of the harness (and by ``goodput.py``, which
runs the same members): the kinds of fault each site gets, the ensemble's configuration and its
workflow, the facts of a site the harness needs, and the gate where held members wait.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
BENCH_DIR = Path(__file__).resolve().parents[1]
LOCAL_KINDS = (
    "worker-kill",
    "pool-kill",
    "manager-process-kill",
    "interchange-kill",
    "worker-stop",
    "runner-kill",
    "storage-full",
    "shard-flip",
)
SLURM_KINDS = (*LOCAL_KINDS, "pilot-cancel")
#: On ``local-nodes`` (three emulated nodes, each a block with its own node-local directories).
NODES_KINDS = (*LOCAL_KINDS, "node-loss")
#: On ``local-slurm-nodes`` (``--slurm-nodes N``: a Slurm cluster of N network namespaces), where a
#: lost node is one that crashed: every process of its namespace killed, its scratch gone.
SLURM_NODES_KINDS = (*SLURM_KINDS, "node-loss")
#: ``--slurm-nodes --peer``: members span two nodes, each keeping a copy of the other's shards.
PEER_KINDS = (*SLURM_NODES_KINDS, "node-and-buddy-loss")
#: Faults that take nodes with their node-local tiers.
NODE_LOSSES = ("node-loss", "node-and-buddy-loss")
KINDS = {
    "local": LOCAL_KINDS,
    "local-nodes": NODES_KINDS,
    "local-slurm": SLURM_KINDS,
    "local-slurm-nodes": SLURM_NODES_KINDS,
}
#: Where a held run's members find the gate that the harness opens once every fault struck.
GATE_ENV = "RESILIENT_FLOWS_CHAOS_GATE"
#: Seconds between two looks of the supervising loop (runner CPU and RSS, processes of the run).
LOOK_S = 0.5
#: Checkpoints a two-node member commits in its attempt before a node-loss may strike it: the
#: older one has surely been copied to its buddy.
PEER_CHECKPOINTS = 2
#: Members of a ``--walltime`` run last this many walltimes (paced members are slowed to it).
WALLTIME_MEMBER = 1.2


@dataclass(frozen=True)
class Config:
    """An ensemble and its chaos schedule."""

    members: int
    steps: int
    interval: int  # checkpoint interval, in steps
    params: dict[str, Any]
    workload: str = "mlp-digits"
    faults_per_kind: int = 1  # at most ``bursts``: a kind strikes at most once per burst
    bursts: int = 3
    stall_timeout_s: float = 10.0
    full_window_s: float = 4.0
    retries: int = 2
    judge_runner_cpu: bool = False  # the 1 % target is for 128 members of 5-second tasks
    span_s: float | None = None  # set: bursts over this many seconds, and no fault-free run (see ``cli.baseline``)
    hold: bool = False  # members wait at HOLD_AT of their steps until every fault struck (see ``paced``)
    peer_members: int = 0  # of ``members``, those that span two nodes with a peer tier (``--peer``)
    walltime_s: float | None = None  # every block's walltime (``--walltime``); None: the site's


MODES = {
    # paced members that leave the cores idle; their reference weights trained in this process
    "quick": Config(
        members=4,
        steps=300,
        interval=30,
        params={"hidden": 64, "pause_ms": 25},
        workload="chaos:paced",
        bursts=2,
        span_s=8.0,
        hold=True,
    ),
    "default": Config(
        members=128,
        steps=3000,
        interval=300,
        params={"hidden": 256},
        faults_per_kind=2,
        bursts=6,
        judge_runner_cpu=True,
    ),
    "full": Config(
        members=1000, steps=200, interval=40, params={"hidden": 64}, faults_per_kind=3, bursts=10, judge_runner_cpu=True
    ),
}


def workflow_yaml(config: Config, site: str, site_file: Path | None = None) -> str:
    """The workflow: a ``count`` family of members that differ only in their seed; with
    :attr:`Config.peer_members`, members ``m-I`` and ``p-I`` in turns, the ``p-`` ones spanning two
    nodes and keeping a copy of each other node's shards (``tiers: [local, peer, shared]``).
    ``site_file``: the run's copy of the site (:func:`harness_site`), named instead of ``site``."""
    single = config.members - config.peer_members
    stall = {"stall_timeout": f"{config.stall_timeout_s:g}s"}

    def entry(name: str, **fields: Any) -> dict[str, Any]:
        params = dict(config.params)  # each its own: YAML would write a shared one as an alias
        return {"name": name, "workload": config.workload, "steps": config.steps, "params": params, **fields, **stall}

    members = [entry("m", count=single)] if single else []
    if config.peer_members:
        # one entry per member, the families taking turns: a block runs two members at once, and
        # held members (see ``paced``) of one family would keep the other's faults from a target
        peer = {"interval": config.interval, "keep": 3, "tiers": ["local", "peer", "shared"]}
        members = []
        for i in range(max(single, config.peer_members)):
            if i < single:
                members.append(entry(f"m-{i}", seed=i))
            if i < config.peer_members:
                members.append(entry(f"p-{i}", seed=100 + i, nodes=2, checkpoint=peer))
    # on emulated nodes every other checkpoint stays on its node only: a lost node loses it
    node_local = {"persist_every": 2} if site in ("local-nodes", "local-slurm-nodes") else {}
    document = {
        "name": "chaos",
        "site": str(site_file) if site_file is not None else site,
        "retries": config.retries,
        "checkpoint": {"interval": config.interval, "keep": 3, **node_local},
        "members": members,
    }
    return yaml.safe_dump(document, sort_keys=False)


def walltime_site(site: str, walltime_s: float, directory: Path) -> Path:
    """A copy of ``site`` in ``directory`` whose blocks have this walltime: the provider's (Slurm's
    ``HH:MM:SS``) and the ``walltime`` fact, from which the runner drains them."""
    minutes = int(walltime_s // 60)
    text = (REPO / "site-configs" / f"{site}.yaml").read_text()
    limit = f'"{minutes // 60:02d}:{minutes % 60:02d}:00"'
    text, provider = re.subn(r'(?m)^( {4,}walltime: )"\d\d:\d\d:\d\d"', rf"\g<1>{limit}", text)
    text, fact = re.subn(r"(?m)^(  walltime: )\S+", rf"\g<1>{minutes}m", text)
    if (provider, fact) != (1, 1):
        raise ValueError(f"site {site}: expected one provider walltime and one walltime fact, found {provider}, {fact}")
    path = directory / f"{site}.yaml"
    path.write_text(text)
    return path


def harness_site(site: str, walltime_s: float | None, directory: Path) -> Path:
    """The copy of ``site`` in ``directory`` that a chaos run runs on: with blocks of ``walltime_s``
    where given (:func:`walltime_site`), and with a standby pool, where the site keeps one, from
    its first block's start (``standby_after: 0s``). A chaos run strikes within its first minute,
    which a long run's faults seldom do, and the standby's takeover is among what it measures."""
    if walltime_s is None:
        path = directory / f"{site}.yaml"
        path.write_text((REPO / "site-configs" / f"{site}.yaml").read_text())
    else:
        path = walltime_site(site, walltime_s, directory)
    path.write_text(path.read_text().replace("\nfacts:\n", "\nfacts:\n  standby_after: 0s\n", 1))
    return path


@dataclass(frozen=True)
class SiteFacts:
    """What the harness needs to know of a site: how fast Parsl notices a lost manager, and how
    many members it runs at once (its workers: a worker pool per block, up to ``max_blocks``)."""

    name: str
    heartbeat_threshold_s: float
    heartbeat_period_s: float
    workers: int = 1

    @classmethod
    def of(cls, name: str) -> SiteFacts:
        document = yaml.safe_load((REPO / "site-configs" / f"{name}.yaml").read_text())
        executor = document["executors"][0]  # Parsl's defaults where the site sets none
        per_pool = executor.get("max_workers_per_node", "auto")
        per_pool = os.cpu_count() or 1 if per_pool in (None, "auto") else int(per_pool)
        blocks = int(executor.get("provider", {}).get("max_blocks", 1))
        return cls(
            name,
            float(executor.get("heartbeat_threshold", 120)),
            float(executor.get("heartbeat_period", 30)),
            per_pool * blocks,
        )


def site_kinds(site: str, config: Config) -> tuple[str, ...]:
    """Every kind of fault for ``site``; with members spanning nodes, their buddies' loss too."""
    return PEER_KINDS if config.peer_members and site == "local-slurm-nodes" else KINDS[site]


def walltime_config(config: Config, walltime_s: float) -> Config:
    """``config`` for blocks of ``walltime_s``: paced members slowed to last
    :data:`WALLTIME_MEMBER` walltimes each, and not held at a gate, where they could not stop for a
    drain (the harness's wait sits inside a step)."""
    params = dict(config.params)
    if config.workload == "chaos:paced":
        params["pause_ms"] = max(params.get("pause_ms", 0), round(1000 * WALLTIME_MEMBER * walltime_s / config.steps))
    return replace(config, params=params, hold=False, walltime_s=walltime_s)


def gate_of(gate: Path, spanning: bool) -> Path:
    """The gate of a held run's members: spanning nodes or not (with ``--peer``, the node losses
    strike the former, every other kind the latter: each family is released once its faults struck)."""
    return gate.with_name(gate.name + ".spanning") if spanning else gate
