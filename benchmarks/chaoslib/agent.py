"""``--agent``: the preemption agent's faults, against the tests' fake PBS Pro commands and served
``squeue --json`` output, reported like a chaos run. Separate from the rest: no run, no Parsl.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from chaoslib.config import REPO
from chaoslib.report import Figure, print_report, write_json
from chaoslib.runner import CLI

#: Polls of its restart within which an agent killed between requeue and release must release.
AGENT_RELEASE_POLLS = 2
AGENT_INTERVAL_S = 0.2
#: The agent's heartbeat deadline in this scenario: a poll's heartbeat reads must end within it.
AGENT_DEADLINE_S = 1.0
#: Where a forged marker hides: in a path, glued to another word, in a heartbeat's path.
FORGED_COMMENTS = ("/x/rf-ondemand/y", "rf-ondemandx", "xrf-ondemand", "rf-heartbeat:/lus/rf-ondemand/hb.json")


@contextlib.contextmanager
def fake_pbspro(work: Path) -> Iterator[tuple[Path, Any]]:
    """The tests' fake PBS Pro commands first on ``PATH``, their jobs kept under ``work``; every job
    still alive is killed after. Yields the state directory and the fake's ``engine`` module."""
    sys.path.insert(0, str(REPO / "tests"))
    from fakesched import PBSPRO, engine

    state = work / "sched"
    saved = {name: os.environ.get(name) for name in ("PATH", engine.DIR_ENV, engine.QUEUE_SECONDS_ENV)}
    os.environ["PATH"] = f"{PBSPRO}{os.pathsep}{os.environ['PATH']}"
    os.environ[engine.DIR_ENV] = str(state)
    os.environ.pop(engine.QUEUE_SECONDS_ENV, None)
    try:
        yield state, engine
    finally:
        if state.exists():
            engine.delete_all(state)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def qsub(work: Path, *options: str, queued_s: float = 0.0) -> str:
    """A one-CPU job that runs until deleted; ``queued_s`` keeps it queued that long first."""
    script = work / "forever.pbs"
    script.write_text("#!/bin/bash\nwhile true; do sleep 0.1; done\n")
    env = {**os.environ, "FAKESCHED_QUEUE_SECONDS": str(queued_s)}
    argv = ["qsub", "-l", "select=1:ncpus=1", "-j", "oe", "-o", str(work / "jobs.out"), *options, str(script)]
    return subprocess.run(argv, check=True, capture_output=True, text=True, env=env, timeout=60).stdout.strip()


def pbs_job(batch: Any, job_id: str) -> Any:
    return next((job for job in batch.jobs() if job.id == job_id), None)


def wait_for(what: str, predicate: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def logged_events(path: Path) -> list[str]:
    return [json.loads(line)["event"] for line in path.read_text().splitlines()] if path.exists() else []


def agent_killed(work: Path, state: Path, engine: Any) -> dict[str, float]:
    """The agent (the real command) requeues a victim held, and is SIGKILLed before it releases it;
    the request starts on the freed node; a restarted agent must release the victim."""
    from resilient_flows.cosched._agent import Agent, AgentConfig
    from resilient_flows.cosched._pbspro import PBSProBatch

    batch = PBSProBatch(timeout=30)
    victim = qsub(work, "-N", "victim")
    wait_for("the victim running", lambda: (job := pbs_job(batch, victim)) and job.state == "running")
    request = qsub(work, "-q", "ondemand", "-N", "viz", queued_s=3600)
    log = work / "agent.jsonl"
    command = [str(CLI), "cosched", "agent", "--scheduler", "pbspro", "--partition-ondemand", "ondemand",
               "--interval", f"{AGENT_INTERVAL_S:g}", "--log", str(log)]  # fmt: skip
    with open(work / "agent.out", "ab") as out:
        first = subprocess.Popen(command, stdout=out, stderr=out)
        try:
            wait_for("the agent's requeue", lambda: "requeue" in logged_events(log))
        finally:
            first.kill()
            first.wait()
    held = pbs_job(batch, victim)
    engine.update(state, int(request.split(".")[0]), queue_seconds=0)  # the scheduler starts the request
    wait_for("the request running", lambda: (job := pbs_job(batch, request)) and job.state == "running")
    config = AgentConfig(ondemand_partition="ondemand", interval=AGENT_INTERVAL_S)
    again = Agent(batch, config, log_path=log, state_path=log.with_name(f"{log.stem}.state.json"))
    polls = 0
    while again.preempting and polls < 10 * AGENT_RELEASE_POLLS:
        again.poll()
        polls += 1
    wait_for("the victim running again", lambda: (job := pbs_job(batch, victim)) and job.state == "running", 30)
    subprocess.run(["qdel", victim, request], capture_output=True, timeout=60)
    return {"held_after_kill": float(held is not None and held.held), "polls_to_release": float(polls)}


def agent_heartbeats(work: Path) -> dict[str, float]:
    """Jobs name a FIFO and a 1 GiB (sparse) file as their heartbeats, beside one that is sound: the
    poll's reads end within the deadline, and only the sound one is believed."""
    from resilient_flows.checkpoint._heartbeat import FILENAME, CheckpointHeartbeat
    from resilient_flows.cosched._agent import Agent, AgentConfig
    from resilient_flows.cosched._pbspro import HEARTBEAT_VARIABLE, PBSProBatch

    paths = {name: work / name / FILENAME for name in ("sound", "fifo", "huge")}
    for path in paths.values():
        path.parent.mkdir()
    os.mkfifo(paths["fifo"])
    with paths["huge"].open("wb") as f:
        f.truncate(1 << 30)
    ids = {
        name: qsub(work, "-N", name, "-v", f"{HEARTBEAT_VARIABLE}=rf-heartbeat:{path}") for name, path in paths.items()
    }
    ids["request"] = qsub(work, "-q", "ondemand", "-N", "viz", queued_s=3600)
    batch = PBSProBatch(timeout=30)
    mine = {ids[name] for name in paths}
    wait_for("the jobs running", lambda: sum(job.state == "running" and job.id in mine for job in batch.jobs()) == 3)
    now = time.time()  # a checkpoint of the job's own run: after its start
    sound = CheckpointHeartbeat(step=1, committed=now, period=60.0, restore=5.0, written=now, host="n", pid=1)
    paths["sound"].write_text(json.dumps(asdict(sound)))
    config = AgentConfig(ondemand_partition="ondemand", dry_run=True, heartbeat_deadline=AGENT_DEADLINE_S)
    agent = Agent(batch, config)
    took: list[float] = []
    read = agent.reader.read

    def timed(wanted: Any) -> Any:
        began = time.monotonic()
        try:
            return read(wanted)
        finally:
            took.append(time.monotonic() - began)

    agent.reader.read = timed  # type: ignore[method-assign]
    decision = next(e for e in agent.poll() if e["event"] == "decision")
    seen = {r["id"]: r["last_checkpoint"] for r in decision["inputs"]["running"]}
    subprocess.run(["qdel", *ids.values()], capture_output=True, timeout=60)
    return {
        "heartbeat_read_s": took[0],
        "untrusted_believed": float(sum(seen[ids[name]] is not None for name in ("fifo", "huge"))),
        "sound_believed": float(seen[ids["sound"]] == sound.committed),
    }


def agent_forged(work: Path) -> dict[str, float]:
    """Markers forged where users write: in Slurm comments (a path, another word) and in a PBS
    job's environment. None may make a request, none may shield a running job."""
    from resilient_flows.cosched._agent import Agent, AgentConfig
    from resilient_flows.cosched._pbspro import HEARTBEAT_VARIABLE, PBSProBatch
    from resilient_flows.cosched._slurm import SlurmBatch

    now = int(time.time())

    def record(job_id: int, state: str, comment: str, partition: str = "batch") -> dict[str, Any]:
        return {"job_id": job_id, "name": f"j{job_id}", "user_name": "ann", "user_id": os.getuid(),
                "partition": partition, "job_state": state, "node_count": 1, "cpus": 1, "submit_time": now - 60,
                "start_time": now - 60 if state == "RUNNING" else 0, "time_limit": None, "comment": comment,
                "priority": 1, "state_reason": "None"}  # fmt: skip

    forged = [record(10 + i, "PENDING", comment) for i, comment in enumerate(FORGED_COMMENTS)]
    shields = [record(20 + i, "RUNNING", comment) for i, comment in enumerate(FORGED_COMMENTS)]
    genuine = [record(30, "PENDING", "rf-ondemand", partition="interactive")]
    squeue = json.dumps({"jobs": forged + shields + genuine})
    sinfo = json.dumps({"nodes": []})
    slurm = SlurmBatch(run=lambda argv: squeue if argv[0] == "squeue" else sinfo)
    requests: set[str] = set()
    shielded = 0
    for config in (AgentConfig(dry_run=True), AgentConfig(dry_run=True, ondemand_partition="interactive")):
        for event in Agent(slurm, config).poll():
            if event["event"] == "decision":
                requests.add(event["request"])
                shielded += len({str(r["job_id"]) for r in shields} - {r["id"] for r in event["inputs"]["running"]})
    batch = PBSProBatch(timeout=30)
    running = qsub(work, "-N", "steady")
    environment = f"{HEARTBEAT_VARIABLE}=rf-ondemand,NOTE=rf-ondemand"
    qsub(work, "-N", "forger", "-v", environment, queued_s=3600)
    wait_for("the PBS job running", lambda: (job := pbs_job(batch, running)) and job.state == "running")
    requests |= {e["request"] for e in Agent(batch, AgentConfig(dry_run=True)).poll() if e["event"] == "decision"}
    return {
        "forged_requests": float(len(requests - {"30"})),
        "forged_shields": float(shielded),
        "genuine_served": float("30" in requests),
    }


def agent_chaos(work: Path) -> list[Figure]:
    """The preemption agent's faults, against the tests' fake PBS Pro (and served Slurm output)."""
    for name in ("killed", "heartbeats"):
        (work / name).mkdir(parents=True)
    with fake_pbspro(work) as (state, engine):
        killed = agent_killed(work / "killed", state, engine)
        beats = agent_heartbeats(work / "heartbeats")
        forged = agent_forged(work)
    polls, read_s = killed["polls_to_release"], beats["heartbeat_read_s"]
    return [
        Figure("agent_held_after_kill", "victim held when the agent was killed", killed["held_after_kill"], "",
               "= 1", killed["held_after_kill"] == 1),
        Figure("agent_polls_to_release", "polls of the restarted agent until it released the victim", polls,
               "polls", f"<= {AGENT_RELEASE_POLLS}", polls <= AGENT_RELEASE_POLLS),
        Figure("agent_heartbeat_read_s", "heartbeat reads of a poll with a FIFO and a 1 GiB heartbeat", read_s, "s",
               f"<= {AGENT_DEADLINE_S:g} (deadline)", read_s <= AGENT_DEADLINE_S),
        Figure("agent_untrusted_believed", "FIFO and oversized heartbeats believed", beats["untrusted_believed"],
               "of 2", "= 0", beats["untrusted_believed"] == 0),
        Figure("agent_sound_believed", "sound heartbeat believed", beats["sound_believed"], "of 1", "= 1",
               beats["sound_believed"] == 1),
        Figure("agent_forged_requests", "forged markers taken for requests", forged["forged_requests"], "jobs", "= 0",
               forged["forged_requests"] == 0),
        Figure("agent_forged_shields", "running jobs a forged marker shielded", forged["forged_shields"], "jobs",
               "= 0", forged["forged_shields"] == 0),
        Figure("agent_genuine_served", "genuine request decided", forged["genuine_served"], "of 1", "= 1",
               forged["genuine_served"] == 1),
    ]  # fmt: skip


def agent_main(console: Console, work: Path, args: argparse.Namespace) -> int:
    """``--agent``: run the agent's faults, report them like a chaos run."""
    try:
        found = agent_chaos(work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_report(console, "Chaos: the preemption agent (fake PBS Pro, served Slurm output)", found, [], [])
    verdict = all(f.ok is not False for f in found)
    console.print("PASS" if verdict else "FAIL")
    if args.json:
        write_json(args.json, {"mode": "agent", "cpus": os.cpu_count()}, found, [], [])
    return 0 if verdict else 1
