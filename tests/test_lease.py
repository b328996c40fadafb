"""The runner's lease: members of a runner that is gone commit a checkpoint and stop, and its guard
cancels its blocks and interchange, on the local site and on Slurm."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from slurm import cancel_all, require_slurm, slurm_jobs

from resilient_flows.checkpoint._tiers import Tier
from resilient_flows.rundir import run_layout
from resilient_flows.rundir._heartbeat import Heartbeat
from resilient_flows.rundir._lease import RENEW_S, LeaseRenewer, end_lease, orphaned, read_lease
from resilient_flows.training import read_events
from resilient_flows.workflow._blocks import RunnerLock, process_start_time
from resilient_flows.workflow._leaseguard import guard

REPO = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).with_name("resilient-flows"))
#: The orphan timeout of the end-to-end tests' sites.
ORPHAN_S = 10.0


def age(run_dir: Path, seconds: float) -> None:
    """Make the lease look last renewed ``seconds`` ago."""
    then = time.time() - seconds
    os.utime(run_layout(run_dir).lease, (then, then))


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``predicate`` held; fails after ``timeout``."""
    began = time.monotonic()
    while not predicate():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.2)
    return time.monotonic() - began


# ----------------------------------------------------------------------------- the lease itself


def test_a_fresh_lease_holds_and_an_old_one_orphans_the_run(tmp_path: Path) -> None:
    assert orphaned(tmp_path) is None  # no runner ever held it: a member run by hand
    RunnerLock(tmp_path, orphan_timeout_s=60.0).acquire()
    lease = read_lease(tmp_path)
    assert lease is not None and (lease.pid, lease.orphan_timeout_s) == (os.getpid(), 60.0)
    assert orphaned(tmp_path) is None
    age(tmp_path, 59)
    assert orphaned(tmp_path) is None
    age(tmp_path, 61)
    reason = orphaned(tmp_path)
    assert reason is not None and f"process {os.getpid()}" in reason and "orphan timeout of 60 s" in reason


def test_a_lease_the_runner_let_go_of_orphans_nothing(tmp_path: Path) -> None:
    RunnerLock(tmp_path, orphan_timeout_s=10.0).acquire()
    end_lease(tmp_path)
    age(tmp_path, 1000)
    assert orphaned(tmp_path) is None
    lease = read_lease(tmp_path)
    assert lease is not None and lease.ended and not lease.expired and lease.pid == os.getpid()
    assert guard(tmp_path, os.getpid(), None, poll_s=0.01) == []  # the guard of an ended runner leaves


def test_the_renewer_keeps_the_lease_fresh(tmp_path: Path) -> None:
    RunnerLock(tmp_path, orphan_timeout_s=1.0).acquire()
    age(tmp_path, 30)
    with LeaseRenewer(tmp_path, period_s=0.05):
        wait_for(lambda: orphaned(tmp_path) is None, 5, "a renewal")
    assert read_lease(tmp_path).age_s < RENEW_S  # type: ignore[union-attr]


def test_a_heartbeat_tells_its_attempt_once_when_the_runner_is_gone(tmp_path: Path) -> None:
    RunnerLock(tmp_path, orphan_timeout_s=1.0).acquire()
    told: list[str] = []
    with Heartbeat(tmp_path, "m", attempt=1, beat_s=0.05, on_orphaned=told.append):
        time.sleep(0.3)
        assert told == []
        age(tmp_path, 100)
        wait_for(lambda: bool(told), 5, "the orphan callback")
        time.sleep(0.3)
    assert len(told) == 1 and "gone for 100 s" in told[0]


def test_the_guard_leaves_a_run_that_another_runner_took_over(tmp_path: Path) -> None:
    RunnerLock(tmp_path, orphan_timeout_s=0.1).acquire()  # this process holds it: a resume's runner
    age(tmp_path, 100)
    done: list[list[str]] = []
    thread = threading.Thread(target=lambda: done.append(guard(tmp_path, 999_999_999, None, poll_s=0.05)))
    thread.start()
    thread.join(5)
    assert done == [[]]
    assert not (tmp_path / "events.jsonl").exists()


# ----------------------------------------------------------------------------- end to end


def quick_site(tmp_path: Path, base: str) -> Path:
    """Site ``base`` with an orphan timeout of :data:`ORPHAN_S`."""
    text = (REPO / "site-configs" / f"{base}.yaml").read_text()
    site = tmp_path / f"{base}.yaml"
    site.write_text(text.replace("\nfacts:\n", f"\nfacts:\n  orphan_timeout: {ORPHAN_S:g}s\n"))
    return site


def start_runner(tmp_path: Path, site: Path, command: bool) -> tuple[subprocess.Popen, Path]:
    """``resilient-flows run`` of a long-training member ``m``, and with ``command`` a command member ``c``."""
    workflow = tmp_path / "wf.yaml"
    script = [sys.executable, str(REPO / "tests" / "command_script.py"), "--step-s", "0.01"]
    workflow.write_text(
        "name: orphan\nretries: 1\ncheckpoint: {interval: 200}\nmembers:\n"
        "  - {name: m, workload: mlp-digits, steps: 1000000, params: {hidden: 16}}\n"
        + (f"  - {{name: c, steps: 1000000, command: {json.dumps(script)}}}\n" if command else "")
    )
    run_dir = tmp_path / "run"
    runner = subprocess.Popen(
        [CLI, "run", workflow, "--site", site, "--run-dir", run_dir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return runner, run_dir


def committed_by_every_member(run_dir: Path, names: list[str]) -> bool:
    done = {e["member"] for e in read_events(run_dir) if e["kind"] == "checkpointed"}
    return set(names) <= done


def leftovers(run_dir: Path) -> list[str]:
    """The processes of this run still alive: its interchanges, worker pools and guard."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and str(run_dir) in cmdline and "pytest" not in cmdline:
            found.append(f"{entry}: {cmdline[:160]}")
    for record in map(json.loads, (run_dir / "blocks.jsonl").read_text().splitlines()):
        pid = record.get("interchange")
        if pid is not None and process_start_time(pid) == record.get("started"):
            found.append(f"interchange {pid}")
    return found


def assert_members_stopped_where_they_were(run_dir: Path, names: list[str]) -> None:
    """Each member committed the step it had reached when it noticed the runner gone, and stopped."""
    events = list(read_events(run_dir))
    for name in names:
        (stop,) = [e for e in events if e["kind"] == "preempted" and e["member"] == name]
        # the runner's words, or the signal by which a command member's launcher passed them on
        assert "orphan timeout" in stop["reason"] or stop["reason"] == "signal SIGTERM", stop
        newest = Tier(run_dir / "members" / name / "checkpoints", "shared").committed_steps()[0]
        assert newest == stop["step"]
        steps = [json.loads(line)["step"] for line in (run_dir / "members" / name / "metrics.jsonl").open()]
        assert max(steps) == newest  # not one step trained after the checkpoint
    warnings = [e["reason"] for e in events if e["kind"] == "warning" and e["member"] is None]
    assert len(warnings) == 2 and "gone for" in warnings[0] and "leftovers cancelled" in warnings[1], warnings


@pytest.mark.slow
@pytest.mark.timeout(600)  # a runner, a block and two members start on busy cores: minutes
def test_a_runner_sigkilled_and_never_resumed_leaves_nothing_running_and_loses_no_step(tmp_path: Path) -> None:
    runner, run_dir = start_runner(tmp_path, quick_site(tmp_path, "local"), command=True)
    names = ["m", "c"]
    try:
        wait_for(lambda: committed_by_every_member(run_dir, names), 300, "a checkpoint of every member")
        runner.send_signal(signal.SIGKILL)  # the runner alone, as when its login session dies
        runner.wait()
        took = wait_for(lambda: not leftovers(run_dir), ORPHAN_S + 60, "the run's processes gone")
    finally:
        for line in leftovers(run_dir):
            os.kill(int(line.split(":")[0].split()[-1]), signal.SIGKILL)
    assert took > ORPHAN_S - 2 * RENEW_S  # nothing was cancelled while the lease held
    assert_members_stopped_where_they_were(run_dir, names)
    assert not list((run_dir / "heartbeats").iterdir())


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(200)
def test_a_slurm_runner_sigkilled_and_never_resumed_leaves_no_pilot_job(tmp_path: Path) -> None:
    require_slurm()
    runner, run_dir = start_runner(tmp_path, quick_site(tmp_path, "local-slurm"), command=False)
    prefix = "parsl.local-slurm.block-"

    def pilots() -> list[str]:
        return [job for job, state in slurm_jobs(name_prefix=prefix) if state in ("PENDING", "RUNNING", "CONFIGURING")]

    try:
        wait_for(lambda: committed_by_every_member(run_dir, ["m"]), 150, "a checkpoint in the pilot job")
        assert pilots()
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        wait_for(lambda: not pilots() and not leftovers(run_dir), ORPHAN_S + 60, "the pilot job and interchange gone")
    finally:
        if runner.poll() is None:
            runner.kill()
        cancel_all(name_prefix=prefix)
    assert_members_stopped_where_they_were(run_dir, ["m"])


def test_a_site_orphan_timeout_below_two_renewals_is_refused(tmp_path: Path) -> None:
    from resilient_flows.errors import SiteConfigError
    from resilient_flows.sites import site_facts

    site = quick_site(tmp_path, "local")
    assert site_facts(site).orphan_timeout_s == ORPHAN_S
    site.write_text(site.read_text().replace(f"orphan_timeout: {ORPHAN_S:g}s", "orphan_timeout: 5s"))
    with pytest.raises(SiteConfigError, match=r"facts\.orphan_timeout must be at least 10s"):
        site_facts(site)


def test_a_runner_on_another_host_is_refused_while_its_lease_is_fresh(tmp_path: Path) -> None:
    from resilient_flows.errors import WorkflowError

    record = {"pid": 4242, "host": "login-2", "started": 1, "orphan_timeout_s": 60.0}
    (run_layout(tmp_path).lease).write_text(json.dumps(record))
    with pytest.raises(WorkflowError, match=r"process 4242 on login-2 \(its lease was renewed 0 s ago\)"):
        RunnerLock(tmp_path).acquire()
    age(tmp_path, 2 * RENEW_S + 1)  # gone: its lease ages
    RunnerLock(tmp_path).acquire()
    end_lease(tmp_path)
    assert read_lease(tmp_path).ended  # type: ignore[union-attr]


def test_a_runner_whose_run_was_taken_over_renews_and_ends_nothing(tmp_path: Path) -> None:
    RunnerLock(tmp_path, orphan_timeout_s=60.0).acquire()
    with LeaseRenewer(tmp_path, period_s=0.05):
        other = {"pid": 4242, "host": "login-2", "started": 1, "orphan_timeout_s": 60.0}
        replacement = tmp_path / "new.json"
        replacement.write_text(json.dumps(other))
        os.replace(replacement, run_layout(tmp_path).lease)  # as a resume writes its record
        age(tmp_path, 100)
        time.sleep(0.3)
    end_lease(tmp_path)
    lease = read_lease(tmp_path)
    assert lease is not None and lease.pid == 4242 and not lease.ended and lease.age_s >= 100
