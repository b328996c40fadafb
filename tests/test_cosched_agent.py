"""The preemption agent: heartbeats, the Slurm adapter's parsing, the agent's rules, and end to end
on the real one-node Slurm cluster of ``.ci/slurm-up`` (CPUs stand in for nodes there)."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from slurm import cancel, require_slurm

from resilient_flows.checkpoint import Checkpointer, TierSpec
from resilient_flows.checkpoint._heartbeat import (
    FILENAME,
    CheckpointHeartbeat,
    HeartbeatWriter,
    read_checkpoint_heartbeat,
)
from resilient_flows.cli import main as cli_main
from resilient_flows.cosched import OnDemandRequest, RunningJob, decide, decision_cost
from resilient_flows.cosched._agent import Agent, AgentConfig, AgentStateError, is_marked, running_job
from resilient_flows.cosched._batch import BatchCommandError, BatchJob, clean
from resilient_flows.cosched._slurm import (
    TEXT_FORMAT,
    SlurmBatch,
    _timestamp,
    parse_sinfo_json,
    parse_squeue_json,
    parse_squeue_text,
)
from resilient_flows.errors import InvalidJobError
from resilient_flows.examples.preemptible import train

NOW = 1_796_396_700.0

# ------------------------------------------------------------------------------------ heartbeat


def test_a_checkpointer_publishes_its_newest_shared_commit_and_restore_time(tmp_path: Path) -> None:
    state = {"w": np.arange(16.0)}
    before = time.time()
    with Checkpointer([tmp_path / "local", TierSpec(tmp_path / "shared", persist_every=2)]) as ckpt:
        for step in range(4):
            ckpt.save(step, state)
            ckpt.wait()
    beat = read_checkpoint_heartbeat(tmp_path / "shared" / FILENAME)
    assert beat.step == 3  # steps 1 and 3 went to the shared tier: the newest
    assert before <= beat.committed <= time.time() and beat.period is not None and beat.period > 0
    with Checkpointer(tmp_path / "shared") as again:
        assert again.restore(state) == 3
        again.save(4, state)
    restored = read_checkpoint_heartbeat(tmp_path / "shared" / FILENAME)
    assert restored.step == 4 and restored.restore is not None and restored.restore < 30
    assert not [p for p in (tmp_path / "shared").iterdir() if p.name.endswith(".tmp")]
    with Checkpointer(tmp_path / "quiet", heartbeat=False) as quiet:
        quiet.save(0, state)
    assert not (tmp_path / "quiet" / FILENAME).exists()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON"),
        ('{"format": "other"}', "not a resilient-flows-heartbeat/1 file"),
        ('{"format": "resilient-flows-heartbeat/1", "step": -1}', "step must be a whole number"),
        ('{"format": "resilient-flows-heartbeat/1", "step": 1, "committed": "soon"}', "committed must be a Unix time"),
        (
            '{"format": "resilient-flows-heartbeat/1", "step": 1, "committed": 5, "period": 0, "written": 5}',
            "period must be seconds > 0",
        ),
        ("x" * 70_000, "larger than"),
    ],
)
def test_a_bad_heartbeat_is_refused_with_the_field_named(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / FILENAME
    path.write_text(text)
    with pytest.raises(ValueError, match=problem):
        read_checkpoint_heartbeat(path)


def test_the_heartbeat_is_replaced_whole(tmp_path: Path) -> None:
    writer = HeartbeatWriter(tmp_path)
    for step in range(3):
        writer.committed(step, 0.5)
    assert read_checkpoint_heartbeat(tmp_path / FILENAME).step == 2
    assert [p.name for p in tmp_path.iterdir()] == [FILENAME]  # no temporary file left beside it


# ------------------------------------------------------------------------------------ Slurm output

SQUEUE_22_05 = {
    "meta": {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}},
    "errors": [],
    "jobs": [
        {"job_id": 4, "name": "a", "user_name": "ann", "partition": "batch", "job_state": "RUNNING", "node_count": 2,
         "cpus": 64, "start_time": 1796396658, "submit_time": 1796396600, "time_limit": 10, "comment": "",
         "priority": 4294901754, "state_reason": "None"},
        {"job_id": 5, "name": "b", "user_name": "bob", "user_id": 1002, "partition": "batch", "job_state": "RUNNING",
         "node_count": 1, "cpus": 32, "start_time": 1796396658, "submit_time": 1796396658, "time_limit": None,
         "comment": "rf-heartbeat:/lus/run/b/checkpoint-heartbeat.json", "priority": 4294901753,
         "state_reason": "None"},
        {"job_id": 6, "name": "c", "user_name": "cy", "partition": "batch", "job_state": "PENDING", "node_count": 1,
         "cpus": 1, "start_time": 0, "submit_time": 1796396658, "time_limit": None, "comment": "rf-ondemand",
         "priority": 4294901752, "state_reason": "Resources"},
        {"job_id": 7, "name": "d", "user_name": "dee", "partition": "batch", "job_state": "PENDING", "node_count": 1,
         "cpus": 1, "start_time": 0, "submit_time": 1796396658, "time_limit": None, "comment": "", "priority": 0,
         "state_reason": "JobHeldUser"},
        {"job_id": 3, "name": "gone", "user_name": "ann", "partition": "batch", "job_state": "CANCELLED",
         "node_count": 1, "cpus": 1, "start_time": 1796396418, "submit_time": 1796396417, "time_limit": None,
         "comment": "", "priority": 1, "state_reason": "None"},
    ],
}  # fmt: skip


def _newer(record: dict) -> dict:
    """The same record as Slurm 23.02+ prints it: states as lists, numbers as {set, infinite, number}."""
    out = dict(record)
    out["job_state"] = [record["job_state"]]
    for key in ("node_count", "cpus", "start_time", "submit_time", "priority"):
        out[key] = {"set": True, "infinite": False, "number": record[key]}
    limit = record["time_limit"]
    out["time_limit"] = {"set": limit is not None, "infinite": limit is None, "number": limit or 0}
    return out


@pytest.mark.parametrize("newer", [False, True], ids=["22.05", "23.02+"])
def test_squeue_json_gives_running_and_pending_jobs(newer: bool) -> None:
    data = dict(SQUEUE_22_05, jobs=[_newer(j) if newer else j for j in SQUEUE_22_05["jobs"]])
    jobs = {job.id: job for job in parse_squeue_json(json.dumps(data))}
    assert sorted(jobs) == ["3", "4", "5", "6", "7"] and jobs["3"].state == "other"  # cancelled
    a = jobs["4"]
    assert (a.state, a.nodes, a.cpus, a.user, a.queue, a.start, a.time_limit) == (
        "running",
        2,
        64,
        "ann",
        "batch",
        1796396658.0,
        600.0,
    )
    assert a.expected_end == 1796396658.0 + 600 and jobs["5"].time_limit is None
    assert jobs["5"].heartbeat == "/lus/run/b/checkpoint-heartbeat.json" and jobs["4"].heartbeat == ""
    assert (jobs["5"].uid, jobs["4"].uid) == (1002, None)  # user_id where squeue gives it, else the name is looked up
    assert jobs["6"].state == "pending" and not jobs["6"].held and jobs["6"].start is None
    assert jobs["6"].priority == 4294901752 and jobs["7"].priority == 0
    assert jobs["7"].held


def test_no_user_text_but_the_last_field_reaches_the_squeue_text_format() -> None:
    """A job name holding ``|`` would shift the fields after it: its user, partition, state."""
    fields = TEXT_FORMAT.split("|")
    assert "%j" not in fields and fields[-1] == "%k" and fields.count("%k") == 1


def test_squeue_text_is_read_where_json_is_unavailable() -> None:
    text = (
        "6|root|0|debug|PENDING|1|1|2026-12-04T15:04:18|N/A|UNLIMITED|Resources|4294901755|rf-ondemand\n"
        "7|root|0|debug|PENDING|1|1|2026-12-04T15:04:18|N/A|UNLIMITED|JobHeldUser|0|(null)\n"
        "4|ann|1001|debug|RUNNING|2|8|2026-12-04T15:04:18|2026-12-04T15:04:18|1-02:03:04|None|4294901757|"
        "rf-heartbeat:/lus/a|b/checkpoint-heartbeat.json\n"
    )
    jobs = {job.id: job for job in parse_squeue_text(text)}
    assert jobs["4"].time_limit == ((24 + 2) * 60 + 3) * 60 + 4 and jobs["4"].cpus == 8
    assert (jobs["4"].user, jobs["4"].uid, jobs["4"].heartbeat) == ("ann", 1001, "/lus/a|b/checkpoint-heartbeat.json")
    assert jobs["6"].priority == 4294901755 and jobs["7"].priority == 0
    assert jobs["7"].held and jobs["7"].comment == "" and jobs["6"].comment == "rf-ondemand"
    assert jobs["6"].heartbeat == "" and jobs["6"].uid == 0

    calls = []

    def old_slurm(argv: list[str]) -> str:
        calls.append(argv[:2])
        if "--json" in argv:
            raise BatchCommandError("squeue --json: exit status 1 after 0.0 s: squeue: unrecognized option '--json'")
        return text

    batch = SlurmBatch(run=old_slurm)
    assert len(batch.jobs()) == 3 and len(batch.jobs()) == 3
    assert calls == [["squeue", "--json"], ["squeue", "-h"], ["squeue", "-h"]]  # JSON tried once only
    for line, problem in [
        ("6|root|0|debug|PENDING|1|1", "7 fields instead of 13"),
        ("6|root|0|debug|PENDING|one|1|N/A|N/A|UNLIMITED|Resources|10|(null)", "invalid literal for int"),
        ("6|root|0|debug|PENDING|1|1|N/A|N/A|UNLIMITED|Resources|high|(null)", "could not convert string to float"),
    ]:
        with pytest.raises(BatchCommandError, match=re.escape(f"squeue -o: a line the agent cannot read ({problem}")):
            parse_squeue_text(line)


def test_sinfo_gives_free_nodes_or_cpus() -> None:
    nodes = [
        {"name": "n1", "state": "idle", "state_flags": [], "cpus": 4, "idle_cpus": 4},
        {"name": "n2", "state": "mixed", "state_flags": [], "cpus": 4, "idle_cpus": 1},
        {"name": "n3", "state": "idle", "state_flags": ["DRAIN"], "cpus": 4, "idle_cpus": 4},
        {"name": "n4", "state": ["IDLE"], "state_flags": [], "cpus": 4, "idle_cpus": 4},
        {"name": "n5", "state": "down", "state_flags": [], "cpus": 4, "idle_cpus": 4},
    ]
    text = json.dumps({"nodes": nodes})
    assert parse_sinfo_json(text, "nodes") == 2 and parse_sinfo_json(text, "cpus") == 9
    with pytest.raises(BatchCommandError, match="sinfo --json printed no node list"):
        parse_sinfo_json("oops", "nodes")


def test_job_ids_are_checked_before_they_reach_a_command_line() -> None:
    batch = SlurmBatch(run=lambda argv: pytest.fail(f"ran {argv}"))
    with pytest.raises(BatchCommandError, match="not a Slurm job id"):
        batch.signal("12; rm -rf /", "USR1")


# ------------------------------------------------------------------------------------ the agent's rules


class Queue:
    """A batch system in memory: the agent's rules tested without a scheduler's timing."""

    name = "memory"
    requeues_exited = True
    can_prioritize = True

    def __init__(self, jobs: list[BatchJob], free: int) -> None:
        self.list, self.free_now, self.done = jobs, free, []
        self.failing = 0

    def jobs(self) -> list[BatchJob]:
        if self.failing:
            self.failing -= 1
            raise BatchCommandError("squeue --json: no answer within 30 s")
        return list(self.list)

    def free(self, unit: str) -> int:
        return self.free_now

    def signal(self, job_id: str, signal: str) -> None:
        self.done.append(("signal", job_id, signal))
        self.list = [replace(j, state="other") if j.id == job_id else j for j in self.list]

    def requeue(self, job_id: str, *, hold: bool) -> None:
        self.done.append(("requeue", job_id, hold))
        self.list = [replace(j, state="pending", held=hold) if j.id == job_id else j for j in self.list]

    def release(self, job_id: str) -> None:
        self.done.append(("release", job_id))

    def prioritize(self, job_id: str, *, above: float) -> None:
        self.done.append(("prioritize", job_id, above))


def _job(id: str, start: float, *, state: str = "running", comment: str = "", user: str = "ann", queue: str = "batch",
         nodes: int = 1, priority: float | None = None, heartbeat: str = "",
         uid: int | None = os.getuid()) -> BatchJob:  # fmt: skip
    """A job of ``ann``, whom the scheduler knows as this test's uid: the heartbeats it writes are hers."""
    return BatchJob(
        id=id, name=id, user=user, queue=queue, state=state, nodes=nodes, cpus=nodes, submitted=start,
        start=start if state == "running" else None, time_limit=None, comment=comment, priority=priority,
        heartbeat=heartbeat, uid=uid,
    )  # fmt: skip


def _beat(tmp_path: Path, name: str, committed: float, restore: float = 5.0, period: float = 600.0) -> str:
    """The path of a heartbeat written as the Checkpointer writes one."""
    path = tmp_path / f"{name}.json"
    beat = CheckpointHeartbeat(
        step=9, committed=committed, period=period, restore=restore, written=committed, host="n", pid=1
    )
    path.write_text(json.dumps(beat.__dict__))
    return str(path)


def test_the_agent_preempts_the_job_that_checkpointed_last_and_logs_a_replayable_decision(tmp_path: Path) -> None:
    fresh = _job("10", NOW - 3000, heartbeat=_beat(tmp_path, "fresh", NOW - 20))
    stale = _job("11", NOW - 1000, heartbeat=_beat(tmp_path, "stale", NOW - 900))
    silent = _job("12", NOW - 500)  # no heartbeat: everything since its start is at stake
    request = _job("20", NOW - 5, state="pending", comment="rf-ondemand")
    queue = Queue([fresh, stale, silent, request], free=0)
    log = tmp_path / "events.jsonl"
    agent = Agent(queue, AgentConfig(grace=30, interval=1), log_path=log, clock=lambda: NOW)
    (event,) = agent.poll()
    assert event["decision"]["preempt"] == ["10"] and event["acted"]
    assert queue.done == [("signal", "10", "USR1")]
    logged = json.loads(log.read_text())
    inputs = logged["inputs"]
    replay = decide(
        **{**inputs, "running": [RunningJob(**r) for r in inputs["running"]],
           "request": OnDemandRequest(**inputs["request"])}
    )  # fmt: skip
    assert list(replay.preempt) == logged["decision"]["preempt"] and replay.cost == logged["decision"]["cost"]
    # youngest (Slurm's kind of victim) takes the job that started last: 500 s lost instead of 20
    young = Agent(Queue([fresh, stale, silent, request], 0), AgentConfig(policy="youngest", dry_run=True),
                  clock=lambda: NOW).poll()[0]  # fmt: skip
    assert young["decision"]["preempt"] == ["12"] and not young["acted"]
    assert young["decision"]["cost"] - event["decision"]["cost"] == pytest.approx((500 + 60) - (20 + 5))


def test_a_preemption_due_before_the_next_poll_waits_for_the_victims_checkpoint(tmp_path: Path) -> None:
    # the victim checkpoints every 10 s, the last 9.5 s ago: preempting at its next checkpoint,
    # in 0.5 s, loses nothing; the next poll (5 s) would come too late, so the agent waits for it
    steady = _job("10", NOW - 3000, heartbeat=_beat(tmp_path, "steady", NOW - 9.5, restore=1.0))
    path = Path(steady.heartbeat)
    path.write_text(path.read_text().replace('"period": 600.0', '"period": 10.0'))
    waits: list[float] = []
    queue = Queue([steady, _job("20", NOW, state="pending", comment="rf-ondemand")], free=0)
    (event,) = Agent(queue, AgentConfig(interval=5), clock=lambda: NOW, sleep=waits.append).poll()
    assert event["decision"]["delay"] == pytest.approx(0.5) and event["acted"]
    assert waits == [pytest.approx(0.5)] and queue.done == [("signal", "10", "USR1")]


def test_a_victim_is_requeued_held_and_released_once_the_request_runs(tmp_path: Path) -> None:
    clock = [NOW]
    fresh = _job("10", NOW - 3000, heartbeat=_beat(tmp_path, "fresh", NOW - 20))
    request = _job("20", NOW - 5, state="pending", comment="rf-ondemand")
    queue = Queue([fresh, request], free=0)
    agent = Agent(queue, AgentConfig(grace=30, interval=1), clock=lambda: clock[0])
    agent.poll()  # signal: the victim exits (state other)
    clock[0] += 1
    assert [e["event"] for e in agent.poll()] == ["requeue"] and queue.done[-1] == ("requeue", "10", True)
    clock[0] += 1
    assert agent.poll() == []  # the request has not started yet: the victim stays held
    queue.list = [replace(request, state="running", start=clock[0]) if j.id == "20" else j for j in queue.list]
    clock[0] += 1
    assert [e["event"] for e in agent.poll()] == ["release"] and queue.done[-1] == ("release", "10")
    assert agent.preempting == {}


def test_where_exited_jobs_cannot_be_requeued_the_victim_is_requeued_while_it_runs(tmp_path: Path) -> None:
    clock = [NOW]
    request = _job("20", NOW - 5, state="pending", comment="rf-ondemand")
    queue = Queue([_job("10", NOW - 3000), request], free=0)
    queue.requeues_exited = False  # PBS Pro: qrerun is the signal
    agent = Agent(queue, AgentConfig(grace=30, interval=1), clock=lambda: clock[0])
    events = agent.poll()
    assert queue.done == [("requeue", "10", True)] and [e["event"] for e in events] == ["decision", "requeue"]
    queue.list = [replace(request, state="running", start=NOW + 1), queue.list[0]]
    clock[0] += 1
    assert [e["event"] for e in agent.poll()] == ["release"]


def test_a_victim_that_ignores_its_signal_is_requeued_after_its_grace(tmp_path: Path) -> None:
    clock = [NOW]
    stubborn = _job("10", NOW - 3000)
    queue = Queue([stubborn, _job("20", NOW, state="pending", comment="rf-ondemand")], free=0)
    queue.signal = lambda job_id, signal: queue.done.append(("signal", job_id, signal))  # it keeps running
    agent = Agent(queue, AgentConfig(grace=30, interval=1), clock=lambda: clock[0])
    agent.poll()
    clock[0] += 29
    assert agent.poll() == []
    clock[0] += 1
    assert [e["event"] for e in agent.poll()] == ["requeue_after_grace"]


def test_a_signal_that_fails_is_reported_and_the_request_decided_again_later(tmp_path: Path) -> None:
    clock = [NOW]
    queue = Queue([_job("10", NOW - 3000), _job("20", NOW, state="pending", comment="rf-ondemand")], free=0)

    def refuse(job_id: str, signal: str) -> None:
        raise BatchCommandError(f"scancel --signal {signal} {job_id}: Invalid job id specified")

    queue.signal = refuse
    agent = Agent(queue, AgentConfig(grace=30, interval=1), clock=lambda: clock[0])
    decision, failed = agent.poll()
    assert decision["acted"] and failed == {
        "t": NOW, "event": "signal_failed", "job": "10", "error": "scancel --signal USR1 10: Invalid job id specified"
    }  # fmt: skip
    assert agent.preempting == {}
    clock[0] += agent._patience
    assert [e["event"] for e in agent.poll()] == ["decision", "signal_failed"]


@pytest.mark.parametrize(
    ("request_priority", "prioritize", "can", "expected"),
    [
        (50.0, True, True, [("prioritize", "20", 100.0)]),  # a batch job ranked higher waits too
        (150.0, True, True, []),  # the request is ranked first already
        (50.0, False, True, []),  # --no-prioritize
        (50.0, True, False, []),  # PBS Pro: the queue's priority decides
    ],
)
def test_a_served_request_is_put_ahead_of_the_other_pending_jobs(
    request_priority: float, prioritize: bool, can: bool, expected: list
) -> None:
    """Else the pending batch job "30" would take the CPU the victim frees, and the victim would
    have lost its work for nothing. The held job "31" (say, an earlier victim) does not count."""
    queue = Queue(
        [
            _job("10", NOW - 3000),
            _job("20", NOW, state="pending", comment="rf-ondemand", priority=request_priority),
            _job("30", NOW - 60, state="pending", priority=100.0),
            replace(_job("31", NOW - 600, state="pending", priority=900.0), held=True),
        ],
        free=0,
    )
    queue.can_prioritize = can
    events = Agent(queue, AgentConfig(prioritize=prioritize), clock=lambda: NOW).poll()
    assert queue.done == [("signal", "10", "USR1"), *expected]
    assert [e["event"] for e in events] == ["decision"] + ["prioritize"] * len(expected)
    if expected:
        assert events[-1]["above"] == 100.0 and events[-1]["job"] == "20"


def test_the_agent_touches_only_batch_jobs_of_its_partitions_and_users() -> None:
    others = [
        _job("1", NOW - 10, queue="interactive"),  # another partition
        _job("2", NOW - 10, user="mallory"),  # another user
        _job("3", NOW - 10, comment="rf-ondemand"),  # a running on-demand job
        _job("20", NOW, state="pending", comment="rf-ondemand"),
    ]
    queue = Queue(others, free=0)
    agent = Agent(queue, AgentConfig(partitions=("batch",), users=("ann",)), clock=lambda: NOW)
    assert agent.poll() == [] and queue.done == []  # only untouchable jobs stand in the way: Slurm decides


def test_dry_run_decides_but_does_nothing() -> None:
    queue = Queue([_job("1", NOW - 100), _job("20", NOW, state="pending", comment="rf-ondemand")], free=0)
    (event,) = Agent(queue, AgentConfig(dry_run=True), clock=lambda: NOW).poll()
    assert event["decision"]["preempt"] == ["1"] and not event["acted"] and queue.done == []


def test_a_request_larger_than_the_machine_is_reported_once() -> None:
    queue = Queue([_job("1", NOW - 100), _job("20", NOW, state="pending", comment="rf-ondemand", nodes=5)], free=2)
    agent = Agent(queue, AgentConfig(), clock=lambda: NOW)
    (event,) = agent.poll()
    assert (event["event"], event["needs"], event["machine"]) == ("unfittable", 5, 3)
    assert agent.poll() == [] and queue.done == []


def test_a_failing_scheduler_makes_the_agent_back_off_and_say_so() -> None:
    queue = Queue([_job("1", NOW - 100)], free=0)
    queue.failing = 3
    waits: list[float] = []
    agent = Agent(queue, AgentConfig(interval=5), clock=lambda: NOW, sleep=waits.append)
    agent.run(polls=5)
    assert waits == [10, 20, 40, 5]  # doubled after each failure, back to the interval once it answers
    assert agent.failures == 0


def test_a_job_without_heartbeat_counts_as_unchecked_since_its_start(tmp_path: Path) -> None:
    config = AgentConfig()
    job = running_job(_job("1", NOW - 100), NOW, config)
    assert job.last_checkpoint is None and job.lost_at(NOW) == 100 + 60
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    queue = Queue(
        [_job("2", NOW - 100, heartbeat=str(broken)), _job("20", NOW, state="pending", comment="rf-ondemand")], 0
    )
    (event,) = Agent(queue, config, clock=lambda: NOW).poll()
    assert event["inputs"]["running"][0]["last_checkpoint"] is None
    beat = read_checkpoint_heartbeat(_beat(tmp_path, "old", NOW - 500))
    older = running_job(_job("3", NOW - 100), NOW, config, beat)
    assert older.last_checkpoint == NOW - 100  # committed before this run of the job began: its start


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [("--interval", "0", "interval must be"), ("--alpha", "-1", "alpha must be"), ("--signal", "USR1;x", "signal")],
)
def test_bad_agent_options_give_one_line_and_status_2(capsys, option: str, value: str, problem: str) -> None:
    assert cli_main(["cosched", "agent", option, value, "--polls", "1"]) == 2
    assert problem in capsys.readouterr().err


# ------------------------------------------------------------------------------------ end to end


def _sbatch(*args: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, check=True, timeout=30)
    return out.stdout.strip().split(";")[0]


def _state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip()


def _started_at(job_id: str) -> float | None:
    """When the job started (Unix time, whole seconds), None while it has not."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%S"], capture_output=True, text=True)
    state, _, start = out.stdout.strip().partition("|")
    return None if state == "PENDING" else _timestamp(start)


def _until(what: str, predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


def _worker(directory: Path, every: int, steps: int, step_s: float = 0.1) -> str:
    directory.mkdir()
    command = (
        f"exec {sys.executable} -m resilient_flows.examples.preemptible {directory} --steps {steps} --every {every}"
        f" --step-s {step_s}"
    )
    return _sbatch("-n1", "--requeue", "-J", f"rf-agent-{directory.name}", "-o", str(directory / "out"),
                   "--wrap", command)  # fmt: skip


@pytest.mark.slow
@pytest.mark.slurm
def test_on_slurm_the_agent_preempts_the_fresh_checkpoint_and_the_victim_resumes_bitwise(tmp_path: Path) -> None:
    """Two batch jobs hold the node's two CPUs: "fresh" (older, checkpoints every step) and "stale"
    (younger, checkpointed once). An on-demand job arrives. dp preempts "fresh"; youngest, asked
    on the same queue, would have taken "stale" and thrown away the work since its one checkpoint."""
    require_slurm()
    # long enough (40 s) that neither batch job ends before the decision however slow the setup
    # is under load: one that ended would free its CPU, and the request would need no victim
    steps, step_s = 160, 0.25
    ids: list[str] = []
    try:
        fresh = tmp_path / "fresh"
        ids.append(_worker(fresh, every=1, steps=steps, step_s=step_s))
        beats = [tmp_path / name / "shared" / FILENAME for name in ("fresh", "stale")]
        # the stale job starts seconds later (Slurm's start times are whole seconds): the younger
        _until("fresh checkpointing", beats[0].exists)
        ids.append(_worker(tmp_path / "stale", every=10_000, steps=steps, step_s=step_s))
        _until("both heartbeats published", lambda: all(b.exists() for b in beats))
        batch = SlurmBatch()
        _until("both comments set", lambda: all(j.comment for j in batch.jobs() if j.id in ids))
        # a batch job waits too, ranked above the on-demand job (submitted first): the agent must
        # put the request ahead of it, or the CPU the victim frees would go to this job
        ids.append(_sbatch("-n1", "-J", "rf-agent-waiting", "-o", "/dev/null", "--wrap", "sleep 1"))
        waiting = ids[-1]
        time.sleep(2.0)  # the stale job's one checkpoint ages
        ids.append(
            _sbatch("-n1", "-J", "rf-agent-ondemand", "--comment=rf-ondemand", "-o", "/dev/null", "--wrap", "sleep 1")
        )
        ondemand = ids[-1]
        _until("the on-demand job pending", lambda: _state(ondemand) == "PENDING")
        ranks = {j.id: j.priority for j in batch.jobs()}
        assert ranks[waiting] > ranks[ondemand]

        assert [_state(i) for i in ids[:2]] == ["RUNNING", "RUNNING"], "a batch job ended before the decision"
        youngest = Agent(batch, AgentConfig(unit="cpus", policy="youngest", dry_run=True)).poll()
        log = tmp_path / "events.jsonl"
        agent = Agent(batch, AgentConfig(unit="cpus", interval=0.5, grace=20), log_path=log)
        (decision,) = [e for e in agent.poll() if e["event"] == "decision"]
        assert decision["decision"]["preempt"] == [ids[0]] and decision["acted"]
        (young,) = [e for e in youngest if e["event"] == "decision"]
        assert young["decision"]["preempt"] == [ids[1]] and not young["acted"]
        stale_beat = read_checkpoint_heartbeat(beats[1])
        stale = next(r for r in decision["inputs"]["running"] if r["id"] == ids[1])
        assert stale["last_checkpoint"] == pytest.approx(stale_beat.committed)
        # each decision costs what the objective says for its own inputs and delay (dp may wait a
        # moment for the fresh job's next checkpoint); youngest's is the stale job's work since its
        # one checkpoint, seconds more
        for event in (decision, young):
            request = OnDemandRequest(**event["inputs"]["request"])
            victims = [RunningJob(**r) for r in event["inputs"]["running"] if r["id"] in event["decision"]["preempt"]]
            expected = decision_cost(
                event["decision"]["delay"], victims, now=event["t"], request=request, alpha=1, beta=1
            )
            assert event["decision"]["cost"] == pytest.approx(expected)
        assert young["decision"]["delay"] == 0.0
        assert young["decision"]["cost"] - decision["decision"]["cost"] > 1.5  # the stale job aged 2 s

        def started() -> float | None:
            agent.poll()
            job = next((j for j in batch.jobs() if j.id == ondemand), None)
            return job.start if job is not None and job.state == "running" else None

        began = _until("the on-demand job running", started, timeout=40)
        assert began - decision["t"] <= agent.config.interval + agent.config.grace
        # the freed CPU went to the request; the batch job ranked above it before waited for the next
        waiting_began = _started_at(waiting)
        assert waiting_began is None or waiting_began >= began

        def released() -> bool:
            agent.poll()
            return not agent.preempting

        _until("the victim released", released, timeout=40)
        events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
        assert events[:2] == ["decision", "prioritize"] and "requeue" in events and events[-1] == "release"
        _until("the victim finished", lambda: (fresh / "final.npy").exists(), timeout=180)
        np.testing.assert_array_equal(np.load(fresh / "final.npy"), train(steps))
        # the requeued victim may take the freed CPU first (it is older); the job waits for a CPU
        assert _until("the waiting batch job started", lambda: _started_at(waiting), timeout=180) >= began
        starts = [line.split() for line in (fresh / "starts").read_text().splitlines()]
        assert len(starts) == 2 and starts[1][1] == "1" and int(starts[1][0]) >= 0  # resumed, not restarted
    finally:
        cancel(ids)


@pytest.mark.slow
@pytest.mark.slurm
def test_on_slurm_an_agent_killed_after_requeuehold_releases_its_victim_once_restarted(tmp_path: Path) -> None:
    """The agent (the real command) signals a victim, which exits 75, and requeueholds it; it is
    SIGKILLed before the release. Restarted once the request runs, it releases the victim within
    two polls."""
    require_slurm()
    loop = "trap 'exit 75' USR1; while true; do sleep 0.2; done"
    ids = [_sbatch("-n1", "--requeue", "-J", f"rf-agent-kill-{n}", "-o", "/dev/null", "--wrap", loop) for n in "ab"]
    try:
        _until("both batch jobs running", lambda: all(_state(i) == "RUNNING" for i in ids))
        ids.append(_sbatch("-n1", "-J", "rf-agent-kill-req", "--comment=rf-ondemand", "-o", "/dev/null",
                           "--wrap", "sleep 3"))  # fmt: skip
        log = tmp_path / "events.jsonl"
        command = [str(Path(sys.executable).with_name("resilient-flows")), "cosched", "agent", "--unit", "cpus",
                   "--interval", "0.5", "--grace", "20", "--log", str(log)]  # fmt: skip

        def events() -> list[dict]:
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

        with open(tmp_path / "agent.out", "ab") as out:
            first = subprocess.Popen(command, stdout=out, stderr=out)
            try:
                requeued = _until("the requeue", lambda: [e for e in events() if e["event"] == "requeue"])
            finally:
                first.kill()
                first.wait()
        victim = requeued[0]["job"]
        batch = SlurmBatch()
        assert next(j for j in batch.jobs() if j.id == victim).held
        _until("the request started", lambda: _state(ids[2]) in ("RUNNING", "COMPLETING", "COMPLETED"))
        before = len(events())
        with open(tmp_path / "agent.out", "ab") as out:
            subprocess.run([*command, "--polls", "2"], stdout=out, stderr=out, check=True, timeout=60)
        assert [(e["event"], e.get("job")) for e in events()[before:]] == [("resumed", None), ("release", victim)]
        assert not next(j for j in batch.jobs() if j.id == victim).held
    finally:
        cancel(ids)


def test_config_errors_name_the_field() -> None:
    with pytest.raises(InvalidJobError, match="policy: unknown policy 'fifo'"):
        AgentConfig(policy="fifo")
    with pytest.raises(InvalidJobError, match="unit must be one of nodes, cpus"):
        AgentConfig(unit="gpus")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ what users write


@pytest.mark.parametrize(
    "comment",
    ["/x/rf-ondemand/y", "rf-ondemandx", "xrf-ondemand", "rf-heartbeat:/lus/rf-ondemand/checkpoint-heartbeat.json",
     "please:rf-ondemand", "RF-ONDEMAND"],
)  # fmt: skip
def test_a_forged_marker_neither_shields_nor_requests(comment: str) -> None:
    """A marker inside a path or another word is no marker: the pending job is no request, and the
    running job that carries it is a victim like any other."""
    assert not is_marked(comment, "rf-ondemand")
    queue = Queue(
        [_job("1", NOW - 100, comment=comment), _job("2", NOW - 50, state="pending", comment=comment)], free=0
    )
    assert Agent(queue, AgentConfig(), clock=lambda: NOW).poll() == []  # job 2 requests nothing
    queue.list.append(_job("20", NOW, state="pending", comment="urgent, rf-ondemand"))
    (event,) = Agent(queue, AgentConfig(), clock=lambda: NOW).poll()
    assert event["request"] == "20" and event["decision"]["preempt"] == ["1"]  # job 1 is not shielded


@pytest.mark.parametrize("comment", ["rf-ondemand", "urgent, rf-ondemand", "a,rf-ondemand,b", "x\trf-ondemand\n"])
def test_the_marker_is_a_whole_word_of_the_comment(comment: str) -> None:
    assert is_marked(comment, "rf-ondemand")


def test_with_an_ondemand_partition_the_comment_is_ignored() -> None:
    queue = Queue(
        [
            _job("1", NOW - 100, comment="rf-ondemand"),  # running, marked: still a victim
            _job("2", NOW - 10, state="pending", comment="rf-ondemand"),  # marked, in batch: no request
            _job("20", NOW, state="pending", queue="interactive"),
        ],
        free=0,
    )
    events = Agent(queue, AgentConfig(ondemand_partition="interactive"), clock=lambda: NOW).poll()
    assert [(e["event"], e.get("request")) for e in events] == [("decision", "20")]
    assert events[0]["decision"]["preempt"] == ["1"] and queue.done[0] == ("signal", "1", "USR1")


def test_a_marker_must_be_one_word() -> None:
    with pytest.raises(InvalidJobError, match="ondemand_marker must be one word"):
        AgentConfig(ondemand_marker="rf ondemand")
    AgentConfig(ondemand_marker="", ondemand_partition="interactive")  # unused with a partition


def _forget(agent: Agent) -> None:
    """Make a dry-run agent decide the same requests again at its next poll."""
    agent.served.clear()
    agent.preempting.clear()


def _untrusted(tmp_path: Path, kind: str) -> tuple[str, str]:
    """A heartbeat path of ``kind`` that the agent must not believe, and the reason it gives."""
    good = _beat(tmp_path, "good", NOW - 5)
    path = tmp_path / f"{kind}.json"
    if kind == "symlink":
        path.symlink_to(good)
        return str(path), "a symbolic link, not followed"
    if kind == "fifo":
        os.mkfifo(path)
        return str(path), "not a regular file"
    if kind == "directory":
        path.mkdir()
        return str(path), "not a regular file"
    if kind == "device":
        return "/dev/null", "not a regular file"
    if kind == "other-owner":
        os.chown(good, 12345, 12345)
        return good, "owned by uid 12345"
    if kind == "world-writable":
        os.chmod(good, 0o666)
        return good, "anyone may write it"
    if kind == "oversized":
        path.write_text(Path(good).read_text()[:-1] + ', "pad": "' + "x" * 70_000 + '"}')
        return str(path), "larger than 65536 bytes"
    if kind == "nested":
        path.write_text("[" * 60_000)
        return str(path), "not JSON"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["symlink", "fifo", "directory", "device", "other-owner", "world-writable", "oversized", "nested"]
)
def test_a_heartbeat_that_is_not_the_jobs_own_small_regular_file_is_no_heartbeat(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    if kind == "other-owner" and os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    path, reason = _untrusted(tmp_path, kind)
    with pytest.raises(ValueError, match=reason):
        read_checkpoint_heartbeat(path, owner=os.getuid())
    queue = Queue([_job("1", NOW - 100, heartbeat=path), _job("20", NOW, state="pending", comment="rf-ondemand")], 0)
    agent = Agent(queue, AgentConfig(dry_run=True), clock=lambda: NOW)
    with caplog.at_level("WARNING"):
        (event,) = agent.poll()
        _forget(agent)
        agent.poll()
    assert event["inputs"]["running"][0]["last_checkpoint"] is None  # "no checkpoint since start"
    (warning,) = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]  # said once, not per poll
    assert reason in warning


def test_a_heartbeat_whose_owner_cannot_be_established_is_no_heartbeat(tmp_path: Path) -> None:
    path = _beat(tmp_path, "beat", NOW - 5)
    jobs = [
        _job("1", NOW - 100, heartbeat=path, uid=None, user="no-such-user-rf"),  # unknown here
        _job("2", NOW - 100, heartbeat=path, uid=None, user=""),  # the scheduler said nothing
        _job("3", NOW - 100, heartbeat=os.path.relpath(path)),  # relative to what?
        _job("4", NOW - 100, heartbeat=path, uid=None, user=pwd.getpwuid(os.getuid()).pw_name),  # looked up: mine
        _job("20", NOW, state="pending", comment="rf-ondemand"),
    ]
    (event,) = Agent(Queue(jobs, 0), AgentConfig(dry_run=True), clock=lambda: NOW).poll()
    seen = {r["id"]: r["last_checkpoint"] for r in event["inputs"]["running"]}
    assert seen == {"1": None, "2": None, "3": None, "4": NOW - 5}


def test_a_fifo_heartbeat_costs_a_poll_at_most_its_deadline(tmp_path: Path) -> None:
    fifo = tmp_path / "checkpoint-heartbeat.json"
    os.mkfifo(fifo)  # a reader that opened it plainly would wait for a writer forever
    queue = Queue(
        [_job("1", NOW - 100, heartbeat=str(fifo)), _job("20", NOW, state="pending", comment="rf-ondemand")], 0
    )
    agent = Agent(queue, AgentConfig(dry_run=True, heartbeat_deadline=1.0), clock=lambda: NOW)
    began = time.monotonic()
    (event,) = agent.poll()
    assert time.monotonic() - began <= 1.0 and event["inputs"]["running"][0]["last_checkpoint"] is None


def test_reads_that_hang_count_as_no_heartbeat_after_the_deadline(tmp_path: Path, monkeypatch) -> None:
    """A hung file server: the read of one heartbeat never returns. The poll goes on at its deadline
    with the others read, and the next poll does not start a second read of the same file."""
    import resilient_flows.checkpoint._heartbeat as heartbeat

    hung, fine = _beat(tmp_path, "hung", NOW - 5), _beat(tmp_path, "fine", NOW - 7)
    release, calls = threading.Event(), []
    plain = heartbeat.read_checkpoint_heartbeat

    def read(path: str, *, owner: int | None = None) -> CheckpointHeartbeat:
        calls.append(path)
        if path == hung:
            release.wait(30)
        return plain(path, owner=owner)

    monkeypatch.setattr(heartbeat, "read_checkpoint_heartbeat", read)
    jobs = [_job("1", NOW - 100, heartbeat=hung), _job("2", NOW - 100, heartbeat=fine),
            _job("20", NOW, state="pending", comment="rf-ondemand")]  # fmt: skip
    agent = Agent(Queue(jobs, 0), AgentConfig(dry_run=True, heartbeat_deadline=0.3), clock=lambda: NOW)
    try:
        for _ in range(2):
            began = time.monotonic()
            (event,) = agent.poll()
            assert time.monotonic() - began < 1.0
            seen = {r["id"]: r["last_checkpoint"] for r in event["inputs"]["running"]}
            assert seen == {"1": None, "2": NOW - 7}
            _forget(agent)
        assert calls.count(hung) == 1 and calls.count(fine) == 2
    finally:
        release.set()


def test_what_a_heartbeat_claims_is_bounded_by_what_the_agent_sees(tmp_path: Path) -> None:
    """A job that claims a restore of 1e9 s would never be a victim: its claim is cut to its elapsed
    time (100 s), and it is preempted rather than the job whose checkpoint is 500 s old."""
    liar = _job("1", NOW - 100, heartbeat=_beat(tmp_path, "liar", NOW - 10, restore=1e9, period=1e9))
    honest = _job("2", NOW - 3000, heartbeat=_beat(tmp_path, "honest", NOW - 500, restore=5.0, period=1e5))
    queue = Queue([liar, honest, _job("20", NOW, state="pending", comment="rf-ondemand")], 0)
    (event,) = Agent(queue, AgentConfig(dry_run=True), clock=lambda: NOW).poll()
    seen = {r["id"]: r for r in event["inputs"]["running"]}
    assert (seen["1"]["restart_cost"], seen["1"]["checkpoint_interval"]) == (100.0, 100.0)
    assert event["decision"]["preempt"] == ["1"]
    config = AgentConfig(max_restore=30.0)
    beat = read_checkpoint_heartbeat(liar.heartbeat)
    old = running_job(replace(liar, start=NOW - 7200), NOW, config, beat)
    assert old.restart_cost == 30.0 and old.checkpoint_interval == 7200.0  # the site's maximum
    future = running_job(liar, NOW, config, replace(beat, committed=NOW + 3600))
    assert future.last_checkpoint == NOW  # no checkpoint lies ahead of now
    assert running_job(liar, NOW, config, beat, seen_gap=20.0).checkpoint_interval == 20.0


def test_the_period_is_at_most_the_gap_the_agent_saw_between_commits(tmp_path: Path) -> None:
    clock = [NOW]
    path = _beat(tmp_path, "beat", NOW - 20, period=3000.0)
    queue = Queue([_job("1", NOW - 5000, heartbeat=path), _job("20", NOW, state="pending", comment="rf-ondemand")], 0)
    agent = Agent(queue, AgentConfig(dry_run=True), clock=lambda: clock[0])
    assert agent.poll()[0]["inputs"]["running"][0]["checkpoint_interval"] == 3000.0  # nothing seen yet
    _beat(tmp_path, "beat", NOW + 10, period=3000.0)  # committed 30 s after the one seen before
    clock[0] += 15
    _forget(agent)
    assert agent.poll()[0]["inputs"]["running"][0]["checkpoint_interval"] == 30.0


def test_user_text_reaches_the_log_escaped_and_cut_short(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    forged = "/nowhere\n2026-12-04 agent: released everything\x1b[2J\u202e" + "x" * 5000
    log = tmp_path / "events.jsonl"
    queue = Queue([_job("1", NOW - 100, heartbeat=forged), _job("2\r\nforged", NOW, state="pending",
                                                                comment="rf-ondemand")], 0)  # fmt: skip

    def refuse(job_id: str, signal: str) -> None:
        raise BatchCommandError("scancel: " + "said \x1b]0;owned\x07 " * 1000)

    queue.signal = refuse
    with caplog.at_level("WARNING"):
        events = Agent(queue, AgentConfig(), log_path=log, clock=lambda: NOW).poll()
    assert [e["event"] for e in events] == ["decision", "signal_failed"]
    for text in [*log.read_text().splitlines(), *(r.getMessage() for r in caplog.records)]:
        assert text.isprintable() and len(text) < 3000, text[:300]
    assert events[0]["request"] == "2\\r\\nforged" and len(events[1]["error"]) < 400
    (warning,) = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    assert "\\n2026-12-04 agent" in warning and "\\x1b[2J\\u202e" in warning
    with pytest.raises(ValueError) as caught:
        path = tmp_path / "long.json"
        path.write_text(json.dumps({"format": "resilient-flows-heartbeat/1", "step": "A" * 60_000}))
        read_checkpoint_heartbeat(path)
    assert len(str(caught.value)) < 400


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("1234", "1234"),
        ("a\nb\r\x1b[2J\x00", "a\\nb\\r\\x1b[2J\\x00"),
        ("right\u202eleft\u2028", "right\\u202eleft\\u2028"),
        ("x" * 301, "x" * 300 + "...[301 characters]"),
        ("\x07" * 100, "\\x07" * 75 + "...[100 characters]"),
    ],
)
def test_user_text_is_escaped_and_capped(value: str, shown: str) -> None:
    assert clean(value) == shown


# ------------------------------------------------------------------------------------ across restarts


def _preempted(tmp_path: Path, state: Path) -> tuple[Queue, BatchJob, list[float]]:
    """An agent that signalled and requeued (held) its victim, then "died": nothing of it is left
    but its state file."""
    clock = [NOW]
    request = _job("20", NOW - 5, state="pending", comment="rf-ondemand")
    queue = Queue([_job("10", NOW - 3000, heartbeat=_beat(tmp_path, "fresh", NOW - 20)), request], free=0)
    agent = Agent(queue, AgentConfig(grace=30, interval=1), clock=lambda: clock[0], state_path=state)
    agent.poll()
    clock[0] += 1
    assert [e["event"] for e in agent.poll()] == ["requeue"]
    return queue, request, clock


def test_a_restarted_agent_releases_the_victims_of_requests_that_ran_or_vanished(tmp_path: Path) -> None:
    for fate in ("ran", "vanished"):
        state = tmp_path / f"{fate}.state.json"
        queue, request, _ = _preempted(tmp_path, state)
        assert json.loads(state.read_text())["preempting"]["10"]["requeued"] == NOW + 1
        if fate == "ran":
            queue.list = [replace(request, state="running", start=NOW + 2) if j.id == "20" else j for j in queue.list]
        else:
            queue.list = [j for j in queue.list if j.id != "20"]
        log = tmp_path / f"{fate}.jsonl"
        again = Agent(queue, AgentConfig(grace=30, interval=1), log_path=log, clock=lambda: NOW + 3, state_path=state)
        assert "10" in again.preempting
        assert [e["event"] for e in again.poll()] == ["release"] and queue.done[-1] == ("release", "10")
        assert [json.loads(line)["event"] for line in log.read_text().splitlines()] == ["resumed", "release"]
        assert json.loads(state.read_text())["preempting"] == {}


def test_a_restarted_agent_keeps_holding_the_victim_while_its_request_waits(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    queue, request, clock = _preempted(tmp_path, state)
    again = Agent(queue, AgentConfig(grace=30, interval=1), clock=lambda: clock[0], state_path=state)
    clock[0] += 1
    assert again.poll() == []  # no release, and no second decision for a request already served
    queue.list = [replace(request, state="running", start=clock[0]) if j.id == "20" else j for j in queue.list]
    assert [e["event"] for e in again.poll()] == ["release"]


def test_each_victim_is_recorded_before_its_command_runs(tmp_path: Path) -> None:
    """The agent may die between a command and the next line: what the command started must be on
    disk already. A victim found held that the state says was only signalled was requeued by it."""
    state = tmp_path / "state.json"
    queue = Queue([_job("10", NOW - 3000), _job("20", NOW, state="pending", comment="rf-ondemand")], free=0)
    seen = []
    signal = queue.signal
    queue.signal = lambda job_id, sig: (seen.append(json.loads(state.read_text())), signal(job_id, sig))
    Agent(queue, AgentConfig(), clock=lambda: NOW, state_path=state).poll()
    assert seen[0]["preempting"]["10"] == {"request": "20", "signalled": NOW, "requeued": None}
    queue.requeue("10", hold=True)  # the agent requeued it, then died before it could record so
    queue.list = [j for j in queue.list if j.id != "20"]
    events = Agent(queue, AgentConfig(), clock=lambda: NOW + 5, state_path=state).poll()
    assert [e["event"] for e in events] == ["release"] and queue.done[-1] == ("release", "10")


def test_a_state_file_that_cannot_be_written_stops_the_agent_at_start_and_is_reported_later(
    tmp_path: Path,
) -> None:
    queue = Queue([_job("10", NOW - 3000), _job("20", NOW, state="pending", comment="rf-ondemand")], free=0)
    with pytest.raises(AgentStateError, match="cannot be written"):
        Agent(queue, AgentConfig(), state_path=tmp_path / "gone" / "state.json")
    (tmp_path / "full").mkdir()
    agent = Agent(queue, AgentConfig(), clock=lambda: NOW, state_path=tmp_path / "full" / "state.json")
    shutil.rmtree(tmp_path / "full")  # as a full file system would, later
    events = agent.poll()
    assert [e["event"] for e in events] == ["decision", "state_failed", "state_failed"]
    assert "No such file or directory" in events[1]["error"] and queue.done == [("signal", "10", "USR1")]


def test_a_dry_run_neither_reads_nor_writes_the_state(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text("not json")
    queue = Queue([_job("10", NOW - 3000), _job("20", NOW, state="pending", comment="rf-ondemand")], free=0)
    Agent(queue, AgentConfig(dry_run=True), clock=lambda: NOW, state_path=state).poll()
    assert state.read_text() == "not json"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "Expecting property name"),
        ("[" * 100_000, "nested more than 64 levels deep"),
        (" " * (2 << 20), "larger than its cap of 1 MiB"),
        ('{"format": "other"}', "not a resilient-flows-agent-state/1 file"),
        ('{"format": "resilient-flows-agent-state/1", "scheduler": "memory", "preempting": {}}', "fields"),
        ('{"format": "resilient-flows-agent-state/1", "scheduler": "pbspro", "preempting": {}, "served": {}}',
         "written by an agent for 'pbspro'"),
        ('{"format": "resilient-flows-agent-state/1", "scheduler": "memory", "preempting": {"1; rm -rf /": {}},'
         ' "served": {}}', "preempting key: not a job id"),
        ('{"format": "resilient-flows-agent-state/1", "scheduler": "memory", "served": {},'
         ' "preempting": {"1": {"request": "2", "signalled": 5, "requeued": "soon"}}}', "requeued: not a Unix time"),
        ('{"format": "resilient-flows-agent-state/1", "scheduler": "memory", "served": {"2": NaN}, "preempting": {}}',
         "served.2: not a Unix time"),
    ],
)  # fmt: skip
def test_a_bad_state_file_stops_the_agent_with_the_problem_named(tmp_path: Path, text: str, problem: str) -> None:
    state = tmp_path / "state.json"
    state.write_text(text)
    with pytest.raises(AgentStateError, match=problem):
        Agent(Queue([], 0), AgentConfig(), state_path=state)


def test_the_command_says_what_is_wrong_with_its_state_file_in_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "events.state.json").write_text("{")
    assert cli_main(["cosched", "agent", "--log", str(tmp_path / "events.jsonl"), "--polls", "1"]) == 2
    err = capsys.readouterr().err
    assert "events.state.json" in err and "move it aside" in err
