"""The progress watchdog: heartbeats, silent attempts, recorded blocks, and the two hangs it exists for.

The end-to-end tests reproduce, with real Parsl pools and real SIGKILLs, the two ways a run used
to hang for good: a worker pool whose spawned processes (workers and multiprocessing manager) were
killed, and a runner killed with its interchange, leaving an orphaned pool behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from parsl.executors.high_throughput.errors import WorkerLost
from slurm import wait_for

from resilient_flows.apps import ResumingRetryHandler
from resilient_flows.checkpoint import CheckpointConfig
from resilient_flows.errors import WorkflowError
from resilient_flows.rundir import read_records, run_layout
from resilient_flows.rundir._heartbeat import BEAT_S, Heartbeat, attempt_heartbeat_path, read_attempt_heartbeat
from resilient_flows.training import MemberSpec, TrainContext, read_events, run_member
from resilient_flows.workflow import read_plan
from resilient_flows.workflow._blocks import BlockLedger, RunnerLock, cancel_block, process_start_time
from resilient_flows.workflow._watchdog import START_FACTOR, WATCH_S, Watchdog, clear_heartbeats, stall_timeout

REPO = Path(__file__).resolve().parents[1]
CLI = Path(sys.executable).with_name("resilient-flows")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def beat(run_dir: Path, task: str, **fields: object) -> None:
    """A heartbeat record as a beating attempt writes it (a new mtime each call)."""
    path = attempt_heartbeat_path(run_dir, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"task": task, "attempt": 1, "pid": 1, "host": "n1", "block": "0", "step": None, "step_s": None}
    path.write_text(json.dumps({**record, **fields}))
    stamp = next(_stamps)  # two writes within one kernel tick would share an mtime
    os.utime(path, ns=(stamp, stamp))


_stamps = iter(range(10**18, 2 * 10**18, 10**6))


# ----------------------------------------------------------------------------- heartbeats


def test_a_heartbeat_rewrites_its_record_in_place_and_removes_it_on_exit(tmp_path: Path) -> None:
    with Heartbeat(tmp_path, "m-0", attempt=3, beat_s=0.05) as heartbeat:
        path = attempt_heartbeat_path(tmp_path, "m-0")
        first = read_attempt_heartbeat(path)
        assert first is not None and first["attempt"] == 3 and first["pid"] == os.getpid()
        assert first["step"] is None and first["step_s"] is None
        for step in range(5):
            heartbeat.progress(step)
            time.sleep(0.06)
        seen: list[dict] = []

        def beat_of_step_4() -> bool:  # late on a loaded machine; a read mid-rewrite is None
            seen.append(read_attempt_heartbeat(path) or {})
            return seen[-1].get("step") == 4

        wait_for(beat_of_step_4, 30, "the beat of step 4", poll_s=0.05)
        assert seen[-1]["step"] == 4 and seen[-1]["step_s"] > 0
        assert os.stat(path).st_mtime_ns > 0 and path.stat().st_size >= 512  # padded, rewritten in place
    assert not path.exists()


def test_a_member_s_heartbeat_tells_the_newest_checkpoint_its_attempt_committed(tmp_path: Path) -> None:
    spec = MemberSpec(
        name="h", workload="mlp-digits", params={"hidden": 8}, steps=4, checkpoint=CheckpointConfig(interval_steps=2)
    )
    context = TrainContext(spec, tmp_path)
    path = attempt_heartbeat_path(tmp_path, "h")
    try:
        assert read_attempt_heartbeat(path)["committed"] is None
        model = torch.nn.Linear(2, 2)
        context.track(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        for step in context.steps(4):
            context.log(step, loss=1.0)
        context.checkpointer.wait()
        deadline = time.monotonic() + 3 * BEAT_S
        while read_attempt_heartbeat(path)["committed"] != 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert read_attempt_heartbeat(path)["committed"] == 3
    finally:
        context.close()


@pytest.mark.parametrize(("committed", "cost"), [(None, 1.0), (300, 0.0)])
def test_a_lost_attempt_whose_only_checkpoint_went_with_its_node_retries_free(
    tmp_path: Path, committed: int | None, cost: float
) -> None:
    """The shared tier holds nothing newer, but the attempt committed a node-local checkpoint
    (its heartbeat says so) before its node was lost: it made progress."""
    spec = MemberSpec(name="m", workload="mlp-digits", params={}, steps=600)
    beat(tmp_path, "m", committed=committed)
    record = {"id": 0, "func_name": "train_app", "args": (spec.to_dict(), str(tmp_path)), "fail_cost": 0, "try_id": 0}
    assert ResumingRetryHandler(retries=2)(WorkerLost(3, "n1"), record) == cost
    (failed,) = [e for e in read_events(tmp_path) if e["kind"] == "failed"]
    assert failed["cause"] == ("lost after progress" if cost == 0 else "lost without progress")
    assert not attempt_heartbeat_path(tmp_path, "m").exists()


def test_a_heartbeat_is_removed_when_the_task_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), Heartbeat(tmp_path, "s", attempt=1):
        raise RuntimeError("boom")
    assert not attempt_heartbeat_path(tmp_path, "s").exists()


# ----------------------------------------------------------------------------- the watchdog


def test_stall_timeout_rule() -> None:
    assert stall_timeout(5.0, 100.0, 30.0) == 5.0  # the member's own value wins
    assert stall_timeout(None, None, 30.0) == 30.0  # no pace known yet: the site's
    assert stall_timeout(None, 0.5, 30.0) == 30.0  # 10 x 0.5 s is less than the site's
    assert stall_timeout(None, 7.0, 30.0) == 70.0  # slow steps: 10 x the step time


def test_a_silent_attempt_is_lost_once_after_its_timeout(tmp_path: Path) -> None:
    clock = Clock()
    watchdog = Watchdog(tmp_path, site_stall_s=30.0, timeouts={"a": 10.0, "b": None}, clock=clock)
    beat(tmp_path, "a", attempt=2, block="3")
    beat(tmp_path, "b", step=7, step_s=5.0)  # 10 x 5 s: 50 s
    assert watchdog.check([]) == []
    clock.advance(WATCH_S / 2)
    assert watchdog.check([]) == []  # not due: looks at most every WATCH_S

    clock.advance(11.0)
    (lost,) = watchdog.check([])
    assert (lost.task, lost.attempt, lost.block) == ("a", 2, "3")
    assert "no heartbeat for 12 s (stall_timeout 10 s)" in lost.reason

    clock.advance(WATCH_S)
    beat(tmp_path, "b", step=9, step_s=5.0)  # b still beats: never lost
    assert watchdog.check([]) == []  # a is reported once
    clock.advance(45.0)
    assert watchdog.check([]) == []  # b's 50 s have not passed since its last beat
    clock.advance(6.0)
    assert [lost.task for lost in watchdog.check([])] == ["b"]

    beat(tmp_path, "a", attempt=3, block="4")  # the retry beats again: a new attempt
    clock.advance(WATCH_S)
    assert watchdog.check([]) == []
    clock.advance(10.5)
    assert [(lost.task, lost.attempt) for lost in watchdog.check([])] == [("a", 3)]


def test_an_attempt_that_saw_its_pool_gone_makes_its_block_lost_at_the_next_look(tmp_path: Path) -> None:
    """The fast path: no stall timeout, no interchange threshold; one report per block."""
    clock = Clock()
    watchdog = Watchdog(tmp_path, site_stall_s=30.0, timeouts={}, clock=clock)
    beat(tmp_path, "a", block="3", pid=11)
    beat(tmp_path, "b", block="3", pid=12)
    assert watchdog.check([]) == []
    beat(tmp_path, "b", block="3", pid=12, pool_lost="its worker pool (pid 9) exited")
    beat(tmp_path, "a", block="3", pid=11, pool_lost="its worker pool (pid 9) exited")
    clock.advance(WATCH_S)
    (lost,) = watchdog.check([])
    assert (lost.task, lost.block, lost.executor, lost.seen_by) == (None, "3", None, "a")
    assert lost.reason == "the worker pool of block 3 is gone, as a saw (pid 11 on n1): its worker pool (pid 9) exited"
    clock.advance(WATCH_S)
    assert watchdog.check([]) == []  # reported once


def test_a_pool_on_the_runner_s_host_that_its_attempts_did_not_see_gone_is_lost_at_the_next_look(
    tmp_path: Path,
) -> None:
    """A SIGKILLed pool's workers may die with it before they look: the runner looks at the pool
    named in the beat itself, where it runs on its host, and says why for the attempts."""
    import socket

    clock = Clock()
    watchdog = Watchdog(tmp_path, site_stall_s=30.0, timeouts={}, clock=clock)
    pool = subprocess.Popen(["sleep", "60"])
    named = {"pid": pool.pid, "started": process_start_time(pool.pid)}
    here = socket.gethostname()
    beat(tmp_path, "a", block="3", pid=11, host=here, pool=named)
    beat(tmp_path, "b", block="4", pid=12, host="elsewhere", pool={"pid": 2**22 + 7, "started": 1})  # cannot look
    assert watchdog.check([]) == []
    pool.kill()
    pool.wait()
    clock.advance(WATCH_S)
    (lost,) = watchdog.check([])
    why = f"its worker pool (pid {pool.pid}) exited"
    assert (lost.task, lost.block, lost.seen_by, lost.pool_gone) == (None, "3", "a", why)
    assert lost.reason == f"the worker pool of block 3 is gone, as the runner saw on {here} (running a): {why}"
    clock.advance(WATCH_S)
    assert watchdog.check([]) == []  # reported once


class GonePool:
    """A pool watch that finds the pool gone from its ``after``-th look on."""

    def __init__(self, after: int) -> None:
        self.looks, self.after = 0, after

    def lost(self) -> str | None:
        self.looks += 1
        return "its worker pool (pid 9) exited" if self.looks >= self.after else None

    def process(self) -> dict[str, int] | None:
        return {"pid": 9, "started": 5}


def test_a_heartbeat_that_finds_its_pool_gone_says_so_once_and_keeps_its_file(tmp_path: Path) -> None:
    told: list[str] = []
    heartbeat = Heartbeat(tmp_path, "m", attempt=1, beat_s=60.0, on_pool_lost=told.append, pool=GonePool(after=2))
    path = attempt_heartbeat_path(tmp_path, "m")
    with heartbeat:
        deadline = time.monotonic() + 60
        while not told and time.monotonic() < deadline:
            time.sleep(0.05)
        record = read_attempt_heartbeat(path)
    assert told == ["its worker pool (pid 9) exited"]  # at once, not after the 60 s beat
    assert record is not None and record["pool_lost"] == "its worker pool (pid 9) exited"
    assert record["pool"] == {"pid": 9, "started": 5}  # for a runner on the same host to look at
    assert path.exists()  # for the runner to read; the retry handler removes it


def test_a_pool_watch_tells_a_process_that_exited(tmp_path: Path) -> None:
    from resilient_flows.training._pool import PoolWatch, _Proc

    child = subprocess.Popen(["sleep", "60"])
    started = process_start_time(child.pid)
    assert started is not None
    watch = PoolWatch(_Proc(os.getpid(), process_start_time(os.getpid()) or 0), _Proc(child.pid, started))
    assert watch.lost() is None
    child.kill()
    child.wait()
    assert watch.lost() == f"its worker pool's multiprocessing manager (pid {child.pid}) exited"
    assert PoolWatch.find().pool is None  # pytest runs in no worker pool: nothing is watched


class AppFuture(Future):
    def __init__(self, executor: str, exec_fu: Future) -> None:
        super().__init__()
        self.task_record = {"executor": executor, "exec_fu": exec_fu}


def test_the_tasks_of_a_lost_block_fail_at_once_and_a_late_report_is_ignored(tmp_path: Path) -> None:
    from parsl.executors.high_throughput.errors import ManagerLost

    from resilient_flows.workflow._failfast import fail_lost_tasks

    executor = SimpleNamespace(label="local")
    running = {name: Future() for name in ("a", "b", "c")}
    futures = {name: AppFuture("local", fu) for name, fu in running.items()}
    beats = {"a": {"block": "3", "host": "n1"}, "b": {"block": "3"}, "c": {"block": "4"}}
    running["b"].set_result(1)  # its result came first
    assert fail_lost_tasks(executor, "3", futures, beats) == ["a"]
    assert isinstance(running["a"].exception(), ManagerLost) and "block-3 on host n1" in str(running["a"].exception())
    assert not running["c"].done()  # another block
    running["a"].set_exception(ManagerLost(b"abc", "n1"))  # the interchange's own report, later: ignored
    assert "block-3" in str(running["a"].exception())


def test_a_retry_launched_after_the_lost_attempt_started_is_not_failed_for_its_heartbeat() -> None:
    """The attempt saw its pool gone, stopped and was retried before the runner looked: its
    heartbeat (kept, naming the lost block) is older than the retry, which runs elsewhere."""
    from datetime import datetime

    from resilient_flows.workflow._failfast import fail_lost_tasks

    executor = SimpleNamespace(label="local")
    retried, lost = Future(), Future()
    futures = {"r": AppFuture("local", retried), "l": AppFuture("local", lost)}
    futures["r"].task_record["try_time_launched"] = datetime.fromtimestamp(1000.0)
    futures["l"].task_record["try_time_launched"] = datetime.fromtimestamp(1000.0)
    beats = {"r": {"block": "3", "started": 990.0}, "l": {"block": "3", "started": 1001.0}}
    assert fail_lost_tasks(executor, "3", futures, beats) == ["l"]
    assert not retried.done() and lost.done()


def quiet_blocks(watchdog: Watchdog, tasks: int) -> list[str]:
    """The blocks the watchdog finds lost now, when block 0 of executor x holds ``tasks`` tasks."""
    watchdog._read_beats(watchdog.clock())
    managers = [{"block_id": "0", "tasks": tasks, "active": True}]
    return [lost.block for lost in watchdog._quiet_blocks("x", managers, watchdog.clock())]


def test_a_block_whose_task_stopped_beating_is_lost_after_the_stall_timeout(tmp_path: Path) -> None:
    clock = Clock()
    watchdog = Watchdog(tmp_path, site_stall_s=30.0, timeouts={}, clock=clock)
    assert quiet_blocks(watchdog, 1) == []  # it took a task: starting
    beat(tmp_path, "m", block="0")
    clock.advance(5.0)
    assert quiet_blocks(watchdog, 1) == []  # beating
    attempt_heartbeat_path(tmp_path, "m").unlink()  # its rank 0 exited; the srun step waits for the others
    clock.advance(2.0)
    assert quiet_blocks(watchdog, 1) == []
    clock.advance(30.5)
    assert quiet_blocks(watchdog, 1) == ["0"]


def test_a_block_that_just_took_a_task_may_take_longer_to_beat(tmp_path: Path) -> None:
    """Its task may still be starting (imports, an srun step forming its group on a loaded node):
    START_FACTOR times the stall timeout, counted again whenever it takes another task."""
    clock = Clock()
    watchdog = Watchdog(tmp_path, site_stall_s=30.0, timeouts={}, clock=clock)
    assert quiet_blocks(watchdog, 1) == []
    clock.advance(60.0)
    assert quiet_blocks(watchdog, 1) == []
    clock.advance(10.0)
    assert quiet_blocks(watchdog, 2) == []  # a second task taken: its start counts afresh
    clock.advance(START_FACTOR * 30.0 - 1.0)
    assert quiet_blocks(watchdog, 2) == []
    clock.advance(2.0)
    assert quiet_blocks(watchdog, 2) == ["0"]


def test_a_retry_waiting_out_its_backoff_keeps_its_block_beating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry's app beats while it sleeps its backoff, with no attempt of its own yet."""
    from resilient_flows import apps

    monkeypatch.setenv("PARSL_WORKER_BLOCK_ID", "0")
    seen: list[dict | None] = []
    monkeypatch.setattr(
        apps.time, "sleep", lambda s: seen.append(read_attempt_heartbeat(attempt_heartbeat_path(tmp_path, "m")))
    )
    apps._wait(16.0, str(tmp_path), "m")
    (record,) = seen
    assert record is not None and (record["attempt"], record["block"], record["waiting_s"]) == (None, "0", 16.0)
    assert not attempt_heartbeat_path(tmp_path, "m").exists()  # the attempt's own heartbeat takes over


def test_a_finished_attempt_is_never_lost_and_old_heartbeats_are_cleared(tmp_path: Path) -> None:
    clock = Clock()
    watchdog = Watchdog(tmp_path, site_stall_s=5.0, timeouts={}, clock=clock)
    beat(tmp_path, "a")
    beat(tmp_path, "b")
    assert watchdog.check([]) == []
    attempt_heartbeat_path(tmp_path, "a").unlink()  # a ended cleanly
    clock.advance(10.0)
    assert [lost.task for lost in watchdog.check([])] == ["b"]
    clear_heartbeats(tmp_path)
    assert list((tmp_path / "heartbeats").iterdir()) == []


# ----------------------------------------------------------------------------- recorded blocks


def start_group(seconds: int = 60) -> subprocess.Popen:
    """A process in its own process group with a child, as LocalProvider starts a block."""
    return subprocess.Popen(["bash", "-c", f"sleep {seconds} & sleep {seconds}; wait"], start_new_session=True)


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still lives (zombies do not count)."""
    return bool(members_of(pgid))


def test_a_local_block_of_a_dead_runner_is_killed_only_while_it_is_the_recorded_process(tmp_path: Path) -> None:
    from parsl.providers import LocalProvider

    block = start_group()
    try:
        record = {"job_id": str(block.pid), "pid": block.pid, "host": os.uname().nodename}
        assert not cancel_block(LocalProvider(), {**record, "started": process_start_time(block.pid) + 1})
        assert block.poll() is None  # a recycled pid is never signalled
        assert cancel_block(LocalProvider(), {**record, "started": process_start_time(block.pid)})
        assert block.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while group_alive(block.pid) and time.monotonic() < deadline:  # its children, once init reaps them
            time.sleep(0.05)
        assert not group_alive(block.pid)  # the whole group, the block's children too
    finally:
        if block.poll() is None:
            os.killpg(block.pid, signal.SIGKILL)


def members_of(pgid: int) -> dict[int, str]:
    """pid -> command line of the live processes of group ``pgid``."""
    found = {}
    for pid, (_, cmd) in processes().items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found[pid] = cmd
    return found


def test_the_ledger_keeps_the_records_of_earlier_runners(tmp_path: Path) -> None:
    earlier = BlockLedger(tmp_path, runner=1)
    earlier._append({"executor": "local", "block": "0", "job_id": "17", "provider": "SlurmProvider"})
    with (tmp_path / "blocks.jsonl").open("a") as f:
        f.write('{"executor": "local", "blo')  # a runner killed mid-write
    mine = BlockLedger(tmp_path)
    mine._append({"executor": "local", "block": "1", "job_id": "18", "provider": "SlurmProvider"})
    assert [r["job_id"] for r in BlockLedger(tmp_path, runner=2).previous()] == ["17", "18"]
    assert [r["job_id"] for r in mine.previous()] == ["17"]


def test_a_second_runner_is_refused_while_the_first_lives(tmp_path: Path) -> None:
    other = subprocess.Popen(["sleep", "30"])
    try:
        holder = {"pid": other.pid, "host": os.uname().nodename, "started": process_start_time(other.pid)}
        (tmp_path / "runner.json").write_text(json.dumps(holder))
        with pytest.raises(WorkflowError, match=f"being run by process {other.pid}"):
            RunnerLock(tmp_path).acquire()
    finally:
        other.kill()
        other.wait()
    RunnerLock(tmp_path).acquire()  # its holder is gone: taken over
    assert json.loads((tmp_path / "runner.json").read_text())["pid"] == os.getpid()


# ----------------------------------------------------------------------------- the two hangs, end to end

WORKFLOW = """\
name: hang
checkpoint: {interval: 20}
members:
  - {name: m, workload: mlp-digits, steps: 300, params: {hidden: 16}, count: 6}
"""


@pytest.fixture
def quick_site(tmp_path: Path) -> Path:
    """The local site with a 10 s stall timeout, so that the tests wait seconds, not minutes."""
    text = (REPO / "site-configs/local.yaml").read_text()
    site = tmp_path / "site.yaml"
    site.write_text(text.replace("stall_timeout: 30s", "stall_timeout: 10s"))
    return site


def standby_at_once(tmp_path: Path) -> Path:
    """The local site with its standby pool started as soon as a block runs (``standby_after:
    0s``): the tests of what a lost pool's standby does lose it sooner than the default 30 s."""
    site = tmp_path / "standby-site.yaml"
    text = (REPO / "site-configs/local.yaml").read_text()
    site.write_text(text.replace("\nfacts:\n", "\nfacts:\n  standby_after: 0s\n", 1))
    return site


def start_runner(tmp_path: Path, site: Path, **popen: object) -> subprocess.Popen:
    """``resilient-flows run`` of :data:`WORKFLOW` into ``tmp_path/run``, as a process of its own."""
    (tmp_path / "wf.yaml").write_text(WORKFLOW)
    return subprocess.Popen(
        [CLI, "run", tmp_path / "wf.yaml", "--site", site, "--run-dir", tmp_path / "run"],
        **popen,  # type: ignore[arg-type]
    )


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        found[int(entry)] = (int(stat[stat.rfind(")") + 2 :].split()[1]), cmdline)
    return found


def pools_of(run_dir: Path) -> list[int]:
    return [pid for pid, (_, cmd) in processes().items() if "process_worker_pool" in cmd and str(run_dir) in cmd]


def running_pool(run_dir: Path) -> int:
    """The pool that runs the run's members (the local site keeps a standby pool beside it): the
    one among whose descendants a running attempt's heartbeat names its process."""
    everything = processes()
    pools = set(pools_of(run_dir))
    found = set()
    for path in run_layout(run_dir).heartbeats.iterdir():
        beat = read_attempt_heartbeat(path)
        pid = None if beat is None else beat.get("pid")
        for _ in range(8):
            if pid is None or pid in pools:
                break
            pid = everything.get(pid, (None, ""))[0]
        if pid in pools:
            found.add(pid)
    (pool,) = found
    return pool


def wait_for_checkpoints(run_dir: Path, count: int, runner: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(e["kind"] == "checkpointed" for e in read_events(run_dir)) >= count:
            return
        assert runner.poll() is None, "the runner ended before the fault"
        time.sleep(0.2)
    raise AssertionError(f"no {count} checkpoints within {timeout} s")


#: Fault-free digests by member spec: a member's training is a function of its spec, so the tests
#: that run :data:`WORKFLOW` share one reference run per member.
REFERENCE_DIGESTS: dict[str, str] = {}


def assert_every_member_matches_a_fault_free_run(run_dir: Path, reference: Path) -> None:
    for spec in read_plan(run_dir).members:
        result = json.loads((run_dir / "members" / spec.name / "result.json").read_text())
        plain = replace(spec, faults=()).to_dict()
        key = json.dumps(plain, sort_keys=True)
        if key not in REFERENCE_DIGESTS:
            REFERENCE_DIGESTS[key] = run_member(plain, str(reference))["digest"]
        assert result["digest"] == REFERENCE_DIGESTS[key]


@pytest.mark.slow
def test_a_pool_whose_workers_and_manager_process_were_killed_is_replaced(tmp_path: Path, quick_site: Path) -> None:
    """Once hung forever: the pool's main thread dies with its multiprocessing manager, its
    heartbeat thread keeps answering the interchange, and no task ever starts or fails."""
    run_dir = tmp_path / "run"
    runner = start_runner(tmp_path, quick_site, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_checkpoints(run_dir, 2, runner)
        pool = running_pool(run_dir)
        spawned = [pid for pid, (parent, _) in processes().items() if parent == pool]
        assert len(spawned) >= 3  # two workers and the manager process (and a resource tracker)
        killed_at = time.monotonic()
        for pid in spawned:
            os.kill(pid, signal.SIGKILL)
        out, _ = runner.communicate(timeout=180)
    finally:
        if runner.poll() is None:
            runner.kill()
    took = time.monotonic() - killed_at
    assert runner.returncode == 0, out
    lost = [e for e in read_events(run_dir) if e["kind"] == "lost"]
    # the watchdog found it: by a member that saw its pool's manager gone (the fast path), by a
    # silent attempt or, first on a loaded machine, by the silent block holding them
    found = ("is gone, as", "no heartbeat", "none has beaten")
    assert lost and all(any(how in e["reason"] for how in found) for e in lost), lost
    assert took < 10 + 60  # the stall timeout, then a new pool and the rest of the run
    assert pools_of(run_dir) == []
    assert_every_member_matches_a_fault_free_run(run_dir, tmp_path / "reference")


@pytest.mark.slow
def test_resume_cancels_the_orphaned_pool_of_a_killed_runner(tmp_path: Path, quick_site: Path) -> None:
    run_dir = tmp_path / "run"
    runner = start_runner(tmp_path, quick_site, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_checkpoints(run_dir, 2, runner)
        pool = running_pool(run_dir)
        everything = processes()
        servers = {pid for pid, (parent, cmd) in everything.items() if parent == pool and "forkserver" in cmd}
        workers = [  # spawned by the pool, or forked by its fork server (a warm pool)
            pid
            for pid, (parent, cmd) in everything.items()
            if (parent == pool and "spawn_main" in cmd) or parent in servers
        ]
        interchange = [pid for pid, (parent, cmd) in everything.items() if parent == runner.pid]
        for pid in [*workers[:2], runner.pid, *interchange]:
            os.kill(pid, signal.SIGKILL)
        runner.wait(timeout=10)
        time.sleep(2)
        assert pool in pools_of(run_dir)  # orphaned: it would hold its node until the walltime
    finally:
        if runner.poll() is None:
            runner.kill()
    resumed = subprocess.run([CLI, "resume", run_dir], capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "left by an earlier runner" in resumed.stdout
    assert pool not in processes() and pools_of(run_dir) == []
    assert_every_member_matches_a_fault_free_run(run_dir, tmp_path / "reference")


TWO_MEMBERS = WORKFLOW.replace("count: 6", "count: 2")
#: Members that train long enough (about 10 s on an idle core) for the runner to start a standby block.
TWO_LONGER = TWO_MEMBERS.replace("steps: 300", "steps: 1500")


def descendants(pid: int) -> list[int]:
    everything, found, frontier = processes(), [], [pid]
    while frontier:
        children = [child for child, (parent, _) in everything.items() if parent in frontier]
        found.extend(children)
        frontier = children
    return found


def pool_and_manager(run_dir: Path) -> tuple[int, int]:
    """The run's worker pool and its multiprocessing manager (the pool's oldest spawned child)."""
    pool = running_pool(run_dir)
    spawned = [pid for pid, (parent, cmd) in processes().items() if parent == pool and "spawn_main" in cmd]
    return pool, min(spawned, key=lambda pid: (process_start_time(pid) or 0, pid))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["pool", "manager", "pool-and-workers"])
def test_a_lost_pool_is_noticed_by_its_members_not_by_parsl_s_threshold(tmp_path: Path, target: str) -> None:
    """The pool SIGKILLed (its workers train on, orphaned), or its multiprocessing manager (its
    heartbeat thread answers on, so Parsl never notices): the members see it at their next look
    at the pool, the runner fails their tasks at once, and they resume free on the standby block that
    waited, started and preloaded, before the fault. The pool and all its workers SIGKILLed
    together (a warm pool's fork server ends with it, and its workers with the server, before
    they look): the runner, on the pool's host, sees it and says so for them. (The
    site's own stall timeout, 30 s, so that a block slow to start on a loaded machine is not lost.)"""
    run_dir = tmp_path / "run"
    (tmp_path / "wf.yaml").write_text(TWO_LONGER)
    site = standby_at_once(tmp_path)
    runner = subprocess.Popen(
        [CLI, "run", tmp_path / "wf.yaml", "--site", site, "--run-dir", run_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for_checkpoints(run_dir, 2, runner)
        wait_for(lambda: len(blocks_of(run_dir)) >= 2, 120, "a standby block beside the running one")
        pool, manager = pool_and_manager(run_dir)
        killed = time.time()
        for pid in {"pool": [pool], "manager": [manager]}.get(target) or [pool, *descendants(pool)]:
            os.kill(pid, signal.SIGKILL)
        out, _ = runner.communicate(timeout=240)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, out
    events = [e for e in read_events(run_dir) if e["time"] >= killed]
    gone = f"worker pool (pid {pool}) exited"
    if target == "manager":
        gone = f"worker pool's multiprocessing manager (pid {manager}) exited"
    first: dict[str, dict] = {}
    for event in events:
        if event["kind"] == "failed":
            first.setdefault(event["member"], event)
    ended = list(first.values())  # the attempts the fault ended
    assert ended and all(e["cost"] == 0.0 for e in ended), ended
    # the attempt that saw it first says how; the others may be ended before they looked
    assert all(e["cause"].startswith("infrastructure: its worker pool was lost") for e in ended), ended
    assert any(e["cause"] == f"infrastructure: its worker pool was lost (its {gone})" for e in ended), ended
    # ended by the runner (its ManagerLost names the block) or by the attempt's own stop, in a pool that
    # could still report it: never by the interchange's heartbeat threshold, which names the pool's id
    (lost, *_) = [e for e in events if e["kind"] == "lost"] or [None]
    if lost is not None:
        assert lost["reason"].startswith(f"the worker pool of block {lost['block']} is gone") and gone in lost["reason"]
    # (the watchdog's block, or the one the retry handler retired when a member's own stop came first)
    blocked = f"ManagerLost: Task failure due to loss of manager block-{lost['block'] + ' ' if lost else ''}"
    assert all(e["error"].startswith((blocked, "Preempted: ")) for e in ended), ended
    if target != "manager":  # nothing in it could report: the runner failed the tasks
        assert lost is not None and all(e["error"].startswith(blocked) for e in ended), ended
    assert pools_of(run_dir) == []
    # the lost members resumed in the standby, started before the fault, not in a block started for them
    standby = blocks_of(run_dir)[1]
    resumed = {e["member"]: e["block"] for e in events if e["kind"] == "started" and e["member"] in first}
    assert resumed == {name: standby for name in first}, resumed
    assert_every_member_matches_a_fault_free_run(run_dir, tmp_path / "reference")


@pytest.mark.slow
def test_a_lost_interchange_hands_its_waiting_pool_to_the_next_parsl_instance(tmp_path: Path) -> None:
    """The interchange SIGKILLed: the runner starts Parsl again, and the standby pool that waited,
    preloaded, for the lost instance becomes the new instance's first block (the same process,
    run with the new interchange's arguments) instead of a block started cold."""
    run_dir = tmp_path / "run"
    (tmp_path / "wf.yaml").write_text(TWO_LONGER)
    runner = subprocess.Popen(
        [CLI, "run", tmp_path / "wf.yaml", "--site", standby_at_once(tmp_path), "--run-dir", run_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for_checkpoints(run_dir, 2, runner, timeout=240)
        wait_for(lambda: len(blocks_of(run_dir)) >= 2, 120, "a standby block beside the running one")
        (interchange,) = [r["interchange"] for r in read_records(run_layout(run_dir)) if "interchange" in r]
        standby = [r["pid"] for r in read_records(run_layout(run_dir)) if r.get("block") == "1"]
        killed = time.time()
        os.kill(interchange, signal.SIGKILL)
        out, _ = runner.communicate(timeout=240)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, out
    records = list(read_records(run_layout(run_dir)))
    second = [i for i, r in enumerate(records) if "interchange" in r][1]  # the new instance's records follow
    firsts = [r for r in records[second:] if r.get("block") == "0"]
    assert [r["pid"] for r in firsts] == standby, records  # its block 0 is the process that waited
    events = [e for e in read_events(run_dir) if e["time"] >= killed]
    assert any(e["kind"] == "lost" and "interchange of executor local exited" in e["reason"] for e in events)
    assert {e["block"] for e in events if e["kind"] == "started"} == {"0"}
    assert not [e for e in events if e["kind"] == "failed" and e.get("cost")], events
    assert pools_of(run_dir) == []
    assert_every_member_matches_a_fault_free_run(run_dir, tmp_path / "reference")


def blocks_of(run_dir: Path) -> list[str]:
    """The blocks the run's runner recorded, in order."""
    return [r["block"] for r in read_records(run_layout(run_dir)) if "block" in r]


# ----------------------------------------------------------------------------- configuration


def test_members_and_sites_set_the_stall_timeout(tmp_path: Path) -> None:
    from resilient_flows.workflow import load_workflow

    path = tmp_path / "wf.yaml"
    path.write_text(
        "name: t\nmembers:\n  - {name: a, workload: mlp-digits, steps: 5, count: 2, stall_timeout: 2m}\n"
        "  - {name: b, workload: mlp-digits, steps: 5}\n"
        "explore:\n  - {name: pop, strategy: random, workload: mlp-digits, steps: 5, population: 2,\n"
        "     hyperparameters: {lr: {range: [0.01, 0.1]}}}\n"
    )
    specs = {s.name: s for s in load_workflow(path).member_specs(None)}
    assert {n: (s.family, s.stall_timeout_s) for n, s in specs.items()} == {
        "a-0": ("a", 120.0),
        "a-1": ("a", 120.0),
        "b": ("b", None),
        "pop-0": ("pop", None),
        "pop-1": ("pop", None),
    }
    path.write_text("name: t\nmembers:\n  - {name: a, workload: mlp-digits, steps: 5, stall_timeout: 0s}\n")
    with pytest.raises(WorkflowError, match="stall_timeout must be positive"):
        load_workflow(path)


def test_a_site_stall_timeout_must_be_a_duration(tmp_path: Path) -> None:
    from resilient_flows.errors import SiteConfigError
    from resilient_flows.sites import site_facts

    site = tmp_path / "s.yaml"
    text = (REPO / "site-configs/local.yaml").read_text()
    site.write_text(text.replace("stall_timeout: 30s", "stall_timeout: 90s"))
    assert site_facts(site).stall_timeout_s == 90.0
    site.write_text(text.replace("stall_timeout: 30s", "stall_timeout: soon"))
    with pytest.raises(SiteConfigError, match=r"facts\.stall_timeout must be a duration"):
        site_facts(site)


def test_holding_a_block_of_a_dead_interchange_gives_up_and_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault that takes a block's pool and the interchange at once: Parsl's hold waits forever
    for an answer, and the runner, holding the block before it cancels it, must not wait with it."""
    from resilient_flows.sites._parsl import _executor

    monkeypatch.setattr(_executor, "HOLD_ANSWER_S", 0.2)
    never = threading.Event()
    asked: list[str] = []

    class DeadInterchange:
        def _hold_block(self, block: str) -> None:
            asked.append(block)
            never.wait()

    _executor.hold_block(DeadInterchange(), "3")  # returns, after 0.2 s
    assert asked == ["3"]
    never.set()


def test_holding_a_block_stops_waiting_once_the_interchange_process_exits() -> None:
    """The interchange killed while the runner waits for its answer (or before it asks): the
    runner goes on at once, to notice the lost interchange, instead of waiting out the 5 s."""
    from resilient_flows.sites._parsl import _executor

    never = threading.Event()
    asked: list[str] = []

    class KilledInterchange:
        def __init__(self) -> None:
            self.interchange_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

        def _hold_block(self, block: str) -> None:
            asked.append(block)
            never.wait()

    executor = KilledInterchange()
    threading.Timer(0.3, executor.interchange_proc.kill).start()
    began = time.monotonic()
    _executor.hold_block(executor, "1")
    assert asked == ["1"] and time.monotonic() - began < _executor.HOLD_ANSWER_S / 2
    executor.interchange_proc.wait()
    _executor.hold_block(executor, "2")  # already dead: not asked
    assert asked == ["1"]
    never.set()


def test_an_interchange_that_exits_as_parsl_starts_is_started_again_at_once(tmp_path: Path) -> None:
    """The interchange killed as Parsl starts it (a resumed runner's, in a burst of faults): HTEX
    would wait 120 s for its answer, then raise, and the runner died of it. Now Parsl starts again
    within seconds; an interchange that exits every time is an error that says so."""
    import io

    import parsl
    from rich.console import Console

    from resilient_flows.sites import SiteFile
    from resilient_flows.sites._parsl import close_parsl_logs, parsl_file_logs
    from resilient_flows.workflow._parsl_instance import INTERCHANGE_START_TRIES, load_parsl
    from resilient_flows.workflow._runner import _site_config

    dying = [sys.executable, "-c", "import sys; sys.stdin.buffer.read(); sys.exit(3)"]  # reads its config, exits
    dies = iter([True, False])

    def config(die: bool) -> parsl.Config:
        built = _site_config(SiteFile.open("local"), tmp_path / "run", 0, 0)
        built.executors[0].provider.init_blocks = 0  # the interchange is what must start
        if die:
            built.executors[0].interchange_launch_cmd = dying
        return built

    out = io.StringIO()
    began = time.monotonic()
    dfk, started = load_parsl(config(True), lambda: config(next(dies)), Console(file=out, width=200))
    try:
        assert time.monotonic() - began < 30  # not HTEX's 120 s
        said = "the interchange of executor local exited (status 3) as Parsl started: starting it again"
        assert said in out.getvalue()
        assert started.executors[0].interchange_proc.poll() is None  # the second one runs
    finally:
        logs = parsl_file_logs(started.run_dir)
        dfk.cleanup()
        parsl.clear()
        close_parsl_logs(logs)
    with pytest.raises(WorkflowError, match=f"exited \\(status 3\\) as Parsl started, {INTERCHANGE_START_TRIES} times"):
        load_parsl(config(True), lambda: config(True), Console(file=io.StringIO()))

    def terminating() -> list[threading.Thread]:  # each given up start's channel closed: none waits on
        return [t for t in threading.enumerate() if t.name == "interchange-gone"]

    wait_for(lambda: not terminating(), 10, "the given up starts' ZeroMQ contexts to terminate")
