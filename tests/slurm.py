"""Helpers for tests that need a real Slurm cluster, such as the one ``.ci/slurm-up`` starts.

The Slurm commands find the cluster through ``SLURM_CONF`` (``eval "$(.ci/slurm-up)"`` sets it).
Without a cluster the tests skip, except where ``RESILIENT_FLOWS_REQUIRE_SLURM=1`` or
``RESILIENT_FLOWS_REQUIRE_ALL=1`` (as in CI, see ``tests/requires.py``): there they fail, so that a
broken cluster can never pass for a green run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from requires import unmet

__all__ = [
    "cancel",
    "cancel_all",
    "clear_cluster",
    "leave_orphan",
    "require_slurm",
    "slurm_jobs",
    "slurm_problem",
    "wait_for",
    "worker_job_id",
]

SKIP_REASON = "no Slurm cluster: run .ci/slurm-up"
#: Node states (``sinfo %t``) in which the node can run jobs now or soon.
_USABLE = {"idle", "mix", "alloc", "comp"}


def _run(*args: str, timeout: float = 20, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, env=env)


def slurm_problem(env: Mapping[str, str] | None = None) -> str | None:
    """Why the Slurm cluster cannot run jobs now, or None when it can; ``env`` (its
    ``SLURM_CONF``) names another cluster than this process's."""
    if shutil.which("sinfo") is None:
        return "sinfo is not on PATH"
    try:
        result = _run("sinfo", "-h", "-o", "%t", env=env)
    except subprocess.TimeoutExpired:
        return "sinfo timed out"
    if result.returncode != 0:
        lines = (result.stderr.strip() or result.stdout.strip() or f"exit status {result.returncode}").splitlines()
        return f"sinfo failed: {lines[-1]}"
    states = set(result.stdout.split())
    if not states & _USABLE:
        return f"no node can run jobs (node states: {', '.join(sorted(states)) or 'none'})"
    return None


def require_slurm() -> None:
    """Return if a Slurm controller answers and a node can run jobs; skip the test otherwise.

    With ``RESILIENT_FLOWS_REQUIRE_SLURM=1`` (or ``RESILIENT_FLOWS_REQUIRE_ALL=1``) a missing cluster
    fails the test instead of skipping it.
    """
    problem = slurm_problem()
    if problem is None:
        return
    where = f"SLURM_CONF={os.environ.get('SLURM_CONF', '(unset)')}"
    if os.environ.get("RESILIENT_FLOWS_REQUIRE_SLURM") == "1":
        pytest.fail(f"RESILIENT_FLOWS_REQUIRE_SLURM=1 but {problem} ({where})", pytrace=False)
    unmet(f"{SKIP_REASON} ({problem}; {where})")


def slurm_jobs(name_prefix: str | None = None, env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(job_id, state)`` of the jobs the controller knows, finished ones included (for ``MinJobAge``).

    ``name_prefix`` keeps only jobs whose name starts with it (Parsl names its blocks
    ``parsl.<executor label>.block-<n>.<time>``); ``env`` names another cluster.
    """
    result = _run("squeue", "-h", "-t", "all", "-o", "%i|%T|%j", env=env)
    if result.returncode != 0:
        raise RuntimeError(f"squeue failed: {result.stderr.strip()}")
    jobs = []
    for line in result.stdout.splitlines():
        job_id, state, name = line.split("|", 2)
        if name_prefix is None or name.startswith(name_prefix):
            jobs.append((job_id, state))
    return jobs


def cancel(job_ids: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    """``scancel`` these jobs (finished or unknown ones are fine)."""
    ids = [str(job_id) for job_id in job_ids]
    if ids:
        _run("scancel", *ids, env=env)


_ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}


def cancel_all(name_prefix: str | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """Cancel every pending or running job (whose name starts with ``name_prefix``); their ids."""
    ids = [job_id for job_id, state in slurm_jobs(name_prefix, env) if state in _ACTIVE]
    cancel(ids, env)
    return ids


def worker_job_id(sleep_s: float = 0) -> str | None:
    """A Parsl app body: sleep, then return the Slurm job the worker runs in (``SLURM_JOB_ID``).

    Workers import it from this module, so ``tests/`` must be on their ``PYTHONPATH``; a pilot job
    inherits the environment that ``sbatch`` ran in.
    """
    time.sleep(sleep_s)
    return os.environ.get("SLURM_JOB_ID")


def leave_orphan() -> tuple[str | None, int, str | None]:
    """A Parsl app body: start a sleeping process of this Python that outlives the pilot job where
    Slurm tracks a job's processes by parentage (``proctrack/linuxproc``): its parent exits at once.
    The job the worker runs in, the orphan's pid, and the runner's token the worker carries."""
    import sys

    from resilient_flows.workflow._stragglers import TOKEN_ENV

    program = (
        "import subprocess, sys\n"
        "sleeper = [sys.executable, '-c', 'import time; time.sleep(300)']\n"
        "print(subprocess.Popen(sleeper, start_new_session=True, stdin=subprocess.DEVNULL,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)\n"
    )
    parent = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    return os.environ.get("SLURM_JOB_ID"), int(parent.stdout), os.environ.get(TOKEN_ENV)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, poll_s: float = 0.2) -> None:
    """Return once ``predicate`` holds; fail the test, naming ``what``, after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll_s)


def clear_cluster(timeout: float = 60) -> list[str]:
    """Cancel every job still pending or running and wait until they have all ended; their ids."""
    left = cancel_all()
    wait_for(lambda: not [j for j, state in slurm_jobs() if j in left and state in _ACTIVE], timeout, "them to end")
    return left


def node_local_tier(spec: Any) -> str:
    """A planned member's node-local tier: its path still names the node (``${SLURMD_NODENAME}``)."""
    tier = spec.checkpoint.tier("local")
    assert tier is not None, spec.checkpoint
    return str(tier.path)


def remove_node_scratch(local_dir: str, cluster: Mapping[str, str]) -> None:
    """A run's node-local directory (``local_dir``, a checkpoint tier's, with ``${SLURMD_NODENAME}``
    in it) removed from every node of the multi-node cluster: its checkpoints and peer copies."""
    for node in cluster["RESILIENT_FLOWS_TEST_NODES"].split():
        shutil.rmtree(Path(local_dir.replace("${SLURMD_NODENAME}", node)).parent, ignore_errors=True)
