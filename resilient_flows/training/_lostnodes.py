"""The nodes a block lost, so that no member launches there again: spare nodes inside the allocation.

A block submitted so that a node's death does not end it (Slurm's ``--no-kill``, PBS Pro's
``tolerate_node_failures``; see :mod:`resilient_flows.sites._spares`) keeps running on the nodes
left. Whoever learns of a death first (the launch watcher of a member whose step lost a rank:
:mod:`resilient_flows.training._nodewatch`) records the node in
``<run>/blocks/<job>/lost-nodes.json``; every later launch in that block reads it and leaves the
node out (:func:`resilient_flows.apps.launch_prefix`), so a member whose node died restarts at
once on a spare node of the same block. The record is keyed by the scheduler's job id, not Parsl's
block number, which a new runner starts again from 0.

Only light modules here: this runs in the worker that launches a member, which imports no torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
import socket
import subprocess
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from resilient_flows.rundir import run_layout
from resilient_flows.training._nodefile import pbs_hosts

#: Where a block's nodes answer if alive: Slurm's slurmd (its default port; the cluster's
#: ``SlurmdPort`` wins, see :func:`probe_port`), PBS Pro's MOM.
SLURMD_PORT = 6818
PBS_MOM_PORT = 15002
#: Seconds a node may take to accept a connection before it counts as dead.
PROBE_TIMEOUT_S = 1.0


def current_job(env: Mapping[str, str]) -> str | None:
    """The batch job (the block) this process runs in: Slurm's or PBS Pro's job id; None outside both."""
    return env.get("SLURM_JOB_ID") or env.get("PBS_JOBID") or None


def read_lost(run_dir: str, env: Mapping[str, str]) -> list[str]:
    """The nodes the block of ``env`` lost, as recorded in ``run_dir``; none when nothing is recorded
    (or the record is damaged: a launch then risks the lost node rather than failing)."""
    job = current_job(env)
    if job is None:
        return []
    try:
        record = run_layout(run_dir).read_lost_nodes(job)
    except (OSError, ValueError):
        return []
    hosts = record.get("nodes") if isinstance(record, dict) else None
    return [str(h) for h in hosts] if isinstance(hosts, list) else []


def record_lost(run_dir: str, env: Mapping[str, str], hosts: Iterable[str]) -> list[str]:
    """Add ``hosts`` to the lost nodes of the block of ``env``; all its lost nodes, in the order lost.

    Two members' watchers of one block may learn of deaths at the same moment: the record is read
    and rewritten under a lock beside it, so that neither drops the other's node."""
    job = current_job(env)
    if job is None:
        return list(dict.fromkeys(hosts))
    path = run_layout(run_dir).lost_nodes(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        known = read_lost(run_dir, env)
        lost = list(dict.fromkeys([*known, *hosts]))
        if lost != known:
            run_layout(run_dir).write_lost_nodes(job, {"job": job, "nodes": lost})
    return lost


def job_hosts(env: Mapping[str, str]) -> list[str]:
    """The block's nodes, in order: Slurm's job node list expanded, or PBS Pro's node file."""
    if env.get("SLURM_JOB_NODELIST"):
        done = subprocess.run(
            ["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return done.stdout.split() if done.returncode == 0 else []
    if env.get("PBS_NODEFILE"):
        return pbs_hosts(env["PBS_NODEFILE"])
    return []


def probe_port(env: Mapping[str, str]) -> int:
    """The port a live node of this block answers on: slurmd's (as the cluster configures it) or
    PBS Pro's MOM."""
    if not env.get("SLURM_JOB_ID"):
        return PBS_MOM_PORT
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
        found = re.search(r"(?m)^SlurmdPort\s*=\s*(\d+)", done.stdout)
        if found:
            return int(found.group(1))
    return SLURMD_PORT


def dead_hosts(hosts: Iterable[str], port: int, timeout: float = PROBE_TIMEOUT_S) -> list[str]:
    """The ``hosts`` whose node daemon does not accept a connection: refused (the node is up, its
    daemon gone) or silent for ``timeout`` (the node is gone). All probed at once."""
    hosts = list(hosts)

    def dead(host: str) -> bool:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError:
            return True
        return False

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(len(hosts), 16)) as pool:
        verdicts = list(pool.map(dead, hosts))
    return [host for host, gone in zip(hosts, verdicts, strict=True) if gone]
