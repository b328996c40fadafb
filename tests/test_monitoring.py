"""``monitoring: true``: Parsl's monitoring database in the run directory, and ``parsl-visualize`` over it.

Real runs through Parsl, their database read back with sqlite3; ``parsl-visualize`` started for
real and asked for its pages over HTTP.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from requires import require
from test_workflow import write

from resilient_flows.cli import main
from resilient_flows.rundir import run_layout
from resilient_flows.training import read_events
from resilient_flows.workflow._monitoring import VISUALIZE_EXTRA, visualize_problems

#: A ``parsl-visualize`` command to use instead of this environment's, which Parsl's visualization
#: extra (plotly < 7, networkx < 3.3) may not fit: one installed in an environment of its own.
PARSL_VISUALIZE = "RESILIENT_FLOWS_PARSL_VISUALIZE"

#: Two members; b fails at step 12 with no retry left, so that a resume has something to continue.
MONITORED = """\
name: mon
monitoring: true
retries: 0
checkpoint: {interval: 5}
members:
  - {name: a, workload: mlp-breast-cancer, steps: 30}
  - {name: b, workload: mlp-breast-cancer, steps: 30, seed: 4}
faults:
  - {error: b, at_step: 12}
"""


def rows(database: Path, query: str, *params: Any) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(database)) as db:
        return db.execute(query, params).fetchall()


def final_states(database: Path, run_id: str) -> dict[int, str]:
    """Each task's last state in the workflow run ``run_id``."""
    found = rows(database, "select task_id, task_status_name from status where run_id = ? order by timestamp", run_id)
    return dict(found)


def test_a_bad_monitoring_value_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, MONITORED.replace("monitoring: true", "monitoring: sometimes"))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert re.search(r"wf.yaml:2: monitoring: Input should be a valid boolean", err), err


def test_validate_warns_only_where_parsl_visualize_would_not_work(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["validate", str(write(tmp_path, MONITORED))]) == 0
    err = capsys.readouterr().err
    problems = visualize_problems()
    if problems:  # the run goes ahead: the database can be read from another environment
        assert "parsl-visualize will not work in this environment" in err and VISUALIZE_EXTRA in err
        assert all(problem in " ".join(err.split()) for problem in problems)
    else:
        assert err == ""


def test_without_sqlalchemy_validate_names_the_extra_in_one_line(tmp_path: Path) -> None:
    """As in an environment without Parsl's monitoring extra: SQLAlchemy does not import."""
    path = write(tmp_path, MONITORED)
    program = (
        "import sys; sys.modules['sqlalchemy'] = None\n"
        "from resilient_flows.cli import main\n"
        f"sys.exit(main(['validate', {str(path)!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "monitoring: true needs Parsl's monitoring extra (SQLAlchemy)" in line
    assert line.endswith("pip install 'resilient-flows[monitoring]'"), line


@pytest.mark.parametrize("site", ["local", "slurm"])
def test_the_hub_needs_no_address_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, site: str) -> None:
    """Workers send their monitoring messages to their interchange over the connection they already
    have (Parsl's HTEXRadio): a compute node that reaches its interchange is monitored."""
    from parsl.monitoring.radios.htex import HTEXRadio

    from resilient_flows.sites import SiteFile
    from resilient_flows.workflow._runner import _site_config

    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)  # the Slurm site's worker_init activates it
    config = _site_config(SiteFile.open(site), tmp_path, 0, 0, "mon")
    assert config.monitoring is not None and config.monitoring.workflow_name == "mon"
    assert config.monitoring.logging_endpoint == f"sqlite:///{run_layout(tmp_path).monitoring_db.resolve()}"
    assert all(isinstance(e.remote_monitoring_radio, HTEXRadio) for e in config.executors)
    assert _site_config(SiteFile.open(site), tmp_path, 0, 0).monitoring is None


@pytest.mark.slow
def test_a_run_and_its_resume_record_every_attempt_in_one_database(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(["run", str(write(tmp_path, MONITORED)), "--run-dir", str(run_dir)]) == 1  # b failed
    database = run_layout(run_dir).monitoring_db
    assert f"parsl-visualize sqlite:///{database.resolve()}" in capsys.readouterr().out
    ((first, name, completed),) = rows(database, "select run_id, workflow_name, time_completed from workflow")
    assert name == "mon" and completed is not None
    assert sorted(final_states(database, first).values()) == ["exec_done", "failed"]
    tasks = {e["member"]: e["task"] for e in read_events(run_dir) if e["kind"] == "submitted"}
    named = dict(rows(database, "select task_id, task_func_name from task where run_id = ?", first))
    assert sorted(named) == sorted(tasks.values())  # a member's task id, as parsl-visualize lists it
    (failure,) = rows(database, "select task_fail_history from try where task_fail_history != ''")
    assert "injected error in member b at step 12" in failure[0]

    assert main(["resume", str(run_dir)]) == 0  # the same database: Parsl adds a workflow row
    workflows = [run_id for (run_id,) in rows(database, "select run_id from workflow order by time_began")]
    assert len(workflows) == 2 and workflows[0] == first
    assert list(final_states(database, workflows[1]).values()) == ["exec_done"]
    attempts = [e for e in read_events(run_dir) if e["kind"] == "started"]
    assert [e["member"] for e in attempts].count("b") == 2
    assert rows(database, "select count(*) from try") == [(len(attempts),)]  # a row per attempt
    assert rows(database, "select distinct task_func_name from task") == [("train_app",)]


def parsl_visualize() -> str:
    """The ``parsl-visualize`` to start: :data:`PARSL_VISUALIZE`'s, or this environment's where
    Parsl's visualization extra is installed as it asks."""
    given = os.environ.get(PARSL_VISUALIZE)
    if given:
        return given
    problems = visualize_problems()
    require(
        not problems,
        f"parsl-visualize cannot run in this environment ({'; '.join(problems)}): pip install "
        f"'{VISUALIZE_EXTRA}', or set {PARSL_VISUALIZE} to the parsl-visualize of an environment of its own",
    )
    return str(Path(sys.executable).parent / "parsl-visualize")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str, server: subprocess.Popen, deadline_s: float = 60) -> str:
    """The page at ``url`` once the ``server`` answers (it imports pandas and plotly first)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.read().decode()
        except (urllib.error.URLError, ConnectionError) as exc:
            if isinstance(exc, urllib.error.HTTPError) or server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{url}: {exc} (parsl-visualize exit status {server.poll()})") from None
            time.sleep(0.5)


@pytest.mark.slow
def test_parsl_visualize_serves_a_monitored_run(tmp_path: Path) -> None:
    command = parsl_visualize()
    run_dir = tmp_path / "run"
    workflow = "name: viz\nmonitoring: true\nmembers:\n  - {name: m, workload: mlp-breast-cancer, steps: 10}\n"
    assert main(["run", str(write(tmp_path, workflow)), "--run-dir", str(run_dir)]) == 0
    database = run_layout(run_dir).monitoring_db.resolve()
    ((run_id,),) = rows(database, "select run_id from workflow")
    port = free_port()
    with (tmp_path / "parsl-visualize.log").open("wb") as log:
        server = subprocess.Popen(
            [command, "--listen", "127.0.0.1", "--port", str(port), f"sqlite:///{database}"], stdout=log, stderr=log
        )
    try:
        index = get(f"http://127.0.0.1:{port}/", server)
        assert f'href="workflow/{run_id}/">viz</a>' in index
        assert "train_app" in get(f"http://127.0.0.1:{port}/workflow/{run_id}/", server)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_a_member_in_a_slurm_pilot_job_is_recorded_from_its_node(tmp_path: Path) -> None:
    """The worker runs in a Slurm job and reports through its interchange: its node, its block's
    job and its attempt's host reach the database on the submitting side."""
    from slurm import cancel_all, require_slurm

    require_slurm()
    workflow = (
        "name: mon-slurm\nsite: local-slurm\nmonitoring: true\n"
        "members:\n  - {name: m, workload: mlp-breast-cancer, steps: 10}\n"
    )
    run_dir = tmp_path / "run"
    try:
        assert main(["run", str(write(tmp_path, workflow)), "--run-dir", str(run_dir)]) == 0
    finally:
        cancel_all(name_prefix="parsl.local-slurm.block-")
    database = run_layout(run_dir).monitoring_db
    ((run_id,),) = rows(database, "select run_id from workflow where workflow_name = 'mon-slurm'")
    assert list(final_states(database, run_id).values()) == ["exec_done"]
    ((host, block),) = rows(database, "select hostname, block_id from try")
    assert host and block == "0"
    jobs = {job for (job,) in rows(database, "select job_id from block where job_id is not null")}
    assert jobs and all(job.isdigit() for job in jobs), jobs  # Slurm's job ids: the block was a pilot job
    assert rows(database, "select count(*) from node") != [(0,)]  # the worker pool registered from its node
