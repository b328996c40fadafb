"""A block's end on one Slurm cluster never kills a process of the same-numbered job of another.

Two clusters of ``.ci/slurm-up`` on one machine both number their jobs from 1: the one of the
Slurm tests (``SLURM_CONF``) and a second one that the test starts (about a second) and stops
however it ends. Job numbers are made to match; another runner's process in the second cluster's
job survives this run's drain, resume's cancel and the lease guard's orphan stop of the same
numbered block, while this run's own leftovers are killed each time. Names say "slurm": under
xdist this takes the Slurm tests' turn (``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import parsl
import pytest
from conftest import REPO
from requires import require
from slurm import cancel, leave_orphan, require_slurm, slurm_jobs, slurm_problem, wait_for

from resilient_flows.sites import SiteFile
from resilient_flows.workflow._blocks import BlockLedger, process_start_time, retire_block
from resilient_flows.workflow._stragglers import TOKEN_ENV, carry_token, new_token

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.timeout(300)]

LABEL = "local-slurm"
SLEEP = "import time; time.sleep(300)"


@pytest.fixture
def other_cluster() -> Iterator[dict[str, str]]:
    """The environment of a second one-node cluster, stopped (and its folder removed) afterwards."""
    require_slurm()
    require(os.geteuid() == 0, ".ci/slurm-up needs root")
    folder = tempfile.mkdtemp(prefix="slurm-other.", dir="/tmp")  # short: munged's socket lives there
    try:
        up = subprocess.run([REPO / ".ci/slurm-up", folder], capture_output=True, text=True, timeout=180)
        assert up.returncode == 0, up.stderr
        env = {**os.environ, "SLURM_CONF": f"{folder}/slurm.conf"}
        assert slurm_problem(env) is None
        yield env
    finally:
        subprocess.run([REPO / ".ci/slurm-down", folder], capture_output=True, timeout=180, check=False)


def submit_held(count: int, env: Mapping[str, str]) -> list[int]:
    """Submit ``count`` held jobs and cancel them: each takes a job number; their numbers."""
    loop = 'for _ in $(seq "$1"); do sbatch -H --parsable -J rf-pad -o /dev/null --wrap true || exit 1; done'
    out = subprocess.run(
        ["bash", "-c", loop, "pad", str(count)], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    numbers = [int(line.split(";")[0]) for line in out.stdout.split()]
    cancel(map(str, numbers), env)
    return numbers


def align_job_numbers(one: Mapping[str, str], other: Mapping[str, str]) -> None:
    """Make the next job of both clusters get the same number."""
    (a,), (b,) = submit_held(1, one), submit_held(1, other)
    if a != b:
        submit_held(abs(a - b), one if a < b else other)


def start_python(env: Mapping[str, str]) -> tuple[subprocess.Popen, int]:
    """A sleeping process of this Python in ``env``, once it runs; its start time."""
    process = subprocess.Popen([sys.executable, "-c", SLEEP], env=dict(env))
    wait_for(lambda: Path(f"/proc/{process.pid}/cmdline").read_bytes().startswith(sys.executable.encode()), 30, "it")
    started = process_start_time(process.pid)
    assert started is not None
    return process, started


def alive(pid: int, started: int) -> bool:
    """Whether process ``pid`` that started at ``started`` still runs (a zombie does not)."""
    try:
        return process_start_time(pid) == started and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][1] != "Z"
    except OSError:
        return False


@pytest.fixture
def leftovers() -> Iterator[dict[int, int]]:
    """pid -> start time of processes the test started; those still alive are killed afterwards."""
    found: dict[int, int] = {}
    yield found
    for pid, started in found.items():
        if alive(pid, started):
            with contextlib.suppress(ProcessLookupError):  # it may end between the look and the kill
                os.kill(pid, signal.SIGKILL)


def test_a_slurm_block_of_this_run_spares_the_same_job_of_another_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other_cluster: dict[str, str], leftovers: dict[int, int]
) -> None:
    tests_dir = str(Path(__file__).parent)  # workers import `leave_orphan` from tests/slurm.py
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p))
    # Parsl starts its interchange by name, from beside this Python (as the runner makes sure).
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    here = dict(os.environ)
    align_job_numbers(here, other_cluster)

    # Another runner's process, in the other cluster's next job: same number, same Python.
    pid_file = tmp_path / "sentinel.pid"
    program = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    sentinel_env = {**other_cluster, TOKEN_ENV: new_token()}
    command = f'exec {sys.executable} -c "{program}"'
    submitted = subprocess.run(
        ["sbatch", "--parsable", "-J", "rf-sentinel", "-o", str(tmp_path / "sentinel.out"), "--wrap", command],
        env=sentinel_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    job = submitted.stdout.strip().split(";")[0]
    wait_for(lambda: pid_file.is_file() and pid_file.read_text() != "", 60, "the sentinel to start")
    sentinel = int(pid_file.read_text())
    sentinel_started = process_start_time(sentinel)
    assert sentinel_started is not None
    leftovers[sentinel] = sentinel_started
    assert f"SLURM_JOB_ID={job}".encode() in Path(f"/proc/{sentinel}/environ").read_bytes().split(b"\0")

    ledger = BlockLedger(tmp_path)
    config = SiteFile.open(LABEL).config(run_dir=str(tmp_path / "parsl"))
    carry_token(config, ledger.token)  # as the runner's configuration does
    kernel = parsl.load(config)
    executor = kernel.executors[LABEL]
    try:
        in_job, orphan, token = parsl.python_app(leave_orphan)().result(timeout=180)
        orphan_started = process_start_time(orphan)
        assert orphan_started is not None
        leftovers[orphan] = orphan_started
        assert (in_job, token) == (job, ledger.token), "this run's block is not the other cluster's job number"
        ledger.record([executor])
        (block,) = executor.blocks_to_job_id

        # The walltime drain (and the watchdog) end a block this way; the runner reaps what is left.
        assert retire_block(executor, block)
        wait_for(lambda: dict(slurm_jobs()).get(job) not in ("RUNNING", "COMPLETING"), 60, f"job {job} to end")
        assert alive(orphan, orphan_started), "Slurm killed the orphan itself: nothing left to reap"
        ledger.reap([executor])
        wait_for(lambda: not alive(orphan, orphan_started), 30, "this run's orphan to be killed")
        assert alive(sentinel, sentinel_started)
    finally:
        job_ids = list(executor.provider.resources)
        try:
            kernel.cleanup()
        finally:
            cancel(job_ids)

    # resume's cancel of an earlier runner's blocks, then the lease guard's orphan stop of a dead
    # runner's: both find leftovers of the recorded block (ours carry the token, the sentinel not).
    later = BlockLedger(tmp_path, runner=-1)
    cancels = {
        "cancel": lambda executors: later.cancel_previous(executors),
        "orphan stop": lambda executors: later.cancel_runner(ledger.runner, executors),
    }
    for what, cancel_blocks in cancels.items():
        ours, ours_started = start_python({**here, "SLURM_JOB_ID": job, TOKEN_ENV: ledger.token})
        leftovers[ours.pid] = ours_started
        cancel_blocks(SiteFile.open(LABEL).config(run_dir=str(tmp_path / "parsl")).executors)
        assert ours.wait(timeout=30) == -signal.SIGKILL, what
        assert alive(sentinel, sentinel_started), what
    assert dict(slurm_jobs(env=other_cluster)).get(job) == "RUNNING"
    cancel([job], other_cluster)
