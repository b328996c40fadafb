"""Slurm as the harness needs it: the run's pilot jobs and their states, a cluster that answers
(started for the run when none does), and nodes of a namespaced cluster that crash and boot.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from clusterenv import read_env_file
from rich.console import Console

from chaoslib.config import REPO

SLURM_ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}


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
