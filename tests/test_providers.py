"""Batch providers against fake schedulers: CobaltProvider and the PBSProProvider of polaris.yaml.

The fake ``qsub``/``qstat``/``qdel`` in ``tests/fakesched`` speak Cobalt's and PBS Pro's syntax and
output formats and run each job script on this machine in its own process group, so submit, poll
and cancel go through the same command lines as on Theta or Polaris.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import parsl
import pytest
from fakesched import COBALT, PBSPRO, engine
from parsl.jobs.states import JobState
from parsl.launchers import AprunLauncher
from parsl.providers import PBSProProvider
from parsl.providers.errors import SubmitException

from resilient_flows.errors import SiteConfigError
from resilient_flows.sites import CobaltProvider, load_site
from resilient_flows.sites.cobalt._cobalt import parse_job_id, parse_qstat, translate_table, walltime_to_minutes
from resilient_flows.units import parse_size


@pytest.fixture
def sched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh fake-scheduler state directory; every job still alive at the end is killed."""
    state = tmp_path / "sched"
    monkeypatch.setenv(engine.DIR_ENV, str(state))
    # Jobs and launchers write beside the submitter (site files cd to ${PWD}): keep that in tmp_path.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", str(tmp_path))
    monkeypatch.delenv(engine.QUEUE_SECONDS_ENV, raising=False)
    yield state
    if state.exists():
        engine.delete_all(state)


@pytest.fixture
def cobalt(sched: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATH", f"{COBALT}{os.pathsep}{os.environ['PATH']}")
    return sched


@pytest.fixture
def pbspro(sched: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATH", f"{PBSPRO}{os.pathsep}{os.environ['PATH']}")
    return sched


def task(tmp_path: Path) -> tuple[str, Path, Path]:
    """A command for each launched task: record rank and job, then wait for ``release`` to appear.

    The launchers write it through an unquoted heredoc, so ``$MARK`` expands in the job script (after
    worker_init has set it) and the escaped names in each task, where aprun/mpiexec have set them.
    """
    out, release = tmp_path / "ranks.txt", tmp_path / "release"
    record = r'echo "$MARK rank=\${ALPS_APP_PE:-\$PALS_RANKID} job=\${COBALT_JOBID:-\$PBS_JOBID}"'
    return f"{record} >> {out}; while [ ! -e {release} ]; do sleep 0.05; done", out, release


def wait_for(provider, job_id: str, state: JobState, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = provider.status([job_id])[0].state
        if seen == state:
            return
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {seen} after {timeout} s, expected {state}")


def live_processes(state_dir: Path, job_id: str, settle: float = 0.0) -> list[int]:
    """The job's processes that are not zombies (init here does not reap), waiting up to ``settle`` s
    for them to go."""
    pgid = int((state_dir / "jobs" / f"{job_id.split('.')[0]}.pid").read_text())
    deadline = time.monotonic() + settle
    while True:
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
            except (OSError, IndexError, ValueError):
                continue
            if int(pgrp) == pgid and state != "Z":
                found.append(int(stat.parent.name))
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def cobalt_provider(tmp_path: Path, **kwargs) -> CobaltProvider:
    options = {
        "account": "proj",
        "queue": "debug-cache-quad",
        "worker_init": "export MARK=initialised",
        "launcher": AprunLauncher(overrides="-d 64 --cc depth"),
        "walltime": "00:04:30",
        "cmd_timeout": 20,
        **kwargs,
    }
    provider = CobaltProvider(**options)
    provider.script_dir = str(tmp_path / "submit_scripts")
    os.makedirs(provider.script_dir)
    return provider


# --- Cobalt -------------------------------------------------------------------------------------


def test_cobalt_job_is_queued_runs_and_completes(cobalt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(engine.QUEUE_SECONDS_ENV, "1")
    provider = cobalt_provider(tmp_path, nodes_per_block=2)
    command, out, release = task(tmp_path)

    job_id = provider.submit(command, tasks_per_node=1, job_name="block-0")

    assert provider.status([job_id])[0].state == JobState.PENDING
    wait_for(provider, job_id, JobState.RUNNING)
    record = engine.record(cobalt, int(job_id))
    script = record["command"][0]
    prefix = script.removesuffix(".submit")
    assert record["argv"] == [
        *("qsub", "-n", "2", "-t", "5", "-q", "debug-cache-quad", "-A", "proj", "--mode", "script"),
        *("-O", prefix, script),
    ]
    text = Path(script).read_text()
    assert "export MARK=initialised" in text
    assert "aprun -n 2 -N 1 -d 64 --cc depth /bin/bash" in text
    assert text.index("export MARK=initialised") < text.index("aprun")

    release.touch()
    wait_for(provider, job_id, JobState.COMPLETED)
    assert sorted(out.read_text().splitlines()) == [
        f"initialised rank=0 job={job_id}",
        f"initialised rank=1 job={job_id}",
    ]
    status = provider.status([job_id])[0]
    assert status.stdout_path == prefix + ".output" and "Done" in Path(status.stdout_path).read_text()
    assert "exited with status 0" in Path(prefix + ".cobaltlog").read_text()


def test_cobalt_cancel_kills_the_job_and_its_processes(cobalt: Path, tmp_path: Path) -> None:
    provider = cobalt_provider(tmp_path)
    command, out, _ = task(tmp_path)  # never released
    job_id = provider.submit(command, tasks_per_node=1)
    wait_for(provider, job_id, JobState.RUNNING)
    while not out.exists():
        time.sleep(0.05)
    assert live_processes(cobalt, job_id)

    assert provider.cancel([job_id]) == [True]

    assert provider.status([job_id])[0].state == JobState.CANCELLED
    assert live_processes(cobalt, job_id, settle=3) == []
    listing = subprocess.run(["qstat", "-u", engine.user()], capture_output=True, text=True, check=True).stdout
    assert parse_qstat(listing) == {}


def test_cobalt_submit_failure_raises_with_the_scheduler_message(cobalt: Path, tmp_path: Path) -> None:
    provider = cobalt_provider(tmp_path, account=None)
    with pytest.raises(SubmitException) as caught:
        provider.submit("true", tasks_per_node=1)
    assert "project needed" in caught.value.stderr
    assert provider.resources == {}


def test_cobalt_scheduler_options_reach_qsub(cobalt: Path, tmp_path: Path) -> None:
    provider = cobalt_provider(tmp_path, scheduler_options="--attrs mcdram=cache:numa=quad --jobname probe")
    job_id = provider.submit("true", tasks_per_node=1)
    record = engine.record(cobalt, int(job_id))
    assert record["attrs"] == {"mcdram": "cache", "numa": "quad"} and record["name"] == "probe"
    wait_for(provider, job_id, JobState.COMPLETED)


def test_fake_cobalt_rejects_unknown_flags(cobalt: Path, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    script.chmod(0o755)
    result = subprocess.run(
        ["qsub", "-n", "1", "-t", "5", "-A", "p", "--mode", "script", "--nodes", "2", str(script)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "qsub: error: no such option: --nodes" in result.stderr
    script.chmod(0o644)
    result = subprocess.run(
        ["qsub", "-n", "1", "-t", "5", "-A", "p", "--mode", "script", str(script)], capture_output=True, text=True
    )
    assert result.returncode == 1 and "is not executable" in result.stderr


QSTAT = """\
    JobID  User     WallTime  Nodes  State      Location
========================================================
  1042877  alice    00:30:00  128    running    3824-3951
  1042880  alice    01:00:00  2      queued     None
  1042881  alice    01:00:00  2      user_hold  None
"""


def test_parse_qstat_reads_cobalt_tables_by_column_name() -> None:
    assert parse_qstat(QSTAT) == {"1042877": "running", "1042880": "queued", "1042881": "user_hold"}
    custom = "State    JobID    Queue\n==========================\nexiting  1042877  default\n"
    assert parse_qstat(custom) == {"1042877": "exiting"}
    assert parse_qstat("JobID  User  WallTime  Nodes  State  Location\n=====\n") == {}
    assert [translate_table[s] for s in ("queued", "user_hold", "starting", "running", "exiting", "killing")] == [
        JobState.PENDING,
        JobState.HELD,
        JobState.RUNNING,
        JobState.RUNNING,
        JobState.COMPLETED,
        JobState.CANCELLED,
    ]


def test_job_id_and_walltime_helpers() -> None:
    assert parse_job_id("1042877\n") == "1042877"
    assert parse_job_id('Job routed to queue "debug-cache-quad".\n1042877\n') == "1042877"
    assert parse_job_id("failed to create the job\n") is None
    assert walltime_to_minutes("00:00:30") == 1 and walltime_to_minutes("01:30:01") == 91
    with pytest.raises(ValueError, match="HH:MM:SS"):
        CobaltProvider(walltime="90")


def test_cobalt_provider_comes_from_a_site_file(tmp_path: Path) -> None:
    site = tmp_path / "cobalt.yaml"
    site.write_text(
        "executors:\n  - type: HighThroughputExecutor\n    provider:\n      type: CobaltProvider\n"
        "      queue: debug-flat-quad\n      nodes_per_block: 4\n"
    )
    provider = load_site(site).executors[0].provider
    assert isinstance(provider, CobaltProvider) and provider.queue == "debug-flat-quad"
    assert provider.nodes_per_block == 4 and isinstance(provider.launcher, AprunLauncher)
    site.write_text(site.read_text().replace("4\n", "'4'\n"))
    with pytest.raises(SiteConfigError, match=r"executors\[0\]\.provider \(CobaltProvider\): .*nodes_per_block"):
        load_site(site)


# --- PBS Pro (Polaris) ---------------------------------------------------------------------------


@pytest.fixture
def polaris(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> PBSProProvider:
    monkeypatch.setenv("PROJECT", "proj")
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    monkeypatch.delenv("PBS_QUEUE", raising=False)
    provider = load_site("polaris").executors[0].provider
    provider.script_dir = str(tmp_path / "submit_scripts")
    os.makedirs(provider.script_dir)
    # The venv that worker_init activates carries a real MPICH mpiexec: keep the fake one first.
    provider.worker_init += f"; export PATH={PBSPRO}:$PATH; export MARK=initialised"
    return provider


def test_pbspro_job_from_polaris_yaml_is_queued_runs_and_completes(
    pbspro: Path, polaris: PBSProProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(engine.QUEUE_SECONDS_ENV, "3600")  # queued until the test lets it start
    command, out, release = task(tmp_path)

    job_id = polaris.submit(command, tasks_per_node=1, job_name="block-0")

    assert job_id.endswith(".pbs-server")
    assert polaris.status([job_id])[0].state == JobState.PENDING
    engine.update(pbspro, int(job_id.split(".")[0]), queue_seconds=0)
    wait_for(polaris, job_id, JobState.RUNNING)
    record = engine.record(pbspro, int(job_id.split(".")[0]))
    script = Path(record["argv"][-1])
    assert record["argv"] == ["-q", "debug", "-A", "proj", str(script)]
    assert record["resources"]["select"] == "1:ncpus=32:ngpus=4"
    assert record["resources"]["filesystems"] == "home:eagle"
    text = script.read_text()
    assert "module use /soft/modulefiles; module load conda; conda activate;" in text
    assert "mpiexec --cpu-bind none --depth=64 --ppn 1 -n $WORKERCOUNT --hostfile $HOSTFILE" in text

    release.touch()
    wait_for(polaris, job_id, JobState.COMPLETED)
    assert out.read_text() == f"initialised rank=0 job={job_id}\n"
    # Parsl counts E (exiting) as completed already; the job leaves E for F once the node is clear.
    deadline = time.monotonic() + 10
    while (job := pbs_job(job_id))["job_state"] != "F" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job["job_state"] == "F" and job["Exit_status"] == 0


def pbs_job(job_id: str) -> dict:
    """The job's entry in ``qstat -x -f -F json``, the document Parsl's PBSProProvider reads."""
    document = subprocess.run(["qstat", "-x", "-f", "-F", "json", job_id], capture_output=True, text=True, check=True)
    return json.loads(document.stdout)["Jobs"][job_id]


def test_pbspro_cancel_kills_the_job_and_its_processes(pbspro: Path, polaris: PBSProProvider, tmp_path: Path) -> None:
    command, out, _ = task(tmp_path)
    job_id = polaris.submit(command, tasks_per_node=1)
    wait_for(polaris, job_id, JobState.RUNNING)
    while not out.exists():
        time.sleep(0.05)

    assert polaris.cancel([job_id]) == [True]

    assert live_processes(pbspro, job_id, settle=3) == []
    polaris._status()
    assert polaris.resources[job_id]["status"].state == JobState.COMPLETED  # PBS keeps it as F
    gone = subprocess.run(["qstat", job_id], capture_output=True, text=True)
    assert gone.returncode == 35 and "Job has finished" in gone.stderr


def test_fake_pbspro_rejects_unknown_flags(pbspro: Path) -> None:
    result = subprocess.run(["qstat", "-Z"], capture_output=True, text=True)
    assert result.returncode == 2 and "qstat: invalid option -- 'Z'" in result.stderr
    result = subprocess.run(["qsub", "-Y", "job.sh"], capture_output=True, text=True)
    assert result.returncode == 2 and "qsub: invalid option -- 'Y'" in result.stderr
    result = subprocess.run(["qdel", "12345.pbs-server"], capture_output=True, text=True)
    assert result.returncode == 153 and "qdel: Unknown Job Id 12345.pbs-server" in result.stderr


# --- a real Parsl app on Theta's site file, through the fake Cobalt and aprun --------------------


@pytest.mark.slow
def test_an_app_runs_on_the_theta_site_through_cobalt(
    cobalt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROJECT", "proj")
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)  # worker_init activates it: process_worker_pool.py on PATH
    size = parsl.python_app(parse_size)  # a function the worker processes can import
    config = load_site("theta", run_dir=str(tmp_path / "runinfo"))
    config.executors[0].cpu_affinity = "none"  # "block" needs a core per worker: a KNL node has 64, CI fewer
    with parsl.load(config):
        futures = [size(text) for text in ("1KiB", "2MiB", "3GiB")]
        assert [f.result(timeout=120) for f in futures] == [1 << 10, 2 << 20, 3 << 30]
        (job,) = engine.numbers(cobalt)
        assert engine.phase(cobalt, job) == "running"
    assert engine.phase(cobalt, job) == "done"  # Parsl cancelled its block on the way out
