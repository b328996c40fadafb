"""Chaos harness: an ensemble of deterministic members under many faults at once, from outside.

A workflow of N members (default 128 of about 5 s each on a 2-core machine; ``--full``: 1,000 with
tiny steps) runs twice through the real ``resilient-flows`` command, on the ``local`` site
(``--slurm``: ``local-slurm``, a one-node Slurm cluster, started with ``.ci/slurm-up`` when none
answers and stopped afterwards; ``--slurm-nodes N``: ``local-slurm-nodes``, a cluster of N nodes
in network namespaces that ``.ci/slurm-up --nodes N`` starts for the run, blocks of two nodes,
node-local scratch per node): first without faults (the reference), then under a seeded chaos
schedule. Every member trains the same weights whatever happens to it, so the run passes only if
every member's final digest (``members/<name>/result.json``) equals the reference's. ``--quick``
runs 4 paced members (:func:`paced`: a short step, then a pause) under two bursts over 8 s, and
trains their reference weights in this process: it has no fault-free run to compare wall time
and runner CPU with.

The schedule (``--seed``) spreads bursts of faults over the first 60 % of the reference's
training time, counted from the chaos run's first checkpoint. A burst strikes several faults at
once, each from its own thread, from outside the processes as an operator or a failing machine
would. Targets are found by walking ``/proc`` and ``<run_dir>/heartbeats``, restricted to this
run (pools whose command line holds the run's ``parsl/`` directory, their spawned processes, our
runners' interchanges); a fault without a target waits for one for up to 90 s (as long as the run
lasts in ``--quick`` runs, whose members wait for every fault to strike):

``worker-kill``           SIGKILL of a worker that runs a member;
``pool-kill``             SIGKILL of a worker pool (``process_worker_pool.py``, the HTEX manager);
``manager-process-kill``  SIGKILL of a pool's multiprocessing manager process (its oldest spawned
                          child): the pool's main thread dies, its heartbeat thread lives on;
``interchange-kill``      SIGKILL of the runner's interchange;
``worker-stop``           SIGSTOP of a busy worker for the site's heartbeat threshold + 5 s, then
                          SIGCONT: a hung node;
``runner-kill``           SIGKILL of the runner (last in its burst), then ``resilient-flows resume``;
``pilot-cancel``          ``scancel`` of the run's newest running pilot job (``--slurm``, ``--slurm-nodes``);
``node-loss``             ``--nodes``: an emulated node's block killed and its node-local directories
                          deleted; ``--slurm-nodes``: the node of a busy pool crashes
                          (``.ci/slurm-node down``: every process in its namespace SIGKILLed, its
                          scratch deleted), Slurm marks it down and ends its block, Parsl starts
                          another on the nodes left, and the node boots again 45 s later;
``storage-full``          the shared tier full (ENOSPC) for 4 s: the chaos run's directory is a
                          tmpfs that a ballast file fills, then frees (root only; skipped with a
                          message otherwise);
``shard-flip``            a flipped byte in a running member's newest committed checkpoint shard
                          (every copy of it: node-local ones too), then SIGKILL of its worker, so
                          that the retry must detect the damage by checksum and restore an older
                          checkpoint;
``node-and-buddy-loss``   ``--slurm-nodes --peer``: both nodes of a running two-node member crash at
                          once, each with the copy it kept of the other's shards, after the member
                          committed a checkpoint to the shared tier; they boot again 45 s later
                          (a block needs two nodes: on three, none runs until then).

``--peer`` (with ``--slurm-nodes``): half the members span the two nodes of a block (``nodes: 2``,
their ranks started by ``srun``) and checkpoint to ``tiers: [local, peer, shared]``: each node
keeps a copy of the other's shards. A ``node-loss`` then crashes one node of a running two-node
member that committed two checkpoints in its attempt (either of its nodes: the worker pool's or
the other), so that its next attempt must read the lost node's shards from the survivor's peer
copy. The resumes after node losses are listed with the bytes they read per source (the
``resumed`` events' ``bytes_from``); figures: resumes after losing one node that read nothing from
the shared tier (target: all), resumes after losing a node and its buddy that read everything
from it (target: all). Their references are trained here on as many local processes as ranks.
The two kinds of member alternate in the workflow (a block runs two at once), and in a held run
each kind waits at its own gate, opened once the faults meant for it struck (node losses for the
two-node members, the other kinds, which find their targets among workers, for the rest).

``--walltime D`` (``--slurm``, ``--slurm-nodes``; whole minutes, at least ``1m``): the run's copy
of the site gives every block that walltime (the provider's and the ``walltime`` fact), so the
runner drains each block before its end: its members commit, exit 75 and continue on a fresh
block. Paced members (``--quick``) are slowed to outlast a block (1.2 walltimes of steps each),
and are not held at a gate (a member waiting there could not stop for a drain). Figures: blocks
drained and members stopped by a drain (target: at least one), starts declined near a drain,
retries spent on drained attempts (target 0), steps redone per drain (target: at most 3, a few
steps, not an interval), blocks that Slurm ended at their walltime (``TIMEOUT``, the run's jobs
watched every 3 s) and attempts killed by the walltime (targets 0). An attempt a drain stopped,
or that declined to start, is no loss. ``--kinds none`` runs it without other faults (``--kinds
K,K``: only those kinds, for any run).

Every run has a hard timeout: a run that hangs is killed and reported as a FAIL, never waited on.
Once it ended, what of the run still lives 10 s later is counted as left over and killed (pools,
their processes, interchanges, block scripts, Slurm jobs whose batch script is in the run's
directory), stopped processes are continued, and the tmpfs is unmounted.

Figures (printed; with ``--json PATH`` written with their units), checked against the targets of
issues 13 and 34 where they set one:

- members finished / N; digests equal to the reference / N (targets: N/N); runs killed at their
  timeout; faults injected by kind, and skipped for want of a target (target: 0);
- steps lost per attempt that a fault ended: steps that the attempt logged (``metrics.jsonl``)
  and a later attempt logged again. Each lost attempt is charged to the first fault before the
  first sign of its loss that struck it directly, else the latest that found it running; none is a FAIL
  (``attempts lost that no fault explains``). Targets: median <= one checkpoint interval, max
  <= two (a fault during a checkpoint, which cannot be told from outside), three after a flipped
  shard (the restore falls back one checkpoint). Attempts that lived through a full file system
  are reported apart: their checkpoints could not be written;
- recovery per fault kind, median and p95, with its split as ``goodput.py`` splits it
  (``recovery_split``), for each attempt a fault of the kind ended: detection (the fault ->
  ``failed``, ``lost``, or a new runner's ``submitted``), restart (-> the next attempt's
  ``started``), restore (-> ``resumed``: training again) and redone steps. The recovery is the
  fault -> training again (the steps redone after it are reported apart), less the part of the
  restart during which the member's retry waited for a worker while every worker of the site
  (``SiteFacts.workers``) ran another member's attempt (each counted until the fault that ended
  it, if one did: a struck worker trains nothing): an ensemble larger than its workers queues a
  retry as it queues a member that never started, and a held run's members (``--quick``) keep
  their workers at the gate. That queue is shown beside it, not counted; the seconds with a
  worker free, or gone with the fault, are. The recovery also ends at training again, not at
  the first step, which a member resuming past its hold step takes only once the gate opens; and
  where another fault ended the next attempt before it trained, it ends at that fault, whose own
  recovery the rest is (an outage is never counted twice). A later fault that takes more of
  what a waiting member needs (a pool, then the interchange, then the runner: ``SHARED_FAULTS``)
  takes over the rest of that member's wait in the same way: its recovery lists it as a member
  found waiting, with nothing to detect (the earlier fault's detection, if it came only after,
  is not counted). Targets (issue 34): recovery p95 <= 10 s and
  detection p95 <= 5 s, for every kind; detection counts from when the attempt fell silent where
  that came after the fault (the ``lost`` event's ``silent_s``: a pool whose manager process
  died runs its tasks on, beating, until they need it). A fault that ended no attempt by itself
  (each attempt it struck was charged to an earlier fault) reports instead, without a target,
  the time until a member started after it (a hung pool takes no work), or for a full file
  system waited out, until the first step after it;
- retries spent (``cost`` of the ``failed`` events), members that ran out of retries (target 0),
  ``lost`` events of the runner's watchdog, members trained again after they had finished;
- runner CPU-seconds (``/proc/<pid>/stat`` of every runner process, summed over resumes, read
  exactly once each exits) in all, per member and as a share of the members' CPU (the workers'),
  and peak runner RSS (``VmHWM``), for both runs. Target (default and ``--full``, fault-free run):
  runner CPU <= 1 % of the members';
- wall time against the reference; the size of Parsl's logs in the run directory; torn lines
  (that do not parse as JSON) in ``events.jsonl`` and every ``metrics.jsonl`` and leftovers of
  every kind (targets: 0).

``--agent`` runs the preemption agent's faults instead (seconds; the agent of ``resilient-flows
cosched agent`` against the tests' fake PBS Pro commands and served ``squeue --json`` output):
the agent SIGKILLed between requeueing its victim held and releasing it, then restarted (target:
the victim released within 2 polls); jobs whose heartbeats are a FIFO and a 1 GiB file (target:
the poll's heartbeat reads within the deadline, neither believed, a sound one beside them
believed); markers forged in comments (in a path, glued to another word) and in a PBS job's
environment (target: none taken for a request, none shielding a running job).

``python benchmarks/chaos.py [--quick | --full | --agent] [--slurm | --nodes | --slurm-nodes N [--peer]]
[--walltime D] [--kinds K,K | none] [--seed N] [--json PATH] [--dir DIR] [--keep] [--timeout S]``;
``--quick`` takes about a minute (``--slurm-nodes 3 --peer``: about four, ``--walltime 2m``: about
eight), the default about 15. The tests (``tests/test_chaos.py``) drive the same functions with a
small paced ensemble (:func:`paced`) and a reference trained in their own process, and check the
analysis of node-loss restores and drains on made-up events.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import sklearn.datasets  # noqa: F401  (paced's built-in loads its data with it: a warm pool preloads it with this module)
import yaml
from rich.console import Console
from rich.table import Table

from resilient_flows.units import duration_argument

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = Path(__file__).resolve().parent
sys.path.append(str(BENCH_DIR))  # clusterenv, also when the tests import this file
import harness  # noqa: E402
import recovery_split  # noqa: E402
from clusterenv import read_env_file  # noqa: E402
from recovery_split import percentile  # noqa: E402

CLI = Path(sys.executable).with_name("resilient-flows")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

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
#: How long a node lost on ``local-slurm-nodes`` stays down: past Slurm's SlurmdTimeout of a
#: ``.ci/slurm-up --nodes`` cluster (20 s), so that Slurm notices and ends its block, then it boots.
NODE_DOWN_S = 45.0
#: Faults that only the runner's watchdog notices: their threshold is the member's stall timeout.
HANGS = ("worker-stop", "manager-process-kill")
#: Faults that last a while and may end no attempt: their recovery counts from the fault to the
#: first step after it ended.
WINDOWED = ("storage-full", "worker-stop")
#: Targets per fault kind (``--quick`` on a quiet machine): the p95 of what the faults of a kind
#: cost before their members trained again, and of how long noticing them took.
RECOVERY_P95_S = 10.0
DETECTION_P95_S = 5.0
#: How long a fault waits for a target (a busy worker, a pool, a runner back from a restart).
TARGET_WAIT_S = 90.0
#: Where a held run's members find the gate that the harness opens once every fault struck.
GATE_ENV = "RESILIENT_FLOWS_CHAOS_GATE"
#: The share of its steps after which a member of a held run waits at the gate, and how long at most.
HOLD_AT = 0.8
GATE_WAIT_S = 300.0
#: Seconds between two looks of the supervising loop (runner CPU and RSS, processes of the run).
LOOK_S = 0.5
#: How many times a runner that exits on its own with members unfinished is resumed, as an operator would.
RESUMES_AFTER_EXIT = 3
#: How long the run's processes have to go once the last runner exited, before they count as left over.
LEFTOVER_GRACE_S = 10.0
#: How long after a fault a worker it kills may still start a task: a hung pool lives until the
#: watchdog retires it (the site's stall timeout, plus the look that sees it).
DOOMED_S = 90.0
SLURM_ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}
#: Checkpoints a two-node member commits in its attempt before a node-loss may strike it: the
#: older one has surely been copied to its buddy.
PEER_CHECKPOINTS = 2
#: Members of a ``--walltime`` run last this many walltimes (paced members are slowed to it).
WALLTIME_MEMBER = 1.2
#: Steps a drain may redo: the member stops after its current step and commits it.
DRAIN_REDONE = 3
#: Seconds between two looks at the states of a ``--walltime`` run's Slurm jobs.
JOBS_LOOK_S = 3.0


# ---------------------------------------------------------------------- configuration


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
    span_s: float | None = None  # set: bursts over this many seconds, and no fault-free run (see ``main``)
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
    ``site_file``: the run's copy of the site (``--walltime``), named instead of ``site``."""
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


def paced(ctx: Any) -> dict[str, Any]:
    """``chaos:paced``: the built-in ``mlp-digits`` member, with a pause of ``pause_ms`` after each step.

    Tests need members that live long enough for a whole chaos schedule (or a node to be lost
    between two checkpoints) without filling two cores, and a reference they can train in their
    own process in seconds: the pause costs no CPU and changes no weight, so the reference trains
    with ``pause_ms: 0``, and a member spanning nodes trains as the built-in does (DDP, FSDP).
    Where the harness names a gate (:data:`GATE_ENV`, for a :attr:`Config.hold` run), a member
    waits after :data:`HOLD_AT` of its steps until the gate exists: on a loaded machine, where
    recoveries take minutes, members would otherwise finish before the last faults found a
    target. The wait changes no weight either. A member spanning nodes waits at its own gate
    (:func:`gate_of`), which opens once the node losses struck, and only after
    :data:`PEER_CHECKPOINTS` checkpoint intervals of its attempt: a node loss strikes it once the
    buddy holds copies of its attempt's checkpoints.
    """
    from resilient_flows.training._workloads import resolve_workload

    pause_s = float(ctx.params.get("pause_ms", 0)) / 1000
    spanning = ctx.spec.nodes > 1
    gate = os.environ.get(GATE_ENV)
    gate = gate and str(gate_of(Path(gate), spanning))
    before_hold = PEER_CHECKPOINTS * (ctx.spec.checkpoint.interval_steps or 0) if spanning else 0
    steps = ctx.steps

    def paced_steps(total: int) -> Iterator[int]:
        hold = int(total * HOLD_AT) if gate else None
        first = None
        for step in steps(total):
            first = step if first is None else first
            if hold is not None and step >= max(hold, first + before_hold):
                opens = time.monotonic() + GATE_WAIT_S  # a harness that died opens nothing
                while not os.path.exists(gate) and time.monotonic() < opens:
                    time.sleep(LOOK_S)
                hold = None
            yield step
            time.sleep(pause_s)

    ctx.steps = paced_steps
    return resolve_workload("mlp-digits").train(ctx)


def gate_of(gate: Path, spanning: bool) -> Path:
    """The gate of a held run's members: spanning nodes or not (with ``--peer``, the node losses
    strike the former, every other kind the latter: each family is released once its faults struck)."""
    return gate.with_name(gate.name + ".spanning") if spanning else gate


def fault_free_digests(workflow: Path, out: Path) -> dict[str, str]:
    """Every member of ``workflow`` trained without faults or pauses; digest by name. A member of
    one rank trains in this process, one of several ranks (spanning nodes) on as many processes of
    this machine (:func:`ranks_digest`)."""
    from resilient_flows.training import run_member
    from resilient_flows.workflow import load_workflow

    out.mkdir(parents=True, exist_ok=True)
    digests = {}
    for spec in load_workflow(workflow).member_specs(None):
        quiet = replace(spec, faults=(), params={**spec.params, "pause_ms": 0})
        if spec.ranks > 1:
            digests[spec.name] = ranks_digest(quiet.to_dict(), spec.ranks, out)
        else:
            digests[spec.name] = run_member(quiet.to_dict(), str(out))["digest"]
    return digests


def ranks_digest(spec: dict[str, Any], ranks: int, out: Path) -> str:
    """The digest of a member of several ranks trained here, each rank a process started as
    ``torchrun`` would (``RANK``, ``WORLD_SIZE``, rank 0 on this machine's loopback). Its ranks
    average their gradients as they do across nodes: two ranks' sum is the same in either order."""
    path = out / f"{spec['name']}.spec.json"
    path.write_text(json.dumps(spec))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pythonpath = os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "resilient_flows.training.mpi_member", str(path), str(out)]
    processes = []
    with (out / f"{spec['name']}.log").open("ab") as log:
        for rank in range(ranks):
            env = {**os.environ, "PYTHONPATH": pythonpath, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            env.update(RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(ranks))
            for name in [n for n in env if n.startswith(("SLURM_", "OMPI_", "PMI_", "PALS_"))]:
                del env[name]  # no other launcher's word
            processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
        try:
            statuses = [process.wait(timeout=600) for process in processes]
        finally:
            for process in processes:
                process.kill()
    if any(statuses):
        raise RuntimeError(f"reference of {spec['name']} on {ranks} ranks failed {statuses}; see {log.name}")
    return json.loads((out / "members" / spec["name"] / "result.json").read_text())["digest"]


# ---------------------------------------------------------------------- processes, seen from outside


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: int  # clock ticks after boot: with the pid, names one process for good
    state: str
    cpu_s: float
    cmdline: str


def read_proc(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) * TICK_S
    return Proc(pid, int(fields[1]), int(fields[19]), fields[0], cpu, cmdline.strip())


def processes() -> dict[int, Proc]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := read_proc(int(entry))) is not None:
            table[proc.pid] = proc
    return table


def alive(proc: Proc) -> bool:
    """Whether this very process (not a recycled pid) still runs; a zombie does not."""
    now = read_proc(proc.pid)
    return now is not None and now.start == proc.start and now.state != "Z"


def send(proc: Proc, sig: signal.Signals) -> bool:
    """Signal ``proc`` if it is still the process we looked at."""
    if not alive(proc):
        return False
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        return False
    return True


def peak_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class RunProcs:
    """The processes of one run at one moment."""

    table: dict[int, Proc]
    pools: list[Proc]
    spawned: dict[int, list[Proc]]  # pool pid -> its spawned (or forked) processes, oldest (the manager process) first
    interchanges: list[Proc]

    def pool_of(self, pid: int) -> int | None:
        """The pool whose worker ``pid`` is."""
        for pool, children in self.spawned.items():
            if any(child.pid == pid for child in children[1:]):
                return pool
        return None


class Watcher:
    """Finds the processes of one run through ``/proc``; remembers every one it saw, and the
    workers' CPU time (the members' CPU)."""

    def __init__(self, run_dir: Path, runner: Runner) -> None:
        self.marker = f"{run_dir}/parsl/"
        self.runner = runner
        self.seen: dict[tuple[int, int], tuple[str, Proc]] = {}  # (pid, start) -> (role, process)
        self.worker_cpu: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()

    def look(self) -> RunProcs:
        table = processes()
        pools = [p for p in table.values() if "process_worker_pool" in p.cmdline and self.marker in p.cmdline]
        pool_pids = {p.pid for p in pools}
        spawned: dict[int, list[Proc]] = {pid: [] for pid in pool_pids}
        roles: list[tuple[str, Proc]] = [("pool", p) for p in pools]
        runners = set(self.runner.pids)
        interchanges = []
        # a warm pool's workers are forked by its fork server (resilient_flows.sites._warmpool)
        servers = {p.pid: p.ppid for p in table.values() if p.ppid in pool_pids and "forkserver" in p.cmdline}
        for proc in table.values():
            if proc.ppid in servers:
                spawned[servers[proc.ppid]].append(proc)
            elif proc.ppid in pool_pids:
                if "spawn_main" in proc.cmdline:
                    spawned[proc.ppid].append(proc)
                else:
                    roles.append(("pool process", proc))
            elif proc.ppid in runners and "interchange" in proc.cmdline:
                interchanges.append(proc)
                roles.append(("interchange", proc))
            elif self.marker in proc.cmdline and proc.pid not in pool_pids:
                roles.append(("block script", proc))
        for children in spawned.values():
            children.sort(key=lambda p: (p.start, p.pid))
            roles.extend(("pool process", child) for child in children)
        with self._lock:
            for role, proc in roles:
                self.seen.setdefault((proc.pid, proc.start), (role, proc))
            for children in spawned.values():
                for worker in children[1:]:
                    key = (worker.pid, worker.start)
                    self.worker_cpu[key] = max(self.worker_cpu.get(key, 0.0), worker.cpu_s)
        return RunProcs(table, pools, spawned, interchanges)

    def members_cpu_s(self) -> float:
        with self._lock:
            return sum(self.worker_cpu.values())

    def living(self, extra: list[tuple[str, Proc]]) -> list[tuple[str, Proc]]:
        """Everything of the run seen so far (and ``extra``) that still lives."""
        self.look()
        with self._lock:
            known = dict(self.seen)
        for role, proc in extra:
            known.setdefault((proc.pid, proc.start), (role, proc))
        return [(role, proc) for role, proc in known.values() if alive(proc)]


# ---------------------------------------------------------------------- the runner


class Runner:
    """The runner of a run: ``resilient-flows run``, and ``resume`` after every kill of ours, and
    after a runner that exited on its own with members unfinished (recorded in ``exits``: a crash,
    or members out of retries), up to :data:`RESUMES_AFTER_EXIT` times.

    Its CPU time is read from ``/proc`` while it lives and exactly once it exits: ``waitid`` with
    ``WNOWAIT`` leaves it a zombie whose counters can still be read, then it is reaped.
    """

    def __init__(self, workflow: Path, run_dir: Path, site: str, log: Path, env: dict[str, str]) -> None:
        self.workflow, self.run_dir, self.site, self.log, self.env = workflow, run_dir, site, log, env
        self.pids: list[int] = []
        self.peak_rss_kib = 0
        self.returncode: int | None = None
        self.exits: list[str] = []
        self._ended_cpu_s = 0.0
        self._live_cpu_s = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._doomed: int | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            self._start(resume=False)

    def _start(self, resume: bool) -> None:
        if resume:
            command = [str(CLI), "resume", str(self.run_dir)]
        else:
            command = [str(CLI), "run", str(self.workflow), "--site", self.site, "--run-dir", str(self.run_dir)]
        with self.log.open("ab") as log:
            log.write(f"\n===== {time.strftime('%H:%M:%S')} {' '.join(command)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.pids.append(self._proc.pid)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return None if proc is None else proc.pid

    @property
    def cpu_s(self) -> float:
        return self._ended_cpu_s + self._live_cpu_s

    def kill(self) -> int | None:
        """SIGKILL the runner (the next :meth:`poll` resumes the run); its pid, or None if it had ended."""
        with self._lock:
            proc = self._proc
            if proc is None or (now := read_proc(proc.pid)) is None or now.state == "Z" or self._doomed == proc.pid:
                return None
            self._doomed = proc.pid
            os.kill(proc.pid, signal.SIGKILL)
            return proc.pid

    def poll(self) -> bool:
        """Sample the runner; resume after our kill. True once the run is over (the runner exited by itself)."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return True
            now = read_proc(proc.pid)
            if now is not None:
                self._live_cpu_s = now.cpu_s
                self.peak_rss_kib = max(self.peak_rss_kib, peak_rss_kib(proc.pid))
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return False
            final = read_proc(proc.pid)  # a zombie: its counters are final
            self._ended_cpu_s += final.cpu_s if final is not None else self._live_cpu_s
            self._live_cpu_s = 0.0
            proc.wait()
            if proc.pid == self._doomed:
                self._start(resume=True)
                return False
            if proc.returncode != 0 and len(self.exits) < RESUMES_AFTER_EXIT and self._unfinished():
                self.exits.append(f"runner {proc.pid} exited with status {proc.returncode}, members unfinished")
                self._start(resume=True)
                return False
            self.returncode = proc.returncode
            self._proc = None
            return True

    def _unfinished(self) -> bool:
        """Whether the run exists (``resume`` can continue it) and a member has no result yet."""
        try:
            names = [m["name"] for m in json.loads((self.run_dir / "plan.json").read_text())["members"]]
        except (OSError, ValueError, KeyError):
            return False
        return any(not (self.run_dir / "members" / name / "result.json").exists() for name in names)

    def stop(self) -> None:
        """SIGKILL the runner for good (a run past its timeout)."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


# ---------------------------------------------------------------------- the chaos schedule


@dataclass
class Fault:
    """One fault, as planned and as it happened (wall-clock times, as in ``events.jsonl``)."""

    kind: str
    burst: int
    time: float = 0.0
    end: float = 0.0  # when a window closed (SIGCONT, ballast removed); ``time`` for instant faults
    hit: dict[str, int] = field(default_factory=dict)  # members struck directly -> their attempt
    doomed: frozenset[int] = frozenset()  # worker pids the fault kills: a task they start after it dies too
    running: dict[str, int] = field(default_factory=dict)  # every member running then -> its attempt
    detail: str = ""
    skipped: str | None = None
    flipped_step: int | None = None
    nodes: tuple[str, ...] = ()  # the nodes a node loss crashed


def plan_bursts(kinds: tuple[str, ...], config: Config, rng: random.Random) -> list[list[Fault]]:
    """Bursts of faults: each kind ``faults_per_kind`` times, never twice in one burst."""
    chosen: list[list[str]] = [[] for _ in range(config.bursts)]
    for kind in kinds:
        for b in rng.sample(range(config.bursts), min(config.faults_per_kind, config.bursts)):
            chosen[b].append(kind)
    return [[Fault(kind, b) for kind in burst] for b, burst in enumerate(burst for burst in chosen if burst)]


def running_members(run_dir: Path) -> dict[str, tuple[int, int]]:
    """member -> (attempt, pid) of the attempts that beat now (``heartbeats/``; analytics excluded)."""
    found = {}
    with contextlib.suppress(FileNotFoundError):
        for path in (run_dir / "heartbeats").iterdir():
            if "@" in path.name:
                continue
            with contextlib.suppress(OSError, ValueError):
                record = json.loads(path.read_bytes())
                found[path.name] = (int(record["attempt"]), int(record["pid"]))
    return found


class EventTail:
    """The events of a run as they are written: each call to :meth:`read` parses the lines
    appended since the last, so that a fault looking for its target every half second does not
    read the whole log again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._offset = 0
        self._lock = threading.Lock()

    def read(self) -> list[dict[str, Any]]:
        with self._lock:
            with contextlib.suppress(FileNotFoundError), self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
                complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written is read next time
                self._offset += len(complete)
                for raw in complete.splitlines():
                    with contextlib.suppress(ValueError):
                        self.events.append(json.loads(raw))
            return list(self.events)


@dataclass(frozen=True)
class Attempt:
    """A running attempt, seen from outside: its member, number, process (rank 0's), and nodes."""

    member: str
    attempt: int
    proc: Proc
    hosts: tuple[str, ...]
    checkpoints: int  # checkpoints it committed so far


def running_attempts(run_dir: Path, events: list[dict[str, Any]]) -> list[Attempt]:
    """The attempts that beat now and whose process lives, with the nodes their ``started`` event
    names (``hosts`` for a member spanning nodes, else ``host``)."""
    started: dict[tuple[str, int], tuple[float, tuple[str, ...]]] = {}
    commits: dict[str, list[float]] = {}
    for e in events:
        if e["kind"] == "started" and e.get("member") is not None:
            hosts = tuple(e.get("hosts") or [e.get("host")])
            started[(e["member"], e["attempt"])] = (e["time"], hosts)
        elif e["kind"] == "checkpointed":
            commits.setdefault(e.get("member"), []).append(e["time"])
    found = []
    for name, (attempt, pid) in running_members(run_dir).items():
        proc = read_proc(pid)
        if (name, attempt) not in started or proc is None or proc.state == "Z":
            continue
        since, hosts = started[(name, attempt)]
        found.append(Attempt(name, attempt, proc, hosts, sum(t >= since for t in commits.get(name, []))))
    return sorted(found, key=lambda a: a.member)


def fill(directory: Path, name: str) -> Path:
    """Fill the file system of ``directory`` to its last page with a ballast file."""
    ballast = directory / name
    with ballast.open("wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12):
            chunk = bytes(size)
            try:
                while True:
                    f.write(chunk)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
    return ballast


class Chaos(threading.Thread):
    """Injects the bursts into a running run; :meth:`finish` stops it and lifts what it holds."""

    def __init__(
        self,
        bursts: list[list[Fault]],
        span_s: float,
        run_dir: Path,
        shared: Path | None,
        runner: Runner,
        watcher: Watcher,
        facts: SiteFacts,
        config: Config,
        seed: int,
        nodes: Path | None = None,
        gate: Path | None = None,
        cluster: Path | None = None,
    ) -> None:
        super().__init__(name="chaos", daemon=True)
        self.bursts, self.span_s, self.run_dir, self.shared = bursts, span_s, run_dir, shared
        self.nodes, self.gate, self.cluster = nodes, gate, cluster
        self.runner, self.watcher, self.facts, self.config = runner, watcher, facts, config
        self.seed = seed
        self.rng = random.Random(seed + 1)
        self.faults = [fault for burst in bursts for fault in burst]
        self.stop_s = facts.heartbeat_threshold_s + 5.0
        self.events = EventTail(run_dir / "events.jsonl")
        self._done = threading.Event()
        self._lifts: dict[threading.Timer, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._down: set[str] = set()  # nodes a fault crashed and that did not boot yet (or are being crashed)

    def run(self) -> None:
        try:
            self._strike_bursts()
        finally:
            self._open_gate()

    def _strike_bursts(self) -> None:
        if not self.bursts or not self._wait_for(self._first_checkpoint, float("inf")):
            return
        origin = time.monotonic()
        share = self.span_s / len(self.bursts)
        strikes = []
        for b, burst in enumerate(self.bursts):
            at = origin + (b + self.rng.uniform(0.15, 0.85)) * share
            if self._done.wait(max(0.0, at - time.monotonic())):
                break
            for i, fault in enumerate(burst):  # at once: one waiting for its target holds up no other
                rng = random.Random(f"{self.seed}-{b}-{i}")
                # the runner last, so that the others strike what it started
                delay = 0.6 if fault.kind == "runner-kill" else rng.uniform(0.0, 0.5)
                strike = threading.Thread(target=self._inject, args=(fault, rng, delay), name=f"chaos {fault.kind}")
                strike.start()
                strikes.append(strike)
        for strike in strikes:
            strike.join()
        for fault in self.faults:
            if fault.time == 0.0 and fault.skipped is None:
                fault.skipped = "the run ended first"

    def finish(self) -> None:
        self._done.set()
        self.join(timeout=30)
        self._open_gate()
        with self._lock:
            lifts, self._lifts = dict(self._lifts), {}
        for timer, lift in lifts.items():
            timer.cancel()
            lift()

    # ------------------------------------------------------------------ mechanics

    def _open_gate(self) -> None:
        """Let held members finish: every fault struck (or gave up on its target)."""
        if self.gate is not None:
            for spanning in (False, True):
                gate_of(self.gate, spanning).touch()

    def _first_checkpoint(self) -> bool:
        with contextlib.suppress(FileNotFoundError):
            return b'"checkpointed"' in (self.run_dir / "events.jsonl").read_bytes()
        return False

    def _wait_for(self, ready: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._done.is_set() and time.monotonic() < deadline:
            if ready():
                return True
            self._done.wait(LOOK_S)
        return False

    def _inject(self, fault: Fault, rng: random.Random, delay: float) -> None:
        strike = getattr(self, "_" + fault.kind.replace("-", "_"))
        if self._done.wait(delay):
            return
        # A held run keeps its members until every fault struck: a fault then waits for its target
        # as long as the run lasts (under load, a few faults of a burst take the few busy workers
        # between two recoveries, and a fixed wait would give up on the others).
        patience = float("inf") if self.gate is not None else TARGET_WAIT_S
        if not self._wait_for(lambda: strike(fault, rng), patience):
            fault.skipped = "the run ended first" if self._done.is_set() else f"no target within {TARGET_WAIT_S:g} s"
        self._open_family_gates()

    def _open_family_gates(self) -> None:
        """With members spanning nodes: release each family once every fault meant for it struck
        (node losses for the spanning members, the other kinds for the rest); a family held
        longer would keep the block's workers, the other family's targets, from it."""
        if self.gate is None or not self.config.peer_members:
            return
        pending = [f for f in self.faults if f.time == 0.0 and f.skipped is None]
        if not any(f.kind in NODE_LOSSES for f in pending):
            gate_of(self.gate, spanning=True).touch()
        if not any(f.kind not in NODE_LOSSES for f in pending):
            gate_of(self.gate, spanning=False).touch()

    def _later(self, delay: float, lift: Callable[[], None]) -> None:
        """Run ``lift`` after ``delay`` seconds, or at :meth:`finish`, whichever comes first; once."""
        once = threading.Lock()

        def run_once() -> None:
            if once.acquire(blocking=False):
                lift()

        timer = threading.Timer(delay, run_once)
        with self._lock:
            if self._done.is_set():  # the run is over: lift at once
                timer = None
            else:
                self._lifts[timer] = run_once
                timer.start()
        if timer is None:
            run_once()

    def _begin(self, fault: Fault, hit: dict[str, int], detail: str, doomed: Iterable[Proc] = ()) -> None:
        fault.running = {name: attempt for name, (attempt, _) in running_members(self.run_dir).items()}
        fault.time = fault.end = time.time()
        fault.hit, fault.detail, fault.doomed = hit, detail, frozenset(p.pid for p in doomed)

    def _busy_workers(self, procs: RunProcs) -> list[tuple[str, int, Proc]]:
        """(member, attempt, worker) of the members that run in a worker of this run's pools."""
        busy = []
        for name, (attempt, pid) in running_members(self.run_dir).items():
            if procs.pool_of(pid) is not None:
                busy.append((name, attempt, procs.table[pid]))
        return sorted(busy, key=lambda b: b[0])

    def _members_of_pool(self, procs: RunProcs, pool: int) -> dict[str, int]:
        return {
            name: attempt for name, attempt, worker in self._busy_workers(procs) if procs.pool_of(worker.pid) == pool
        }

    # ------------------------------------------------------------------ the faults

    def _worker_kill(self, fault: Fault, rng: random.Random) -> bool:
        busy = self._busy_workers(self.watcher.look())
        if not busy:
            return False
        name, attempt, worker = rng.choice(busy)
        self._begin(fault, {name: attempt}, f"worker {worker.pid} running {name}", [worker])
        return send(worker, signal.SIGKILL)

    def _busy_pool(self, procs: RunProcs, rng: random.Random) -> tuple[Proc, dict[str, int]] | None:
        pools = [(pool, self._members_of_pool(procs, pool.pid)) for pool in procs.pools]
        pools = [(pool, hit) for pool, hit in pools if hit and len(procs.spawned[pool.pid]) >= 2]
        return rng.choice(sorted(pools, key=lambda p: p[0].pid)) if pools else None

    def _pool_kill(self, fault: Fault, rng: random.Random) -> bool:
        procs = self.watcher.look()
        found = self._busy_pool(procs, rng)
        if found is None:
            return False
        pool, hit = found
        self._begin(fault, hit, f"pool {pool.pid}", procs.spawned[pool.pid][1:])
        return send(pool, signal.SIGKILL)

    def _manager_process_kill(self, fault: Fault, rng: random.Random) -> bool:
        procs = self.watcher.look()
        found = self._busy_pool(procs, rng)
        if found is None:
            return False
        pool, hit = found
        manager = procs.spawned[pool.pid][0]
        workers = procs.spawned[pool.pid][1:]
        self._begin(fault, hit, f"multiprocessing manager {manager.pid} of pool {pool.pid}", workers)
        return send(manager, signal.SIGKILL)

    def _node_loss(self, fault: Fault, rng: random.Random) -> bool:
        """A node lost with its node-local directories; the members resume from what is left."""
        if self.cluster is not None:
            return self._slurm_node_loss(fault, rng)
        return self._emulated_node_loss(fault, rng)

    def _emulated_node_loss(self, fault: Fault, rng: random.Random) -> bool:
        """An emulated node of ``local-nodes``: its block's processes killed at once, and its
        node-local directories (``node-<block>.*``) gone."""
        procs = self.watcher.look()
        found = self._busy_pool(procs, rng)
        if found is None or self.nodes is None:
            return False
        pool, hit = found
        block = next((b for b in pool.cmdline.split() if b.startswith("--block_id=")), "=?").split("=", 1)[1]
        try:
            group = os.getpgid(pool.pid)
        except ProcessLookupError:
            return False
        self._begin(
            fault, hit, f"node {block} (pool {pool.pid}) and its node-local directories", procs.spawned[pool.pid][1:]
        )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        for directory in self.nodes.glob(f"node-{block}.*"):
            shutil.rmtree(directory, ignore_errors=True)
        return True

    def _slurm_node_loss(self, fault: Fault, rng: random.Random) -> bool:
        """The node of a busy pool on ``local-slurm-nodes`` crashes (``.ci/slurm-node down``: every
        process in its namespace, and its node-local scratch); it boots again after
        :data:`NODE_DOWN_S` (``.ci/slurm-node up``), by when Slurm has ended its block. With
        members spanning nodes (``--peer``), the node is one of a running two-node member's."""
        assert self.cluster is not None
        if self.config.peer_members:
            return self._peer_node_loss(fault, rng)
        procs = self.watcher.look()
        found = self._busy_pool(procs, rng)
        node = None if found is None else process_environment(found[0].pid).get("SLURMD_NODENAME")
        if found is None or node is None or not self._claim((node,)):
            return False
        pool, hit = found
        self._begin(
            fault, hit, f"node {node} (pool {pool.pid}), back after {NODE_DOWN_S:g} s", procs.spawned[pool.pid][1:]
        )
        return self._crash(fault, (node,))

    def _spanning(self, ready: Callable[[Attempt], bool]) -> list[Attempt]:
        """Running attempts of members spanning nodes, none of them down, that are ``ready``."""
        attempts = running_attempts(self.run_dir, self.events.read())
        with self._lock:
            down = set(self._down)
        return [a for a in attempts if len(set(a.hosts)) > 1 and not down & set(a.hosts) and ready(a)]

    def _struck_on(self, nodes: tuple[str, ...], procs: RunProcs, job: int | None) -> tuple[dict[str, int], list[Proc]]:
        """The attempts running on ``nodes`` (members struck directly), and the workers of the
        pools in Slurm job ``job``, which dies with any of its nodes."""
        hit = {
            a.member: a.attempt for a in running_attempts(self.run_dir, self.events.read()) if set(a.hosts) & set(nodes)
        }
        doomed = [w for pool in procs.pools if slurm_job_of(pool.pid) == job for w in procs.spawned[pool.pid][1:]]
        return hit, doomed

    def _peer_node_loss(self, fault: Fault, rng: random.Random) -> bool:
        """One node of a running two-node member that committed :data:`PEER_CHECKPOINTS` checkpoints
        in its attempt: the pool's node (rank 0's) or the other, by the seed's choice."""
        targets = self._spanning(lambda a: a.checkpoints >= PEER_CHECKPOINTS)
        if not targets:
            return False
        target = rng.choice(targets)
        node = rng.choice(sorted(set(target.hosts)))
        if not self._claim((node,)):
            return False
        procs = self.watcher.look()
        hit, doomed = self._struck_on((node,), procs, slurm_job_of(target.proc.pid))
        rank = "rank 0's" if node == target.hosts[0] else "not rank 0's"
        self._begin(fault, hit, f"node {node} of {target.member} ({rank}), back after {NODE_DOWN_S:g} s", doomed)
        return self._crash(fault, (node,))

    def _node_and_buddy_loss(self, fault: Fault, rng: random.Random) -> bool:
        """Both nodes of a running two-node member crash together, each holding the other's peer
        copies, once the member has a checkpoint in the shared tier: the restore must fall back
        to it. Both boot again after :data:`NODE_DOWN_S`."""
        assert self.cluster is not None

        def in_shared(attempt: Attempt) -> bool:
            return (self.run_dir / "members" / attempt.member / "checkpoints" / "latest").is_file()

        targets = self._spanning(in_shared)
        if not targets:
            return False
        target = rng.choice(targets)
        nodes = tuple(sorted(set(target.hosts)))
        if not self._claim(nodes):
            return False
        procs = self.watcher.look()
        hit, doomed = self._struck_on(nodes, procs, slurm_job_of(target.proc.pid))
        detail = f"nodes {', '.join(nodes)} of {target.member}, back after {NODE_DOWN_S:g} s"
        self._begin(fault, hit, detail, doomed)
        return self._crash(fault, nodes)

    def _claim(self, nodes: tuple[str, ...]) -> bool:
        """Reserve ``nodes`` for one fault: none of them down or being crashed by another."""
        with self._lock:
            if self._down & set(nodes):
                return False
            self._down |= set(nodes)
            return True

    def _crash(self, fault: Fault, nodes: tuple[str, ...]) -> bool:
        """``nodes`` crash at once (a thread each); they boot again after :data:`NODE_DOWN_S`."""
        fault.nodes = nodes
        done = [False] * len(nodes)

        def down(i: int) -> None:
            done[i] = slurm_node("down", nodes[i], self.cluster)

        crashes = [threading.Thread(target=down, args=(i,)) for i in range(len(nodes))]
        for crash in crashes:
            crash.start()
        for crash in crashes:
            crash.join()

        def boot() -> None:
            for node in nodes:
                slurm_node("up", node, self.cluster)
            fault.end = time.time()
            with self._lock:
                self._down -= set(nodes)

        self._later(NODE_DOWN_S, boot)
        if not all(done):
            fault.detail += f" (crash failed on {[n for n, ok in zip(nodes, done, strict=True) if not ok]})"
        return all(done)

    def _interchange_kill(self, fault: Fault, rng: random.Random) -> bool:
        procs = self.watcher.look()
        mine = [p for p in procs.interchanges if p.ppid == self.runner.pid]
        if not mine or not self._busy_workers(procs):
            return False
        workers = [w for pool in procs.pools for w in procs.spawned[pool.pid][1:]]
        self._begin(fault, {}, f"interchange {mine[0].pid}", workers)  # prefetched tasks start, then die
        fault.hit = dict(fault.running)
        return send(mine[0], signal.SIGKILL)

    def _worker_stop(self, fault: Fault, rng: random.Random) -> bool:
        busy = self._busy_workers(self.watcher.look())
        if not busy:
            return False
        name, attempt, worker = rng.choice(busy)
        self._begin(fault, {name: attempt}, f"worker {worker.pid} running {name}, stopped {self.stop_s:g} s", [worker])
        if not send(worker, signal.SIGSTOP):
            return False

        def resume() -> None:
            send(worker, signal.SIGCONT)
            fault.end = time.time()

        self._later(self.stop_s, resume)
        return True

    def _runner_kill(self, fault: Fault, rng: random.Random) -> bool:
        if not self._busy_workers(self.watcher.look()):
            return False
        self._begin(fault, {}, "")
        fault.hit = dict(fault.running)
        pid = self.runner.kill()
        fault.detail = f"runner {pid}, then resume"
        return pid is not None

    def _pilot_cancel(self, fault: Fault, rng: random.Random) -> bool:
        procs = self.watcher.look()
        if not self._busy_workers(procs):
            return False
        running = [job for job, state in slurm_jobs(self.run_dir).items() if state == "RUNNING"]
        if not running:
            return False
        job = max(running)  # the newest: the current runner's
        workers = [w for pool in procs.pools if slurm_job_of(pool.pid) == job for w in procs.spawned[pool.pid][1:]]
        self._begin(fault, {}, f"Slurm job {job}", workers)
        fault.hit = dict(fault.running)
        return subprocess.run(["scancel", str(job)], capture_output=True, timeout=30).returncode == 0

    def _storage_full(self, fault: Fault, rng: random.Random) -> bool:
        assert self.shared is not None
        self._begin(fault, {}, "")
        ballast = fill(self.shared, f"ballast-{fault.burst}")
        fault.detail = f"{ballast.stat().st_size / 2**20:.0f} MiB of ballast for {self.config.full_window_s:g} s"

        def free() -> None:
            ballast.unlink(missing_ok=True)
            fault.end = time.time()

        self._later(self.config.full_window_s, free)
        return True

    def _shard_flip(self, fault: Fault, rng: random.Random) -> bool:
        """A byte flipped in the newest shared checkpoint's first shard, and in every node-local
        copy of that shard (on ``local-nodes``): an intact copy on another tier would be restored
        instead, rightly, and the damage would never be met."""
        busy = self._busy_workers(self.watcher.look())
        rng.shuffle(busy)
        for name, attempt, worker in busy:
            tier = self.run_dir / "members" / name / "checkpoints"
            try:
                step = int((tier / "latest").read_text())
                shard = sorted((tier / f"step-{step:08d}").glob("shard-*.safetensors"))[0]
            except (OSError, ValueError, IndexError):  # no checkpoint yet, or retention removed it
                continue
            local = [] if self.nodes is None else self.nodes.rglob(f"{name}/step-{step:08d}/{shard.name}")
            self._begin(fault, {name: attempt}, f"{shard.relative_to(self.run_dir)}, then worker {worker.pid}")
            if not flip_byte(shard):
                continue
            copies = sum(flip_byte(copy) for copy in local)
            fault.detail += f" ({copies} node-local copies flipped too)" if copies else ""
            fault.flipped_step = step
            send(worker, signal.SIGKILL)
            return True
        return False


def flip_byte(path: Path) -> bool:
    """Flip one bit of the byte in the middle of ``path``; False if it is gone (retention)."""
    try:
        with path.open("r+b") as f:
            f.seek(path.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x01]))
    except (OSError, IndexError):
        return False
    return True


# ---------------------------------------------------------------------- Slurm


def slurm_jobs(run_dir: Path) -> dict[int, str]:
    """job id -> state of the run's pilot jobs that the controller knows (finished ones for
    ``MinJobAge``): those whose batch script lies in the run's ``parsl/`` directory, recorded in
    ``blocks.jsonl`` or not."""
    done = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%T|%o"], capture_output=True, text=True, timeout=30)
    marker = f"{run_dir}/parsl/"
    jobs = (line.split("|", 2) for line in done.stdout.splitlines() if line.count("|") >= 2)
    return {int(job): state for job, state, command in jobs if command.startswith(marker)}


def process_environment(pid: int) -> dict[str, str]:
    """A process's environment (empty when it is gone)."""
    found = {}
    with contextlib.suppress(OSError):
        for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            name, sep, value = entry.decode(errors="replace").partition("=")
            if sep:
                found[name] = value
    return found


def slurm_job_of(pid: int) -> int | None:
    """The Slurm job a process runs in, from its environment."""
    with contextlib.suppress(KeyError, ValueError):
        return int(process_environment(pid)["SLURM_JOB_ID"])
    return None


def slurm_node(action: str, node: str, cluster: Path) -> bool:
    """``.ci/slurm-node down|up NODE DIR``; whether it did."""
    done = subprocess.run([str(REPO / ".ci/slurm-node"), action, node, str(cluster)], capture_output=True, timeout=150)
    return done.returncode == 0


def slurm_problem() -> str | None:
    """Why no Slurm cluster can run jobs now; None when one can."""
    if shutil.which("sinfo") is None:
        return "sinfo is not on PATH"
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo timed out"
    if done.returncode != 0:
        return f"sinfo failed: {(done.stderr.strip() or done.stdout.strip()).splitlines()[-1:]}"
    if not set(done.stdout.split()) & {"idle", "mix", "alloc", "comp"}:
        return f"no node can run jobs ({done.stdout.split()})"
    return None


@contextlib.contextmanager
def slurm_cluster(console: Console) -> Iterator[None]:
    """A reachable Slurm cluster: the one ``SLURM_CONF`` names, or one started here and stopped after.

    The cluster's folder is its own under the system's temporary directory: munged runs as the
    ``munge`` user and must reach it.
    """
    problem = slurm_problem()
    if problem is None:
        yield
        return
    folder = Path(tempfile.mkdtemp(prefix="chaos-slurm-"))
    console.print(f"no Slurm cluster answers ({problem}); starting one with .ci/slurm-up {folder}")
    try:
        done = subprocess.run([str(REPO / ".ci/slurm-up"), str(folder)], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            console.print(f"[red].ci/slurm-up failed:[/]\n{done.stderr[-2000:]}", markup=True, highlight=False)
            raise SystemExit(1)
        previous = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = done.stdout.strip().split("=", 1)[1]
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = previous
    finally:
        subprocess.run([str(REPO / ".ci/slurm-down"), str(folder)], capture_output=True, timeout=120)


@contextlib.contextmanager
def slurm_nodes_cluster(console: Console, nodes: int) -> Iterator[Path]:
    """A Slurm cluster of ``nodes`` network namespaces (``.ci/slurm-up --nodes``), started here,
    its ``DIR/env`` exported into this process (the runners inherit it), stopped after; its folder."""
    folder = Path(tempfile.mkdtemp(prefix="chaos-slurm-nodes-"))
    console.print(f"starting a {nodes}-node Slurm cluster with .ci/slurm-up --nodes {nodes} {folder}")
    before = dict(os.environ)
    try:
        command = [str(REPO / ".ci/slurm-up"), "--nodes", str(nodes), str(folder)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            console.print(f"[red].ci/slurm-up failed:[/]\n{done.stderr[-2000:]}", markup=True, highlight=False)
            raise SystemExit(1)
        os.environ.update(read_env_file(folder / "env"))
        yield folder
    finally:
        os.environ.clear()
        os.environ.update(before)
        subprocess.run([str(REPO / ".ci/slurm-down"), str(folder)], capture_output=True, timeout=180)


# ---------------------------------------------------------------------- one run, supervised


@dataclass
class RunData:
    """What a run left on disk, parsed (read before its tmpfs goes)."""

    names: list[str]
    digests: dict[str, str]
    events: list[dict[str, Any]]
    torn_events: int
    metrics: dict[str, list[tuple[int, int, float]]]  # member -> (step, attempt, time) per line
    torn_metrics: int
    parsl_mib: float  # Parsl's logs and scripts: a flooding log shows here
    spanning: set[str] = field(default_factory=set)  # members whose ranks span nodes


def parse_lines(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON lines of ``path`` and how many lines do not parse (torn)."""
    records, torn = [], 0
    with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
        for raw in f:
            try:
                records.append(json.loads(raw))
            except ValueError:
                torn += 1
    return records, torn


def read_run(run_dir: Path) -> RunData:
    planned = json.loads((run_dir / "plan.json").read_text())["members"]
    names = [member["name"] for member in planned]
    spanning = {member["name"] for member in planned if int(member.get("nodes") or 1) > 1}
    digests, metrics, torn_metrics = {}, {}, 0
    for name in names:
        directory = run_dir / "members" / name
        with contextlib.suppress(OSError, ValueError, KeyError):
            digests[name] = json.loads((directory / "result.json").read_text())["digest"]
        lines, torn = parse_lines(directory / "metrics.jsonl")
        metrics[name] = [(int(r["step"]), int(r["attempt"]), float(r["time"])) for r in lines]
        torn_metrics += torn
    events, torn_events = parse_lines(run_dir / "events.jsonl")
    parsl_mib = directory_mib(run_dir / "parsl")
    return RunData(names, digests, events, torn_events, metrics, torn_metrics, parsl_mib, spanning)


@dataclass
class Execution:
    """One supervised run: its data and what was measured from outside."""

    data: RunData
    wall_s: float
    runner_cpu_s: float
    runner_peak_rss_mib: float
    runner_starts: int
    runner_exits: list[str]  # runners that exited on their own with members unfinished
    members_cpu_s: float
    timed_out: bool
    returncode: int | None
    leftovers: Counter[str]
    leftover_details: list[str]
    log: Path
    slurm_states: dict[int, str] = field(default_factory=dict)  # job -> last state seen (``--walltime``)


class JobWatch(threading.Thread):
    """The last state seen of each of a run's Slurm jobs, every :data:`JOBS_LOOK_S`: the controller
    forgets finished jobs after ``MinJobAge``, and a block that hit its walltime ends ``TIMEOUT``."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(name="slurm jobs", daemon=True)
        self.run_dir = run_dir
        self.states: dict[int, str] = {}
        self._done = threading.Event()

    def run(self) -> None:
        while True:
            self.look()
            if self._done.wait(JOBS_LOOK_S):
                return

    def look(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.states.update(slurm_jobs(self.run_dir))

    def finish(self) -> dict[int, str]:
        self._done.set()
        self.join(timeout=60)
        self.look()
        return dict(self.states)


def execute(
    workflow: Path,
    run_dir: Path,
    site: str,
    log: Path,
    timeout_s: float,
    chaos: Callable[[Runner, Watcher, Path | None], Chaos] | None = None,
    keep: Path | None = None,
    nodes: Path | None = None,
    gate: Path | None = None,
    site_file: Path | None = None,
    watch_jobs: bool = False,
) -> Execution:
    """Run ``workflow`` into ``run_dir`` (with ``chaos`` injected), wait for it up to ``timeout_s``,
    count and kill what it left, and read what it wrote. ``keep``: copy the run directory there;
    ``nodes``: where the emulated nodes of ``local-nodes`` keep their node-local directories;
    ``gate``: where the members of a held chaos run wait (see :func:`paced`), removed first;
    ``site_file``: the site's file to run on instead of ``site``'s own; ``watch_jobs``: record the
    states of the run's Slurm jobs (:class:`JobWatch`)."""
    if gate is not None:
        for spanning in (False, True):
            gate_of(gate, spanning).unlink(missing_ok=True)  # an earlier run's, in the same directory
    env = {
        **os.environ,
        "COLUMNS": "200",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")])),
        **({"RESILIENT_FLOWS_NODES": str(nodes)} if nodes is not None else {}),
        **({GATE_ENV: str(gate)} if gate is not None else {}),
    }
    runner = Runner(workflow, run_dir, str(site_file or site), log, env)
    watcher = Watcher(run_dir, runner)
    injector = None
    jobs = JobWatch(run_dir) if watch_jobs else None
    states: dict[int, str] = {}
    started = time.monotonic()
    timed_out = False
    try:
        runner.start()
        if jobs is not None:
            jobs.start()
        if chaos is not None:
            injector = chaos(runner, watcher, gate)
            injector.start()
        while not runner.poll():
            watcher.look()
            if time.monotonic() - started > timeout_s:
                timed_out = True
                break
            time.sleep(LOOK_S)
        wall_s = time.monotonic() - started
    finally:
        if injector is not None:
            injector.finish()
        runner.stop()
        if jobs is not None:
            states = jobs.finish()
        leftovers, details = reap(run_dir, watcher, site != "local")
    data = read_run(run_dir)
    if keep is not None:
        shutil.copytree(run_dir, keep, ignore=shutil.ignore_patterns("ballast-*"), dirs_exist_ok=True)
    return Execution(
        data,
        wall_s,
        runner.cpu_s,
        runner.peak_rss_kib / 1024,
        len(runner.pids),
        runner.exits,
        watcher.members_cpu_s(),
        timed_out,
        runner.returncode,
        leftovers,
        details,
        log,
        states,
    )


def recorded_interchanges(run_dir: Path) -> list[tuple[str, Proc]]:
    """The interchanges ``blocks.jsonl`` records, as processes to look for."""
    found = []
    lines, _ = parse_lines(run_dir / "blocks.jsonl")
    for record in lines:
        if "interchange" in record and record.get("started") is not None:
            found.append(("interchange", Proc(int(record["interchange"]), 0, int(record["started"]), "", 0.0, "")))
    return found


def reap(run_dir: Path, watcher: Watcher, slurm: bool) -> tuple[Counter[str], list[str]]:
    """Count what of the run lives on after it ended (after a grace for its own cleanup), then
    kill it: pools, their processes, interchanges, block scripts, active Slurm jobs. The counts by
    kind, and each leftover in words."""
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    living = watcher.living(recorded_interchanges(run_dir))
    while living and time.monotonic() < deadline:
        time.sleep(LOOK_S)
        living = watcher.living(recorded_interchanges(run_dir))
    left = Counter(role for role, _ in living)
    details = [f"{role} {proc.pid}: {proc.cmdline[:150]}" for role, proc in living]
    for _, proc in living:
        send(proc, signal.SIGCONT)  # a stopped process cannot even die until it runs
        send(proc, signal.SIGKILL)
    if slurm:
        while True:
            active = [job for job, state in slurm_jobs(run_dir).items() if state in SLURM_ACTIVE]
            if not active or time.monotonic() > deadline:
                break
            time.sleep(LOOK_S)
        left["Slurm job"] = len(active)
        details += [f"Slurm job {job}" for job in active]
        if active:
            subprocess.run(["scancel", *map(str, active)], capture_output=True, timeout=30)
    return left, details


@contextlib.contextmanager
def shared_tmpfs(path: Path, size_mib: int, console: Console) -> Iterator[Path | None]:
    """A tmpfs of ``size_mib`` at ``path`` (root only), unmounted afterwards; None when it cannot be mounted."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        reason = "not root" if os.geteuid() != 0 else done.stderr.strip()
        console.print(f"[yellow]storage-full skipped: cannot mount a tmpfs for the shared tier ({reason})[/]")
        yield None
        return
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(path)], capture_output=True)


def run_chaos(
    config: Config,
    work: Path,
    site: str,
    span_s: float,
    seed: int,
    shared_mib: int,
    timeout_s: float,
    console: Console,
    keep: bool = False,
    kinds: tuple[str, ...] | None = None,
) -> tuple[Execution, list[Fault]]:
    """The workflow under the chaos schedule of ``seed``, its bursts spread over ``span_s`` seconds
    after the first checkpoint; the run directory on a tmpfs of ``shared_mib`` when root.
    ``kinds``: the faults to strike (default: every kind of the site, :func:`site_kinds`); with
    :attr:`Config.walltime_s`, on a copy of the site whose blocks have that walltime."""
    facts = SiteFacts.of(site)
    kinds = site_kinds(site, config) if kinds is None else kinds
    work.mkdir(parents=True, exist_ok=True)
    site_file = None if config.walltime_s is None else walltime_site(site, config.walltime_s, work)
    workflow = work / "chaos.yaml"
    workflow.write_text(workflow_yaml(config, site, site_file))
    with shared_tmpfs(work / "shared", shared_mib, console) as shared:
        if shared is None:
            kinds = tuple(k for k in kinds if k != "storage-full")
        bursts = plan_bursts(kinds, config, random.Random(seed))
        run_dir = (shared or work) / "run"

        gate = work / "chaos.gate" if config.hold else None

        cluster = nodes_dir = None
        if site == "local-slurm-nodes":  # the nodes' scratch: DIR/nodes/NODE/local of the cluster in DIR
            nodes_dir = Path(os.environ["RESILIENT_FLOWS_TEST_NODES_DIR"])
            cluster = nodes_dir.parent

        def chaos(runner: Runner, watcher: Watcher, gate: Path | None) -> Chaos:
            nodes = work / "nodes" if site == "local-nodes" else nodes_dir
            return Chaos(bursts, span_s, run_dir, shared, runner, watcher, facts, config, seed, nodes, gate, cluster)

        execution = execute(
            workflow,
            run_dir,
            site,
            work / "chaos.log",
            timeout_s,
            chaos,
            work / "chaos-run" if keep else None,
            nodes=work / "nodes",
            gate=gate,
            site_file=site_file,
            watch_jobs=config.walltime_s is not None,
        )
    return execution, [fault for burst in bursts for fault in burst]


def site_kinds(site: str, config: Config) -> tuple[str, ...]:
    """Every kind of fault for ``site``; with members spanning nodes, their buddies' loss too."""
    return PEER_KINDS if config.peer_members and site == "local-slurm-nodes" else KINDS[site]


def run_reference(config: Config, work: Path, site: str, timeout_s: float) -> Execution:
    """The same workflow without faults, on disk."""
    work.mkdir(parents=True, exist_ok=True)
    workflow = work / "reference.yaml"
    workflow.write_text(workflow_yaml(config, site))
    nodes = work / "nodes-reference"
    return execute(workflow, work / "reference", site, work / "reference.log", timeout_s, nodes=nodes)


def directory_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def members_span_s(data: RunData) -> float:
    """From the first member's start to the last member's end."""
    starts = [e["time"] for e in data.events if e["kind"] == "started"]
    ends = [e["time"] for e in data.events if e["kind"] == "finished"]
    return max(ends) - min(starts) if starts and ends else 0.0


# ---------------------------------------------------------------------- analysis


@dataclass
class Loss:
    """An attempt that ended before its member finished: what it cost, and how the member came back."""

    member: str
    attempt: int
    fault: Fault | None  # None when no fault explains it
    steps: int  # logged by this attempt and again by a later one
    detected_by: str  # the first sign of the loss: failed, lost, submitted (a new runner) or started
    recovery_s: float | None  # fault -> training again, less the queue (``Split.recovery_s``)
    detect_s: float | None  # fault (or the silence it caused, if later) -> the first sign of the loss
    split: recovery_split.Split | None  # detection, restart, restore, redone steps (None: no fault)
    through_full: bool  # the attempt lived through a full file system: checkpoints may have failed

    @property
    def waiting(self) -> bool:
        """A fault that found the member waiting to restart, its attempt ended by an earlier one."""
        return self.detected_by == "waiting"


def by_member(data: RunData) -> dict[str, list[dict[str, Any]]]:
    """Each member's events, with the losses of a whole Parsl instance, which end every member's
    attempt in it (see :func:`recovery_split.ends_every_attempt`)."""
    grouped: dict[str, list[dict[str, Any]]] = {name: [] for name in data.names}
    for event in data.events:
        if recovery_split.ends_every_attempt(event):
            for events in grouped.values():
                events.append(event)
        else:
            grouped.setdefault(event.get("member"), []).append(event)
    return grouped


def losses(data: RunData, faults: list[Fault], slots: int | None = None) -> list[Loss]:
    """Every attempt followed by another, with the fault that ended it (see :func:`attribute`) and
    what it cost (see :func:`_loss`; ``slots``: the site's workers, for the queue).

    An attempt that no fault struck, ended when the runner's watchdog cancelled its block for
    another member's sake (its worker got SIGTERM with the block), is charged to the fault that
    made that member silent."""
    injected = [f for f in faults if f.skipped is None and f.time > 0]
    fulls = [f for f in injected if f.kind == "storage-full"]
    ended = []  # (member, events, attempt, next attempt, detected, how, fault)
    for name, mine in by_member(data).items():
        started = {e["attempt"]: e["time"] for e in mine if e["kind"] == "started"}
        pids = {e["attempt"]: e.get("pid") for e in mine if e["kind"] == "started"}
        done = {e.get("attempt") for e in mine if e["kind"] == "finished"}  # ended well, whatever followed
        done |= walltime_ends(mine)  # stopped by its block's drain, or declined to start before it
        notices = sorted((e["time"], e["kind"]) for e in mine if e["kind"] in ("failed", "lost", "submitted"))
        for a, b in itertools.pairwise(sorted(started)):
            if a in done:
                continue
            detected, how = next(((t, k) for t, k in notices if started[a] < t <= started[b]), (started[b], "started"))
            fault = attribute(name, a, started[a], pids[a], detected, how, injected)
            ended.append((name, mine, a, b, detected, how, fault))
    silenced = {(name, detected): fault for name, _, _, _, detected, how, fault in ended if how == "lost" and fault}
    hangs = [f for f in injected if f.kind in HANGS]
    charged = []
    for name, mine, a, b, detected, how, fault in ended:
        start = next(e["time"] for e in mine if e["kind"] == "started" and e["attempt"] == a)
        if fault is None:
            cancels = [e for e in data.events if e["kind"] == "lost" and start - 1.0 <= e["time"] <= detected]
            fault = next(filter(None, (_silencer(e, silenced, hangs) for e in cancels)), None)
        charged.append((name, mine, a, b, detected, how, fault))
    ends = {(name, a): fault.time for name, _, a, _, _, _, fault in charged if fault is not None}
    spans = attempt_spans(data, ends)
    found = []
    for name, mine, a, b, detected, how, fault in charged:
        ended = ends.get((name, b))
        waits = [] if fault is None else waited_through(data, name, mine, a, fault, ended, injected)
        cuts = [f.time for f in waits] + [ended]
        found.append(_loss(data, name, mine, a, b, detected, how, fault, fulls, cuts[0], spans, slots))
        for wait, until in zip(waits, cuts[1:], strict=True):
            found.append(_loss(data, name, mine, a, b, wait.time, "waiting", wait, fulls, until, spans, slots))
    return found


#: Faults that take what every waiting member needs to start, by how much they take: a pool (or a
#: node, or a pilot job), the interchange (every pool with it), the runner (Parsl with it).
SHARED_FAULTS = {
    "pool-kill": 1,
    "manager-process-kill": 1,
    "pilot-cancel": 1,
    "node-loss": 1,
    "node-and-buddy-loss": 1,
    "interchange-kill": 2,
    "runner-kill": 3,
}


def waited_through(
    data: RunData,
    name: str,
    mine: list[dict[str, Any]],
    attempt: int,
    fault: Fault,
    ended: float | None,
    faults: list[Fault],
) -> list[Fault]:
    """The faults of :data:`SHARED_FAULTS` that struck after ``fault`` ended ``attempt`` of
    ``name`` and before it trained again (or its next attempt ended, at ``ended``), each taking
    more than the fault charged before it: each takes over the rest of the member's wait (see
    :func:`recovery_split.split_of`), whether it found the member waiting or struck its ended
    attempt again (a runner killed just after a worker was stopped: the pool's report of the stop
    has no runner to go to). One that takes as much or less adds to the wait of the fault charged."""
    lines = data.metrics.get(name, [])
    again = recovery_split.split_of(mine, lines, name, attempt, fault.time, 0.0, ended).training_again_s
    if again is None:
        return []
    started = next(e["time"] for e in mine if e["kind"] == "started" and e["attempt"] == attempt)
    begin, end = max(fault.time, started), fault.time + again  # a fault may be charged from before the start
    scope, found = SHARED_FAULTS.get(fault.kind, 0), []
    for f in sorted(faults, key=lambda f: f.time):
        if begin < f.time < end and SHARED_FAULTS.get(f.kind, 0) > scope:
            found.append(f)
            scope = SHARED_FAULTS[f.kind]
    return found


#: Events that end an attempt, or show that it ended: after them its worker is free for another.
ATTEMPT_ENDS = ("finished", "failed", "preempted", "lost", "submitted")


def _ends(event: dict[str, Any], attempt: int) -> bool:
    """Whether ``event`` (of the same member) shows that its ``attempt`` ended: a sign of its end,
    the next attempt's start, or a new runner's submission."""
    if event["kind"] == "started":
        return event["attempt"] != attempt
    return event["kind"] in ATTEMPT_ENDS and event.get("attempt") in (None, attempt)


def attempt_spans(data: RunData, ends: dict[tuple[str, int], float]) -> dict[str, list[tuple[float, float]]]:
    """member -> (start, end) of each of its attempts, while it held a worker for work: from its
    ``started`` to the first sign that it ended (its member's next event of :data:`ATTEMPT_ENDS`),
    or to the fault that ended it (``ends``: (member, attempt) -> the fault's time), if earlier: a
    worker whose attempt a fault struck trains nothing, whenever the runner learns it."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for name, mine in by_member(data).items():
        for event in (e for e in mine if e["kind"] == "started"):
            attempt, start = event["attempt"], event["time"]
            signs = [e["time"] for e in mine if e is not event and e["time"] >= start and _ends(e, attempt)]
            end = min([*signs, ends.get((name, attempt), float("inf"))])
            spans.setdefault(name, []).append((start, end))
    return spans


def walltime_stop(event: dict[str, Any]) -> bool:
    """Whether ``event`` is a member stopping because the runner drains its block before its
    walltime (the reason :class:`~resilient_flows.workflow._walltime.BlockClock` gives)."""
    return event["kind"] == "preempted" and "(walltime)" in str(event.get("reason", ""))


def walltime_ends(mine: list[dict[str, Any]]) -> set[int]:
    """A member's attempts that a drain stopped (committed, exit 75) or that declined to start on a
    block about to be drained: each ended as it should, no fault ended it."""
    return {e.get("attempt") for e in mine if walltime_stop(e) or e["kind"] == "declined"}


def _silencer(lost: dict[str, Any], silenced: dict[tuple[str, float], Fault], hangs: list[Fault]) -> Fault | None:
    """The fault behind a ``lost`` event of the watchdog, whose block cancel stops every attempt
    on the block: the fault charged with the silent member's loss, or for a block none of whose
    tasks beat, the latest hang before it."""
    if lost.get("member") is not None:
        return silenced.get((lost["member"], lost["time"]))
    return max((f for f in hangs if f.time <= lost["time"]), key=lambda f: f.time, default=None)


def _loss(
    data: RunData,
    name: str,
    mine: list[dict[str, Any]],
    a: int,
    b: int,
    detected: float,
    how: str,
    fault: Fault | None,
    fulls: list[Fault],
    until: float | None = None,
    spans: dict[str, list[tuple[float, float]]] | None = None,
    slots: int | None = None,
) -> Loss:
    """What attempt ``a`` of ``name``, ended by ``fault`` and followed by ``b``, cost: its split
    (:mod:`recovery_split`), cut at ``until`` (the next fault that took over: see :func:`losses`)
    and less the wait for a free worker while the other members' attempts (``spans``) took all
    ``slots``. With ``how`` ``waiting``, ``fault`` found the member waiting to restart: what it
    cost from then on (no detection, no steps: they are the first fault's)."""
    started = {e["attempt"]: e["time"] for e in mine if e["kind"] == "started"}
    # when the watchdog found an attempt silent: since when, in wall-clock time
    silent_since = {e["time"]: e["time"] - e["silent_s"] for e in mine if e["kind"] == "lost" and e.get("silent_s")}
    lines = data.metrics.get(name, [])
    # a hang is noticeable once the attempt falls silent: a pool whose manager process died runs
    # its tasks on, beating, until they need it
    # nothing to notice for a member found waiting; nothing this fault could notice after the next took over
    unnoticed = how == "waiting" or (until is not None and detected > until)
    detect = None if fault is None or unnoticed else detected - max(fault.time, silent_since.get(detected, fault.time))
    others = [span for member, member_spans in (spans or {}).items() if member != name for span in member_spans]
    at = detected if fault is None else fault.time
    split = recovery_split.split_of(mine, lines, name, a, at, 0.0, until, others, slots, how == "waiting")
    split = replace(split, redone_s=split.redone_steps * recovery_split.step_time_s(lines))
    recovery = None if fault is None else split.recovery_s
    through = any(f.time < detected and f.end > started[a] for f in fulls)
    return Loss(name, a, fault, split.redone_steps, how, recovery, detect, split if fault else None, through)


def attribute(
    name: str, attempt: int, start: float, pid: int | None, detected: float, how: str, faults: list[Fault]
) -> Fault | None:
    """The fault that ended ``attempt`` of ``name``: of those between its start and the first sign
    of its loss, the first that struck it directly (every kind that strikes an attempt ends it:
    a worker stopped, then orphaned by a runner kill, was ended by the stop), else the latest
    that found it running (a full file system), else one that killed the worker
    it started on just after the fault (a task the pool had prefetched, or that its interchange
    handed it before a cancelled job's processes died). An attempt that started after the runner
    was killed, and ended when the next runner came, ran in the dead runner's orphaned blocks (its
    interchange still hands them tasks): that kill ended it. Likewise an attempt that started
    after its interchange was killed and ended when the runner started Parsl again."""
    window = [f for f in faults if start - 1.0 <= f.time <= detected]
    struck = [f for f in window if f.hit.get(name) == attempt]
    if struck:
        return min(struck, key=lambda f: f.time)
    found = [f for f in window if f.running.get(name) == attempt]
    if found:
        return max(found, key=lambda f: f.time)
    doomed = [f for f in faults if pid in f.doomed and f.time - 1.0 <= start <= f.time + DOOMED_S]
    if doomed:
        return max(doomed, key=lambda f: f.time)
    kills = [f for f in faults if f.kind in ("runner-kill", "interchange-kill") and f.time <= start]
    return max(kills, key=lambda f: f.time) if kills and how == "submitted" else None


def window_recoveries(data: RunData, fault: Fault) -> list[float]:
    """For a fault that lasts a while and ended no attempt (a full file system waited out): from
    the fault to the first step after it ended, per member whose attempt lived through it."""
    out = []
    for name, attempt in fault.running.items():
        after = [when for _, a, when in data.metrics.get(name, []) if a == attempt and when > fault.end]
        if after:
            out.append(min(after) - fault.time)
    return out


def flip_outcomes(data: RunData, faults: list[Fault]) -> Counter[str]:
    """How each flipped shard was met by the next attempt of its member: ``detected`` (it restored
    an older checkpoint, or none when the damaged one was the only one), ``restored`` (it loaded
    the damaged one) or ``not exercised`` (there was no next attempt, or it found a newer one)."""
    out: Counter[str] = Counter()
    grouped = by_member(data)
    for fault in faults:
        if fault.kind != "shard-flip" or fault.flipped_step is None:
            continue
        ((name, attempt),) = fault.hit.items()
        mine = grouped.get(name, [])
        later = [e["attempt"] for e in mine if e["kind"] == "started" and e["attempt"] > attempt]
        if not later:
            out["not exercised"] += 1
            continue
        step = next((e["step"] for e in mine if e["kind"] == "resumed" and e["attempt"] == min(later)), -1)
        if step > fault.flipped_step:
            out["not exercised"] += 1
        else:
            out["restored" if step == fault.flipped_step else "detected"] += 1
    return out


@dataclass(frozen=True)
class Resume:
    """The next attempt of a member spanning nodes whose attempt a node loss ended: what it read."""

    member: str
    attempt: int  # the resuming attempt
    kind: str  # the fault: node-loss or node-and-buddy-loss
    lost: tuple[str, ...]  # the nodes it crashed
    hosts: tuple[str, ...]  # the nodes the resuming attempt ran on
    step: int | None  # the step restored; None: none (it started over, or ended before restoring)
    bytes_from: dict[str, int]  # bytes read per source, as the ``resumed`` event says
    lost_steps: int

    @property
    def sources(self) -> set[str]:
        """``local``, ``peer``, ``shared``: where its bytes came from, whatever the node."""
        return {source.split(" on ")[0] for source in self.bytes_from}

    @property
    def as_expected(self) -> bool:
        """After one node: restored without a byte of the shared tier; after a node and its buddy:
        restored from the shared tier alone."""
        if self.step is None:
            return False
        return "shared" not in self.sources if self.kind == "node-loss" else self.sources == {"shared"}


def node_loss_resumes(data: RunData, faults: list[Fault], spanning: set[str]) -> list[Resume]:
    """For each attempt of a member of ``spanning`` that a node loss struck and ended: the restore
    of the first later attempt that restored a checkpoint (its ``resumed`` event's step and
    ``bytes_from``) or trained without one (started over); attempts that other faults ended
    before either are passed over."""
    grouped = by_member(data)
    out = []
    for loss in losses(data, faults):
        fault = loss.fault
        if fault is None or fault.kind not in NODE_LOSSES or loss.member not in spanning:
            continue
        if fault.hit.get(loss.member) != loss.attempt:
            continue  # ended as its block went down, not on a lost node
        mine = grouped.get(loss.member, [])
        trained = {attempt for _, attempt, _ in data.metrics.get(loss.member, [])}
        resumes = {e["attempt"]: e for e in mine if e["kind"] == "resumed"}
        after = sorted(e["attempt"] for e in mine if e["kind"] == "started" and e["attempt"] > loss.attempt)
        nxt = next((a for a in after if a in resumes or a in trained), None)
        if nxt is None:
            continue
        start = next(e for e in mine if e["kind"] == "started" and e["attempt"] == nxt)
        resumed = resumes.get(nxt)
        out.append(
            Resume(
                loss.member,
                nxt,
                fault.kind,
                tuple(fault.nodes),
                tuple(start.get("hosts") or [start.get("host")]),
                None if resumed is None else int(resumed["step"]),
                {} if resumed is None else {k: int(v) for k, v in resumed.get("bytes_from", {}).items()},
                loss.steps,
            )
        )
    return out


@dataclass(frozen=True)
class Drains:
    """What the walltime did to a run (``--walltime``), from its events and its Slurm jobs' states."""

    blocks_drained: int  # ``drained`` events: blocks cancelled by the runner before their end
    stops: int  # members a drain stopped (committed, exit 75)
    declined: int  # starts declined near a block's drain
    retries: float  # cost of the failures of drained attempts
    redone: list[int]  # per stop: steps the stopped attempt logged and a later one logged again
    timeouts: int  # the run's Slurm jobs that ended at their walltime
    killed: list[str]  # attempts on a drained or timed-out block that ended for no reason of ours


def drains(data: RunData, faults: list[Fault], states: dict[int, str]) -> Drains:
    """The drains of a ``--walltime`` run. An attempt counts as killed by the walltime when it ran
    on a block that the runner drained or that Slurm ended at its walltime, and ended neither
    finished, nor stopped by the drain, nor declined, nor by a fault."""
    stops, retries, redone = 0, 0.0, []
    for name, mine in by_member(data).items():
        steps: dict[int, set[int]] = {}
        for step, attempt, _ in data.metrics.get(name, []):
            steps.setdefault(attempt, set()).add(step)
        stopping: int | None = None
        for event in mine:
            if walltime_stop(event):
                stops += 1
                stopping = event.get("attempt")
                later = set().union(*(s for a, s in steps.items() if a > stopping))
                redone.append(len(steps.get(stopping, set()) & later))
            elif event["kind"] == "declined":
                stopping = event.get("attempt")
            elif event["kind"] == "failed" and stopping is not None:
                retries += float(event.get("cost", 0))
                stopping = None
            elif event["kind"] == "started":
                stopping = None
    jobs = _attempt_jobs(data)
    ended = {int(e["job_id"]) for e in data.events if e["kind"] == "drained" and str(e.get("job_id", "")).isdigit()}
    ended |= {job for job, state in states.items() if state == "TIMEOUT"}
    killed = [
        f"{loss.member} attempt {loss.attempt} (job {jobs.get((loss.member, loss.attempt))})"
        for loss in losses(data, faults)
        if loss.fault is None and jobs.get((loss.member, loss.attempt)) in ended
    ]
    return Drains(
        sum(e["kind"] == "drained" for e in data.events),
        stops,
        sum(e["kind"] == "declined" for e in data.events),
        retries,
        redone,
        sum(state == "TIMEOUT" for state in states.values()),
        killed,
    )


def _attempt_jobs(data: RunData) -> dict[tuple[str, int], int]:
    """(member, attempt) -> the Slurm job of the block it started on: of the ``block_started``
    events of its block number (reused by later Parsl instances), the last to start before it."""
    blocks: dict[str, list[tuple[float, int]]] = {}
    for e in data.events:
        if e["kind"] == "block_started" and str(e.get("job_id", "")).isdigit():
            blocks.setdefault(str(e["block"]), []).append((float(e["start"]), int(e["job_id"])))
    out = {}
    for e in data.events:
        if e["kind"] == "started" and e.get("member") is not None and e.get("block") is not None:
            candidates = [(start, job) for start, job in blocks.get(str(e["block"]), []) if start <= e["time"] + 1.0]
            if candidates:
                out[(e["member"], e["attempt"])] = max(candidates)[1]
    return out


def recovery_figures(kind: str, mine: list[Loss]) -> list[Figure]:
    """The recovery of the attempts that faults of ``kind`` ended, judged against
    :data:`RECOVERY_P95_S` and :data:`DETECTION_P95_S`, with its split (:mod:`recovery_split`)."""
    parts = recovery_split.summary(loss.split for loss in mine if loss.split is not None)
    recovery = percentile([loss.recovery_s for loss in mine], 0.95)
    detections = [loss.detect_s for loss in mine if loss.detect_s is not None]
    detection = percentile(detections, 0.95) if detections else None  # it found members waiting only
    cut = sum(loss.split is not None and loss.split.cut for loss in mine)
    waiting = sum(loss.waiting for loss in mine)
    found = [
        Figure(
            f"recoveries_{kind}",
            f"recovery {kind}: attempts ended",
            len(mine) - waiting,
            f"attempts; {waiting} members found waiting; {cut} cut by a later fault",
        ),
        Figure(
            f"recovery_{kind}_median",
            f"recovery {kind}, median",
            statistics.median(loss.recovery_s for loss in mine),
            "s",
        ),
        Figure(
            f"recovery_{kind}_p95",
            f"recovery {kind}, p95",
            recovery,
            "s",
            f"<= {RECOVERY_P95_S:g}",
            recovery <= RECOVERY_P95_S,
        ),
        Figure(
            f"detection_{kind}_p95",
            "  of which detection, p95",
            detection,
            "s",
            f"<= {DETECTION_P95_S:g}",
            None if detection is None else detection <= DETECTION_P95_S,
        ),
    ]
    for part in ("restart", "queued", "restore", "redone"):  # the split goodput.py reports (recovery_split)
        label = "  queued for a worker (not counted), median" if part == "queued" else f"  of which {part}, median"
        found.append(Figure(f"{part}_{kind}_median", label, parts.get(f"{part}_median"), "s"))
    return found


def next_start_s(data: RunData, fault: Fault) -> float | None:
    """For a fault that ended no attempt by itself: how long until a member started after it (a
    hung pool takes no new work until it is replaced)."""
    starts = [e["time"] for e in data.events if e["kind"] == "started" and e["time"] > fault.time]
    return min(starts) - fault.time if starts else None


@dataclass
class Figure:
    key: str
    label: str
    value: float | None
    unit: str
    target: str = ""
    ok: bool | None = None  # None: no target, or not judged in this configuration


def figures(
    config: Config,
    facts: SiteFacts,
    chaos: Execution,
    faults: list[Fault],
    reference_digests: dict[str, str],
    reference: Execution | None,
) -> list[Figure]:
    """Every figure of the chaos run, judged against the issue's targets where it has one."""
    data, n = chaos.data, len(chaos.data.names)
    out: list[Figure] = []

    def add(*fields: Any) -> None:
        out.append(Figure(*fields))

    finished = len(data.digests)
    equal = sum(name in data.digests and data.digests[name] == reference_digests.get(name) for name in data.names)
    add("members_finished", "members finished", finished, f"of {n}", f"= {n}", finished == n)
    add("digests_equal", "digests equal to the fault-free run", equal, f"of {n}", f"= {n}", equal == n)
    add("hung", "run killed at its timeout", int(chaos.timed_out), "runs", "= 0", not chaos.timed_out)
    exits = len(chaos.runner_exits)
    add("runner_exits", "runners that exited with members unfinished", exits, "runners", "= 0", exits == 0)
    status = chaos.returncode
    add("exit_status", "exit status of the last runner", status, "", "= 0", status == 0)

    injected = Counter(f.kind for f in faults if f.skipped is None)
    for kind in sorted({f.kind for f in faults}):
        add(f"faults_{kind}", f"faults injected: {kind}", injected[kind], "faults")
    skipped = sum(f.skipped is not None for f in faults)
    add("faults_skipped", "faults skipped (no target in time)", skipped, "faults", "= 0", skipped == 0)

    every = losses(data, faults, facts.workers)
    lost = [loss for loss in every if not loss.waiting]
    explained = [loss for loss in lost if loss.fault is not None]
    judged = [loss for loss in explained if not loss.through_full]
    steps = [loss.steps for loss in judged]
    median_lost = statistics.median(steps) if steps else 0
    spare = max(
        (loss.steps - (2 if loss.fault.kind == "shard-flip" else 1) * config.interval for loss in judged), default=0
    )
    add("checkpoint_interval", "checkpoint interval", config.interval, "steps")
    add("attempts_lost", "attempts ended by a fault", len(explained), "attempts")
    add(
        "steps_lost_median",
        "steps lost per attempt ended, median",
        median_lost,
        "steps",
        f"<= {config.interval}",
        median_lost <= config.interval,
    )
    add(
        "steps_lost_max",
        "steps lost per attempt ended, max",
        max(steps, default=0),
        "steps",
        f"<= {2 * config.interval} (+1 interval after a flip)",
        spare <= config.interval,
    )
    through = [loss.steps for loss in explained if loss.through_full]
    add(
        "steps_lost_through_full",
        "  attempts that lived through a full tier: steps lost, max",
        max(through, default=0),
        f"steps ({len(through)} attempts)",
    )
    twice = sum(
        count > 1 for count in Counter(e.get("member") for e in data.events if e["kind"] == "finished").values()
    )
    add("finished_twice", "members trained again after they had finished", twice, "members")
    unexplained = sum(loss.fault is None for loss in lost)
    add(
        "attempts_unexplained", "attempts lost that no fault explains", unexplained, "attempts", "= 0", unexplained == 0
    )

    restores = [loss.split.restore_s for loss in lost if loss.split and loss.split.restore_s is not None]
    restore_s = statistics.median(restores) if restores else 0.0
    add("restore_median", "restore (started -> training again), median", restore_s, "s")
    local = facts.name == "local"
    for kind in sorted(injected):
        mine = [loss for loss in every if loss.fault and loss.fault.kind == kind and loss.recovery_s is not None]
        struck = [f for f in faults if f.kind == kind and f.skipped is None]
        if mine:
            out.extend(recovery_figures(kind, mine))
        elif kind in WINDOWED and (windowed := [r for f in struck for r in window_recoveries(data, f)]):
            add(
                f"recovery_{kind}_median",
                f"recovery {kind} (to a step after it ended), median",
                statistics.median(windowed),
                "s",
            )
            add(
                f"recovery_{kind}_p95",
                f"recovery {kind} (to a step after it ended), p95",
                percentile(windowed, 0.95),
                "s",
            )
        else:
            waits = [w for f in struck if (w := next_start_s(data, f)) is not None]
            add(
                f"recovery_{kind}_next_start",
                f"recovery {kind}: ended no attempt alone; next member started",
                max(waits) if waits else None,
                "s (max)",
            )

    flips = flip_outcomes(data, faults)
    if flips:
        add(
            "flips_detected",
            "flipped shards detected on restore",
            flips["detected"],
            f"of {sum(flips.values())} ({flips['not exercised']} never restored)",
            "none restored damaged",
            flips["restored"] == 0,
        )

    struck = {f.kind for f in faults if f.skipped is None}
    if data.spanning and struck & set(NODE_LOSSES):
        resumes = node_loss_resumes(data, faults, data.spanning)
        for kind, what in (
            ("node-loss", "after one node: read nothing from the shared tier"),
            ("node-and-buddy-loss", "after a node and its buddy: read all from the shared tier"),
        ):
            if kind not in struck:
                continue
            mine = [r for r in resumes if r.kind == kind]
            good = sum(r.as_expected for r in mine)
            key = kind.replace("-", "_")
            add(
                f"{key}_resumes",
                f"2-node resumes {what}",
                good,
                f"of {len(mine)}",
                "= all (>= 1)",
                0 < good == len(mine),
            )
            for source in ("local", "peer", "shared"):
                read = sum(v for r in mine for k, v in r.bytes_from.items() if k.split(" on ")[0] == source)
                add(f"{key}_mib_{source}", f"  bytes read from {source} copies", read / 2**20, "MiB")

    if config.walltime_s is not None:
        drained = drains(data, faults, chaos.slurm_states)
        redone = drained.redone
        add("walltime", "block walltime", config.walltime_s, "s")
        add(
            "walltime_drained",
            "blocks drained before their walltime",
            drained.blocks_drained,
            "blocks",
            ">= 1",
            drained.blocks_drained >= 1,
        )
        add(
            "walltime_stops", "members stopped by a drain (exit 75)", drained.stops, "stops", ">= 1", drained.stops >= 1
        )
        add("walltime_declined", "starts declined near a drain", drained.declined, "starts")
        add(
            "walltime_retries",
            "retries spent on drained attempts",
            drained.retries,
            "retries",
            "= 0",
            drained.retries == 0,
        )
        add(
            "walltime_redone_median",
            "steps redone per drain, median",
            statistics.median(redone) if redone else 0,
            "steps",
        )
        add(
            "walltime_redone_max",
            "steps redone per drain, max",
            max(redone, default=0),
            "steps",
            f"<= {DRAIN_REDONE} (interval {config.interval})",
            max(redone, default=0) <= DRAIN_REDONE,
        )
        add(
            "walltime_timeouts",
            "blocks Slurm ended at their walltime (TIMEOUT)",
            drained.timeouts,
            "blocks",
            "= 0",
            drained.timeouts == 0,
        )
        add(
            "walltime_killed",
            "attempts killed by the walltime",
            len(drained.killed),
            "attempts",
            "= 0",
            not drained.killed,
        )

    cost = sum(float(e.get("cost", 0)) for e in data.events if e["kind"] == "failed")
    out_of = len(out_of_retries(data))
    add("retries_spent", "retries spent (cost of the failures)", cost, "retries")
    add("members_out_of_retries", "members that ran out of retries", out_of, "members", "= 0", out_of == 0)
    add(
        "watchdog_lost",
        "`lost` events (the runner's watchdog)",
        sum(e["kind"] == "lost" for e in data.events),
        "events",
    )

    add("runner_starts", "runner processes (run + resumes)", chaos.runner_starts, "processes")
    add("runner_cpu_s", "runner CPU", chaos.runner_cpu_s, "s")
    add("runner_cpu_per_member_ms", "runner CPU per member", 1000 * chaos.runner_cpu_s / n, "ms")
    add("runner_peak_rss_mib", "peak runner RSS", chaos.runner_peak_rss_mib, "MiB")
    add("members_cpu_s", "members' CPU (the workers')", chaos.members_cpu_s, "s")
    if chaos.members_cpu_s:
        add("runner_cpu_pct", "runner CPU / members' CPU", 100 * chaos.runner_cpu_s / chaos.members_cpu_s, "%")
    add("wall_s", "wall time", chaos.wall_s, "s")
    if reference is not None:
        share = 100 * reference.runner_cpu_s / reference.members_cpu_s if reference.members_cpu_s else None
        judge = config.judge_runner_cpu
        add("reference_runner_cpu_s", "fault-free run: runner CPU", reference.runner_cpu_s, "s")
        add(
            "reference_runner_cpu_per_member_ms",
            "fault-free run: runner CPU per member",
            1000 * reference.runner_cpu_s / n,
            "ms",
        )
        add("reference_members_cpu_s", "fault-free run: members' CPU", reference.members_cpu_s, "s")
        add(
            "reference_runner_cpu_pct",
            "fault-free run: runner CPU / members' CPU",
            share,
            "%",
            "<= 1" if judge else "(judged at 128+ members)",
            (share is not None and share <= 1) if judge else None,
        )
        add("reference_runner_peak_rss_mib", "fault-free run: peak runner RSS", reference.runner_peak_rss_mib, "MiB")
        add("reference_wall_s", "fault-free run: wall time", reference.wall_s, "s")
        add("wall_ratio", "wall time against the fault-free run", chaos.wall_s / reference.wall_s, "x")

    add("parsl_mib", "Parsl's logs in the run directory", data.parsl_mib, "MiB")
    add("torn_events", "torn lines in events.jsonl", data.torn_events, "lines", "= 0", data.torn_events == 0)
    add("torn_metrics", "torn lines in metrics.jsonl", data.torn_metrics, "lines", "= 0", data.torn_metrics == 0)
    roles = ["pool", "interchange", "pool process", "block script"] + ([] if local else ["Slurm job"])
    for role in roles:
        count = chaos.leftovers[role]
        add(
            f"leftover_{role.replace(' ', '_')}",
            f"leftover {role.replace('process', 'processe')}s",
            count,
            "jobs" if role == "Slurm job" else "processes",
            "= 0",
            count == 0,
        )
    return out


def out_of_retries(data: RunData) -> set[str]:
    """Members with a failure that was not retried: the runner emits ``retried`` right after
    ``failed`` while a retry is left, nothing otherwise."""
    waiting: dict[str, bool] = {}
    out = set()
    for event in data.events:
        name, kind = event.get("member"), event["kind"]
        if kind in ("failed", "retried", "submitted", "started") and waiting.get(name):
            if kind != "retried":
                out.add(name)
            waiting[name] = False
        if kind == "failed":
            waiting[name] = True
    return out | {name for name, pending in waiting.items() if pending and name not in data.digests}


# ---------------------------------------------------------------------- the preemption agent

#: Polls of its restart within which an agent killed between requeue and release must release.
AGENT_RELEASE_POLLS = 2
AGENT_INTERVAL_S = 0.2
#: The agent's heartbeat deadline in this scenario: a poll's heartbeat reads must end within it.
AGENT_DEADLINE_S = 1.0
#: Where a forged marker hides: in a path, glued to another word, in a heartbeat's path.
FORGED_COMMENTS = ("/x/rf-ondemand/y", "rf-ondemandx", "xrf-ondemand", "rf-heartbeat:/lus/rf-ondemand/hb.json")


@contextlib.contextmanager
def fake_pbspro(work: Path) -> Iterator[tuple[Path, Any]]:
    """The tests' fake PBS Pro commands first on ``PATH``, their jobs kept under ``work``; every job
    still alive is killed after. Yields the state directory and the fake's ``engine`` module."""
    sys.path.insert(0, str(REPO / "tests"))
    from fakesched import PBSPRO, engine

    state = work / "sched"
    saved = {name: os.environ.get(name) for name in ("PATH", engine.DIR_ENV, engine.QUEUE_SECONDS_ENV)}
    os.environ["PATH"] = f"{PBSPRO}{os.pathsep}{os.environ['PATH']}"
    os.environ[engine.DIR_ENV] = str(state)
    os.environ.pop(engine.QUEUE_SECONDS_ENV, None)
    try:
        yield state, engine
    finally:
        if state.exists():
            engine.delete_all(state)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def qsub(work: Path, *options: str, queued_s: float = 0.0) -> str:
    """A one-CPU job that runs until deleted; ``queued_s`` keeps it queued that long first."""
    script = work / "forever.pbs"
    script.write_text("#!/bin/bash\nwhile true; do sleep 0.1; done\n")
    env = {**os.environ, "FAKESCHED_QUEUE_SECONDS": str(queued_s)}
    argv = ["qsub", "-l", "select=1:ncpus=1", "-j", "oe", "-o", str(work / "jobs.out"), *options, str(script)]
    return subprocess.run(argv, check=True, capture_output=True, text=True, env=env, timeout=60).stdout.strip()


def pbs_job(batch: Any, job_id: str) -> Any:
    return next((job for job in batch.jobs() if job.id == job_id), None)


def wait_for(what: str, predicate: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def logged_events(path: Path) -> list[str]:
    return [json.loads(line)["event"] for line in path.read_text().splitlines()] if path.exists() else []


def agent_killed(work: Path, state: Path, engine: Any) -> dict[str, float]:
    """The agent (the real command) requeues a victim held, and is SIGKILLed before it releases it;
    the request starts on the freed node; a restarted agent must release the victim."""
    from resilient_flows.cosched._agent import Agent, AgentConfig
    from resilient_flows.cosched._pbspro import PBSProBatch

    batch = PBSProBatch(timeout=30)
    victim = qsub(work, "-N", "victim")
    wait_for("the victim running", lambda: (job := pbs_job(batch, victim)) and job.state == "running")
    request = qsub(work, "-q", "ondemand", "-N", "viz", queued_s=3600)
    log = work / "agent.jsonl"
    command = [str(CLI), "cosched", "agent", "--scheduler", "pbspro", "--partition-ondemand", "ondemand",
               "--interval", f"{AGENT_INTERVAL_S:g}", "--log", str(log)]  # fmt: skip
    with open(work / "agent.out", "ab") as out:
        first = subprocess.Popen(command, stdout=out, stderr=out)
        try:
            wait_for("the agent's requeue", lambda: "requeue" in logged_events(log))
        finally:
            first.kill()
            first.wait()
    held = pbs_job(batch, victim)
    engine.update(state, int(request.split(".")[0]), queue_seconds=0)  # the scheduler starts the request
    wait_for("the request running", lambda: (job := pbs_job(batch, request)) and job.state == "running")
    config = AgentConfig(ondemand_partition="ondemand", interval=AGENT_INTERVAL_S)
    again = Agent(batch, config, log_path=log, state_path=log.with_name(f"{log.stem}.state.json"))
    polls = 0
    while again.preempting and polls < 10 * AGENT_RELEASE_POLLS:
        again.poll()
        polls += 1
    wait_for("the victim running again", lambda: (job := pbs_job(batch, victim)) and job.state == "running", 30)
    subprocess.run(["qdel", victim, request], capture_output=True, timeout=60)
    return {"held_after_kill": float(held is not None and held.held), "polls_to_release": float(polls)}


def agent_heartbeats(work: Path) -> dict[str, float]:
    """Jobs name a FIFO and a 1 GiB (sparse) file as their heartbeats, beside one that is sound: the
    poll's reads end within the deadline, and only the sound one is believed."""
    from resilient_flows.checkpoint._heartbeat import FILENAME, CheckpointHeartbeat
    from resilient_flows.cosched._agent import Agent, AgentConfig
    from resilient_flows.cosched._pbspro import HEARTBEAT_VARIABLE, PBSProBatch

    paths = {name: work / name / FILENAME for name in ("sound", "fifo", "huge")}
    for path in paths.values():
        path.parent.mkdir()
    os.mkfifo(paths["fifo"])
    with paths["huge"].open("wb") as f:
        f.truncate(1 << 30)
    ids = {
        name: qsub(work, "-N", name, "-v", f"{HEARTBEAT_VARIABLE}=rf-heartbeat:{path}") for name, path in paths.items()
    }
    ids["request"] = qsub(work, "-q", "ondemand", "-N", "viz", queued_s=3600)
    batch = PBSProBatch(timeout=30)
    mine = {ids[name] for name in paths}
    wait_for("the jobs running", lambda: sum(job.state == "running" and job.id in mine for job in batch.jobs()) == 3)
    now = time.time()  # a checkpoint of the job's own run: after its start
    sound = CheckpointHeartbeat(step=1, committed=now, period=60.0, restore=5.0, written=now, host="n", pid=1)
    paths["sound"].write_text(json.dumps(asdict(sound)))
    config = AgentConfig(ondemand_partition="ondemand", dry_run=True, heartbeat_deadline=AGENT_DEADLINE_S)
    agent = Agent(batch, config)
    took: list[float] = []
    read = agent.reader.read

    def timed(wanted: Any) -> Any:
        began = time.monotonic()
        try:
            return read(wanted)
        finally:
            took.append(time.monotonic() - began)

    agent.reader.read = timed  # type: ignore[method-assign]
    decision = next(e for e in agent.poll() if e["event"] == "decision")
    seen = {r["id"]: r["last_checkpoint"] for r in decision["inputs"]["running"]}
    subprocess.run(["qdel", *ids.values()], capture_output=True, timeout=60)
    return {
        "heartbeat_read_s": took[0],
        "untrusted_believed": float(sum(seen[ids[name]] is not None for name in ("fifo", "huge"))),
        "sound_believed": float(seen[ids["sound"]] == sound.committed),
    }


def agent_forged(work: Path) -> dict[str, float]:
    """Markers forged where users write: in Slurm comments (a path, another word) and in a PBS
    job's environment. None may make a request, none may shield a running job."""
    from resilient_flows.cosched._agent import Agent, AgentConfig
    from resilient_flows.cosched._pbspro import HEARTBEAT_VARIABLE, PBSProBatch
    from resilient_flows.cosched._slurm import SlurmBatch

    now = int(time.time())

    def record(job_id: int, state: str, comment: str, partition: str = "batch") -> dict[str, Any]:
        return {"job_id": job_id, "name": f"j{job_id}", "user_name": "ann", "user_id": os.getuid(),
                "partition": partition, "job_state": state, "node_count": 1, "cpus": 1, "submit_time": now - 60,
                "start_time": now - 60 if state == "RUNNING" else 0, "time_limit": None, "comment": comment,
                "priority": 1, "state_reason": "None"}  # fmt: skip

    forged = [record(10 + i, "PENDING", comment) for i, comment in enumerate(FORGED_COMMENTS)]
    shields = [record(20 + i, "RUNNING", comment) for i, comment in enumerate(FORGED_COMMENTS)]
    genuine = [record(30, "PENDING", "rf-ondemand", partition="interactive")]
    squeue = json.dumps({"jobs": forged + shields + genuine})
    sinfo = json.dumps({"nodes": []})
    slurm = SlurmBatch(run=lambda argv: squeue if argv[0] == "squeue" else sinfo)
    requests: set[str] = set()
    shielded = 0
    for config in (AgentConfig(dry_run=True), AgentConfig(dry_run=True, ondemand_partition="interactive")):
        for event in Agent(slurm, config).poll():
            if event["event"] == "decision":
                requests.add(event["request"])
                shielded += len({str(r["job_id"]) for r in shields} - {r["id"] for r in event["inputs"]["running"]})
    batch = PBSProBatch(timeout=30)
    running = qsub(work, "-N", "steady")
    environment = f"{HEARTBEAT_VARIABLE}=rf-ondemand,NOTE=rf-ondemand"
    qsub(work, "-N", "forger", "-v", environment, queued_s=3600)
    wait_for("the PBS job running", lambda: (job := pbs_job(batch, running)) and job.state == "running")
    requests |= {e["request"] for e in Agent(batch, AgentConfig(dry_run=True)).poll() if e["event"] == "decision"}
    return {
        "forged_requests": float(len(requests - {"30"})),
        "forged_shields": float(shielded),
        "genuine_served": float("30" in requests),
    }


def agent_chaos(work: Path) -> list[Figure]:
    """The preemption agent's faults, against the tests' fake PBS Pro (and served Slurm output)."""
    for name in ("killed", "heartbeats"):
        (work / name).mkdir(parents=True)
    with fake_pbspro(work) as (state, engine):
        killed = agent_killed(work / "killed", state, engine)
        beats = agent_heartbeats(work / "heartbeats")
        forged = agent_forged(work)
    polls, read_s = killed["polls_to_release"], beats["heartbeat_read_s"]
    return [
        Figure("agent_held_after_kill", "victim held when the agent was killed", killed["held_after_kill"], "",
               "= 1", killed["held_after_kill"] == 1),
        Figure("agent_polls_to_release", "polls of the restarted agent until it released the victim", polls,
               "polls", f"<= {AGENT_RELEASE_POLLS}", polls <= AGENT_RELEASE_POLLS),
        Figure("agent_heartbeat_read_s", "heartbeat reads of a poll with a FIFO and a 1 GiB heartbeat", read_s, "s",
               f"<= {AGENT_DEADLINE_S:g} (deadline)", read_s <= AGENT_DEADLINE_S),
        Figure("agent_untrusted_believed", "FIFO and oversized heartbeats believed", beats["untrusted_believed"],
               "of 2", "= 0", beats["untrusted_believed"] == 0),
        Figure("agent_sound_believed", "sound heartbeat believed", beats["sound_believed"], "of 1", "= 1",
               beats["sound_believed"] == 1),
        Figure("agent_forged_requests", "forged markers taken for requests", forged["forged_requests"], "jobs", "= 0",
               forged["forged_requests"] == 0),
        Figure("agent_forged_shields", "running jobs a forged marker shielded", forged["forged_shields"], "jobs",
               "= 0", forged["forged_shields"] == 0),
        Figure("agent_genuine_served", "genuine request decided", forged["genuine_served"], "of 1", "= 1",
               forged["genuine_served"] == 1),
    ]  # fmt: skip


# ---------------------------------------------------------------------- report


def notes(execution: Execution, faults: list[Fault]) -> list[str]:
    """What went wrong beyond the figures, in words: runners that gave up, processes left over,
    each attempt lost that no fault explains, with its member's events around it, each restore
    after a node loss that read from other sources than expected, and each attempt the walltime
    killed."""
    data = execution.data
    odd = [r for r in node_loss_resumes(data, faults, data.spanning) if not r.as_expected]
    killed = drains(data, faults, execution.slurm_states).killed if execution.slurm_states else []
    t0 = min((e["time"] for e in data.events), default=0.0)
    unexplained = []
    for loss in losses(data, faults):
        if loss.fault is not None:
            continue
        mine = [e for e in by_member(data).get(loss.member, []) if e.get("attempt") in (loss.attempt, loss.attempt + 1)]
        told = "; ".join(f"{e['time'] - t0:.1f} {e['kind']}#{e.get('attempt')}" for e in mine)
        unexplained.append(f"unexplained: {loss.member} attempt {loss.attempt} ({loss.detected_by}): {told}")
    injected = "; ".join(f"{f.time - t0:.1f} {f.kind} {sorted(f.hit)}" for f in faults if f.skipped is None)
    return [
        *execution.runner_exits,
        *(f"left over: {leftover}" for leftover in execution.leftover_details),
        *unexplained,
        *([f"faults (s after the first event): {injected}"] if unexplained else []),
        *(
            f"{r.kind} of {', '.join(r.lost)}: {r.member} attempt {r.attempt} restored {r.step}, read {r.bytes_from}"
            for r in odd
        ),
        *(f"killed by the walltime: {attempt}" for attempt in killed),
    ]


def print_report(
    console: Console,
    title: str,
    found: list[Figure],
    faults: list[Fault],
    remarks: list[str],
    resumes: Iterable[Resume] = (),
) -> None:
    table = Table(title=title)
    for column in ("figure", "value", "unit", "target", "result"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for figure in found:
        value = "-" if figure.value is None else f"{figure.value:.4g}"
        result = {True: "[green]PASS", False: "[red]FAIL", None: ""}[figure.ok]
        table.add_row(figure.label, value, figure.unit, figure.target, result)
    console.print(table)
    timeline = Table(title="Faults")
    for column in ("burst", "t (s)", "kind", "members hit", "what"):
        timeline.add_column(column, justify="right" if column in ("burst", "t (s)") else "left")
    origin = min((f.time for f in faults if f.time), default=0.0)
    for fault in sorted(faults, key=lambda f: (f.time == 0, f.time, f.burst)):
        when = f"{fault.time - origin:.1f}" if fault.time else "-"
        what = fault.detail if fault.skipped is None else f"[yellow]skipped: {fault.skipped}"
        timeline.add_row(str(fault.burst), when, fault.kind, ", ".join(sorted(fault.hit)) or "-", what)
    if faults:
        console.print(timeline)
    resumes = list(resumes)
    if resumes:
        restores = Table(title="Restores of 2-node members after node losses (bytes per source)")
        for column in ("member", "attempt", "after", "lost", "on", "step", "read", "steps lost", "result"):
            restores.add_column(column, justify="right" if column in ("attempt", "step", "steps lost") else "left")
        for r in resumes:
            read = ", ".join(f"{k} {v / 2**10:.0f} KiB" for k, v in sorted(r.bytes_from.items())) or "nothing"
            result = "[green]PASS" if r.as_expected else "[red]FAIL"
            restores.add_row(
                r.member,
                str(r.attempt),
                r.kind,
                ", ".join(r.lost),
                ", ".join(r.hosts),
                "-" if r.step is None else str(r.step),
                read,
                str(r.lost_steps),
                result,
            )
        console.print(restores)
    for remark in remarks:
        console.print(remark, style="red", soft_wrap=True, markup=False)


def write_json(
    path: Path,
    meta: dict[str, Any],
    found: list[Figure],
    faults: list[Fault],
    remarks: list[str],
    resumes: Iterable[Resume] = (),
) -> None:
    document = {
        **meta,
        "figures": {f.key: {"value": f.value, "unit": f.unit, "label": f.label} for f in found},
        "checks": {
            f.key: {"label": f.label, "value": f.value, "target": f.target, "result": "PASS" if f.ok else "FAIL"}
            for f in found
            if f.ok is not None
        },
        "faults": [{**asdict(f), "doomed": sorted(f.doomed)} for f in faults],
        "restores_after_node_loss": [{**asdict(r), "as_expected": r.as_expected} for r in resumes],
        "notes": remarks,
    }
    harness.write_json(path, document)


def main(argv: list[str] | None = None) -> int:
    parser, _ = harness.options(
        __doc__, quick="4 paced members, two bursts of faults: a minute or a few", full="1,000 members of tiny steps"
    )
    parser.add_argument(
        "--slurm", action="store_true", help="on the local-slurm site (starts a cluster if none answers)"
    )
    parser.add_argument(
        "--nodes",
        action="store_true",
        help="on the local-nodes site: three emulated nodes with node-local tiers, and node-loss faults",
    )
    parser.add_argument(
        "--slurm-nodes",
        type=int,
        metavar="N",
        help="on local-slurm-nodes: a Slurm cluster of N >= 3 network namespaces, started here, and node crashes",
    )
    parser.add_argument(
        "--peer",
        action="store_true",
        help="with --slurm-nodes: half the members span two nodes with tiers [local, peer, shared], "
        "and node-and-buddy-loss faults",
    )
    parser.add_argument(
        "--walltime",
        type=duration_argument,
        metavar="D",
        help="with --slurm or --slurm-nodes: blocks of this walltime (whole minutes, e.g. 2m), drained before it",
    )
    parser.add_argument(
        "--kinds", metavar="K,K", help="only these kinds of fault (comma-separated; 'none': no fault at all)"
    )
    parser.add_argument(
        "--agent",
        action="store_true",
        help="instead: the preemption agent's faults, against the tests' fake PBS Pro (seconds)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the chaos schedule's seed (default 0)")
    parser.add_argument("--json", type=Path, help="write every figure with its unit, the checks and the faults")
    parser.add_argument("--dir", type=Path, help="working directory (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory and a copy of the chaos run")
    parser.add_argument("--timeout", type=float, help="seconds each run may take (default: from the reference)")
    args = parser.parse_args(argv)
    if args.slurm_nodes is not None and args.slurm_nodes < 3:
        parser.error("--slurm-nodes needs at least 3 nodes: blocks of 2, and one to spare when a node is lost")
    if sum((args.slurm, args.nodes, args.slurm_nodes is not None)) > 1:
        parser.error("choose one of --slurm, --nodes and --slurm-nodes")
    if args.peer and args.slurm_nodes is None:
        parser.error("--peer needs --slurm-nodes: members spanning nodes run on local-slurm-nodes")
    if args.walltime is not None and not (args.slurm or args.slurm_nodes is not None):
        parser.error("--walltime needs --slurm or --slurm-nodes: the runner learns when a block started from Slurm")
    if args.walltime is not None and (args.walltime < 60 or args.walltime % 60):
        parser.error("--walltime is whole minutes, at least 1m: Slurm's time limits are")
    size = harness.size_of(args)
    config = MODES[size]
    site = "local-slurm" if args.slurm else "local-nodes" if args.nodes else "local"
    if args.slurm_nodes is not None:
        site = "local-slurm-nodes"
    if args.peer:
        config = replace(config, peer_members=config.members // 2)
    if args.walltime is not None:
        config = walltime_config(config, args.walltime)
    kinds = site_kinds(site, config)
    if args.kinds is not None:
        chosen = () if args.kinds.strip() == "none" else tuple(k.strip() for k in args.kinds.split(",") if k.strip())
        unknown = [k for k in chosen if k not in kinds]
        if unknown:
            parser.error(f"--kinds: {', '.join(unknown)} not among this run's kinds ({', '.join(kinds)})")
        kinds = chosen
    console = harness.console()
    # SIGTERM (a CI timeout) unwinds like Ctrl-C: processes, mounts and clusters are cleaned up.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    work = Path(tempfile.mkdtemp(prefix="chaos-", dir=args.dir))
    if args.agent:
        return agent_main(console, work, args)
    try:
        if args.slurm_nodes is not None:
            cluster = slurm_nodes_cluster(console, args.slurm_nodes)
        else:
            cluster = slurm_cluster(console) if args.slurm else contextlib.nullcontext()
        with cluster:
            console.print(f"{size}: {config.members} members of {config.steps} steps on {site}; work in {work}")
            if config.span_s is None:
                reference = run_reference(config, work, site, args.timeout or 40.0 * config.members + 300)
                failures = [name for name in reference.data.names if name not in reference.data.digests]
                if failures or reference.timed_out:
                    console.print(f"[red]fault-free run unfinished ({len(failures)} members); see {reference.log}")
                    return 1
                digests = reference.data.digests
                shared_mib = max(512, int(4 * directory_mib(work / "reference")))
                span_s = 0.6 * members_span_s(reference.data)
                timeout_s = args.timeout or 3 * reference.wall_s + 120
                console.print(f"fault-free run: {reference.wall_s:.0f} s")
            else:  # no fault-free run to compare wall time and runner CPU with: the weights suffice
                # a node lost on local-slurm-nodes takes a minute to notice and replace
                patience = 400.0 if site == "local-slurm-nodes" else 200.0
                if config.peer_members:  # a node and its buddy lost: on three nodes, no block for 45 s
                    patience += 200.0
                if config.walltime_s is not None:  # members of 1.2 walltimes, two at a time, several blocks each
                    patience += 3 * WALLTIME_MEMBER * config.walltime_s * config.members
                reference, span_s, shared_mib, timeout_s = None, config.span_s, 256, args.timeout or patience
                (work / "reference").mkdir(parents=True)
                (work / "reference.yaml").write_text(workflow_yaml(config, site))
                digests = fault_free_digests(work / "reference.yaml", work / "reference")
                console.print(f"fault-free weights trained in this process ({len(digests)} members)")
            console.print(f"chaos over {span_s:.0f} s, seed {args.seed}, shared tier {shared_mib} MiB")
            if config.walltime_s is not None:
                console.print(f"blocks of {config.walltime_s / 60:g} min walltime")
            chaos, faults = run_chaos(
                config, work / "chaos", site, span_s, args.seed, shared_mib, timeout_s, console, args.keep, kinds
            )
        found = figures(config, SiteFacts.of(site), chaos, faults, digests, reference)
        resumes = node_loss_resumes(chaos.data, faults, chaos.data.spanning)
        print_report(
            console,
            f"Chaos: {config.members} members on {site}, seed {args.seed}",
            found,
            faults,
            notes(chaos, faults),
            resumes,
        )
        verdict = all(f.ok is not False for f in found)
        console.print(
            f"{'PASS' if verdict else 'FAIL'}; runner log: {chaos.log}" if args.keep else "PASS" if verdict else "FAIL"
        )
        if args.json:
            meta = {"mode": size, "site": site, "seed": args.seed, "config": asdict(config), "cpus": os.cpu_count()}
            meta["kinds"] = list(kinds)
            write_json(args.json, meta, found, faults, notes(chaos, faults), resumes)
        return 0 if verdict else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def walltime_config(config: Config, walltime_s: float) -> Config:
    """``config`` for blocks of ``walltime_s``: paced members slowed to last
    :data:`WALLTIME_MEMBER` walltimes each, and not held at a gate, where they could not stop for a
    drain (the harness's wait sits inside a step)."""
    params = dict(config.params)
    if config.workload == "chaos:paced":
        params["pause_ms"] = max(params.get("pause_ms", 0), round(1000 * WALLTIME_MEMBER * walltime_s / config.steps))
    return replace(config, params=params, hold=False, walltime_s=walltime_s)


def agent_main(console: Console, work: Path, args: argparse.Namespace) -> int:
    """``--agent``: run the agent's faults, report them like a chaos run."""
    try:
        found = agent_chaos(work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_report(console, "Chaos: the preemption agent (fake PBS Pro, served Slurm output)", found, [], [])
    verdict = all(f.ok is not False for f in found)
    console.print("PASS" if verdict else "FAIL")
    if args.json:
        write_json(args.json, {"mode": "agent", "cpus": os.cpu_count()}, found, [], [])
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
