"""Parsl apps on a real Slurm cluster (``.ci/slurm-up``) through the ``local-slurm`` site.

Skipped without a cluster, failed without one where ``RESILIENT_FLOWS_REQUIRE_SLURM=1`` (CI).
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import parsl
import pytest
from parsl.dataflow.dflow import DataFlowKernel
from rich.console import Console
from slurm import cancel, cancel_all, require_slurm, slurm_jobs, wait_for, worker_job_id

from resilient_flows.sites import SITE_DIR, load_site
from resilient_flows.training import read_events, run_member
from resilient_flows.training._walltime import MIN_DRAIN_S, REACTION_S
from resilient_flows.units import parse_size
from resilient_flows.workflow import read_plan, start_run
from resilient_flows.workflow._walltime import FORCE_S

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.timeout(150)]

LABEL = "local-slurm"


@pytest.fixture
def dfk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DataFlowKernel]:
    """Parsl loaded with the ``local-slurm`` site; afterwards its pilot jobs are gone."""
    require_slurm()
    # Workers import `worker_job_id` from tests/slurm.py: pilot jobs inherit this environment.
    tests_dir = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p))
    kernel = parsl.load(load_site(LABEL, run_dir=str(tmp_path / "runinfo")))
    provider = kernel.executors[LABEL].provider
    try:
        yield kernel
    finally:
        job_ids = list(provider.resources)
        try:
            kernel.cleanup()
        finally:
            cancel(job_ids)


def test_an_app_runs_in_a_slurm_pilot_job(dfk: DataFlowKernel) -> None:
    assert parsl.python_app(parse_size)("3MiB").result(timeout=120) == 3 << 20

    job_id = parsl.python_app(worker_job_id)().result(timeout=30)
    provider = dfk.executors[LABEL].provider
    assert job_id is not None, "the app did not run inside a Slurm job"
    assert list(provider.resources) == [job_id], "one block, submitted by SlurmProvider"
    assert (job_id, "RUNNING") in slurm_jobs(name_prefix=f"parsl.{LABEL}.block-")


def test_a_cancelled_pilot_job_is_replaced_and_its_task_retried(dfk: DataFlowKernel) -> None:
    app = parsl.python_app(worker_job_id)
    first = app().result(timeout=120)
    assert first is not None

    sleeper = app(5)  # busy in the first block when that block is cancelled
    time.sleep(2)
    cancel([first])
    wait_for(lambda: dict(slurm_jobs()).get(first) == "CANCELLED", 30, f"Slurm job {first} to end")

    # A new task after the loss runs in a new block; the interrupted one is retried there.
    second = app().result(timeout=120)
    assert second not in (None, first)
    assert sleeper.result(timeout=60) == second
    assert sleeper.task_record["fail_count"] >= 1, "the sleeper was retried, not finished in the first block"
    assert set(dfk.executors[LABEL].provider.resources) == {first, second}


def test_a_workflow_member_survives_scancel_of_its_pilot_job(tmp_path: Path) -> None:
    """The member trains in a Slurm pilot job; we scancel the job; it finishes on a new block from its checkpoint."""
    require_slurm()
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(
        "name: slurm\nsite: local-slurm\nretries: 1\ncheckpoint: {interval: 125}\n"
        "members:\n  - {name: m, workload: cnn-digits, steps: 1000, seed: 5}\n"
    )
    run_dir = tmp_path / "run"
    outcome: list[int] = []
    runner = threading.Thread(
        target=lambda: outcome.append(start_run(workflow, run_dir=run_dir, console=Console(file=io.StringIO())))
    )
    runner.start()
    try:
        wait_for(lambda: any(e["kind"] == "checkpointed" for e in read_events(run_dir)), 120, "a first checkpoint")
        (job,) = [j for j, state in slurm_jobs(name_prefix=f"parsl.{LABEL}.block-") if state == "RUNNING"]
        cancel([job])
        runner.join(timeout=150)
    finally:
        if runner.is_alive():
            cancel_all(name_prefix=f"parsl.{LABEL}.block-")
            runner.join(timeout=60)
    assert outcome == [0]
    events = list(read_events(run_dir))
    (failed,) = [e for e in events if e["kind"] == "failed"]
    assert failed["cost"] == 0.0, failed  # lost (or preempted by Slurm's SIGTERM) after progress: free
    resumed = [e["step"] for e in events if e["kind"] == "resumed"]
    assert resumed and resumed[0] >= 124
    workers = {e["pid"] for e in events if e["kind"] == "started"}
    assert len(workers) == 2  # two attempts in two worker processes (two pilot jobs)
    reference = run_member(read_plan(run_dir).members[0].to_dict(), str(tmp_path / "ref"))
    assert json.loads((run_dir / "members/m/result.json").read_text())["digest"] == reference["digest"]


@pytest.mark.timeout(480)
def test_members_leave_each_block_before_its_walltime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of Slurm's least walltime (1 minute) and members whose 50 s of steps do not fit in the
    part of one that is left after start-up and the drain margin (at most 40 s): each block is
    drained before its end, its members commit and stop for free, and continue on a fresh block
    from that checkpoint; none is started in a block's last margin, none is killed by the walltime."""
    require_slurm()
    tests_dir = str(Path(__file__).parent)  # workers import the `paced` workload from tests/
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p))
    site = tmp_path / "short-blocks.yaml"
    text = (SITE_DIR / "local-slurm.yaml").read_text()
    text = text.replace('walltime: "00:30:00"', 'walltime: "00:01:00"').replace("walltime: 30m", "walltime: 1m")
    site.write_text(text)
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(
        f"name: walltime\nsite: {site}\nretries: 0\ncheckpoint: {{interval: 100}}\nmembers:\n"
        "  - {name: m, workload: 'paced:train', steps: 250, params: {step_s: 0.2}, seeds: [0, 1]}\n"
    )
    run_dir = tmp_path / "run"
    try:
        outcome = start_run(workflow, run_dir=run_dir, console=Console(file=io.StringIO()))
    finally:
        cancel_all(name_prefix=f"parsl.{LABEL}.block-")
    events = list(read_events(run_dir))
    members = [m.name for m in read_plan(run_dir).members]
    assert outcome == 0
    assert all((run_dir / "members" / name / "result.json").is_file() for name in members)

    failed = [e for e in events if e["kind"] == "failed"]
    assert sum(e["cost"] for e in failed) == 0, failed  # no retry spent (the workflow allows none)
    assert {e["cause"] for e in failed} <= {"preempted"}, failed
    assert not [e for e in events if e["kind"] == "lost"]
    jobs = {e["job_id"] for e in events if e["kind"] == "block_started"}
    states = {job: state for job, state in slurm_jobs(name_prefix=f"parsl.{LABEL}.block-") if job in jobs}
    assert "TIMEOUT" not in states.values(), states  # no block outlived its walltime

    drains = [e for e in events if e["kind"] == "preempted" and "walltime" in e["reason"]]
    assert len(drains) >= len(members), "every member moved to a fresh block at least once"
    assert [e for e in events if e["kind"] == "drained"], "a block was drained before its end"
    redone = {}
    for name in members:
        steps = [json.loads(line)["step"] for line in (run_dir / "members" / name / "metrics.jsonl").open()]
        redone[name] = len(steps) - len(set(steps))
        stops = len([e for e in drains if e["member"] == name])
        assert redone[name] <= 3 * stops, (name, redone[name], stops)  # a few steps per block end, not an interval

    ends = {e["block"]: e["end"] for e in events if e["kind"] == "block_started"}
    declined = {(e["member"], e["attempt"]) for e in events if e["kind"] == "declined"}
    margins = []
    for e in events:
        if e["kind"] == "started" and (e["member"], e["attempt"]) not in declined:
            margins.append(ends[e["block"]] - e["time"])
    assert min(margins) > MIN_DRAIN_S + REACTION_S, margins  # none started in its block's last margin
    emptied = [ends[e["block"]] - e["time"] for e in events if e["kind"] == "drained"]
    assert min(emptied) > FORCE_S, emptied  # each block was cancelled once its members left, not at its end
    print(
        f"\nwalltime run: {len(jobs)} blocks, {len(drains)} drain stops, retries spent "
        f"{sum(e['cost'] for e in failed)}, declined {len(declined)}, redone steps {redone}, "
        f"least time left at a start {min(margins):.1f} s, at a block's cancel {min(emptied):.1f} s, "
        f"Slurm states {sorted(states.values())}"
    )
