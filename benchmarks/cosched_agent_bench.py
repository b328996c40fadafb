"""The preemption agent's overhead: one poll (read the queue, read every heartbeat, decide) at scale.

A machine with ``--jobs`` running batch jobs (1,000 by default) and a few pending on-demand
requests is served to :class:`~resilient_flows.cosched._slurm.SlurmBatch` as the ``squeue --json``
and ``sinfo --json`` text a Slurm 22.05 controller prints (each job record is a real one,
``data/squeue_job_22.05.json``, varied). 70 % of the jobs publish a heartbeat file, as our
Checkpointer writes it. The agent runs with ``--dry-run``, so a poll is all its own work: parsing,
reading heartbeats and :func:`decide` for each request.

Side by side in one run: the exact policy ``dp`` against ``youngest`` (the victim Slurm's own
preemption would pick: no knapsack, the same parsing and heartbeats), and the parse alone. The
target: a ``dp`` poll under 100 ms (median).

With ``--cluster`` (a Slurm cluster reachable through ``SLURM_CONF``, such as ``.ci/slurm-up``'s,
whose one node has two CPUs: CPUs stand in for nodes) it also runs the real comparison, once per
policy on the same arrivals: two batch jobs of :mod:`resilient_flows.examples.preemptible` hold
both CPUs, "fresh" (the older, checkpointing every step) and "stale" (started ``--age`` seconds
later, checkpointed once); an on-demand job arrives; the agent (``dp``, then ``youngest``)
preempts. The jobs run with ``--no-signal-checkpoint``, as jobs whose state cannot be written
within the grace time: the victim loses the steps since its newest checkpoint, and redoes them
after its requeue. Reported per policy: the victim, the work it lost (steps redone x step time,
measured from its own log) against what the policy's model expected, and the on-demand job's
latency from its submission to its start. Then ``dp`` twice more with a batch job of ``--waiting``
seconds pending too, ranked above the request (submitted before it): the agent puts the request
first (its default), then not (``--no-prioritize``), when the freed CPU goes to that batch job.

``python benchmarks/cosched_agent_bench.py [--quick | --full] [--cluster] [--json PATH]``:
``--quick`` 1,000 jobs, 15 polls; default 1,000 and 10,000 jobs, 31 polls; ``--full`` adds
50,000 jobs.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np
from harness import failed, median_time, options, write_json
from report import judge, print_checks, print_figures

from resilient_flows.checkpoint._heartbeat import FILENAME, CheckpointHeartbeat
from resilient_flows.cosched._agent import Agent, AgentConfig
from resilient_flows.cosched._slurm import SlurmBatch, parse_squeue_json

console = harness.console()
TEMPLATE = Path(__file__).parent / "data" / "squeue_job_22.05.json"
TARGET_MS = 100.0
REQUESTS = 3

#: The poll's target, and what the cluster runs compare (for information).
RATIOS = [
    ("dp_target", "dp poll at 1,000 jobs / 100 ms", "dp_1000_ms", "<=", "target_ms", 1.0),
    ("dp_vs_youngest", "dp poll / youngest poll, 1,000 jobs", "dp_1000_ms", "<=", "youngest_1000_ms", None),
    ("parse_share", "parse / dp poll, 1,000 jobs", "parse_1000_ms", "<=", "dp_1000_ms", None),
    ("cluster_lost", "cluster: work lost, dp / youngest", "cluster_dp_lost_s", "<=", "cluster_youngest_lost_s", None),
    (
        "cluster_prioritized",
        "cluster: latency behind a batch job ranked higher, put first / not",
        "cluster_prioritized_latency_s",
        "<=",
        "cluster_unprioritized_latency_s",
        None,
    ),
    (
        "cluster_latency",
        "cluster: on-demand latency, dp / youngest",
        "cluster_dp_latency_s",
        "<=",
        "cluster_youngest_latency_s",
        None,
    ),
]


def machine(jobs: int, directory: Path, seed: int = 0) -> tuple[str, str]:
    """``squeue --json`` and ``sinfo --json`` text of a busy machine: ``jobs`` running, a few requests."""
    rng = np.random.default_rng(seed)
    template = json.loads(TEMPLATE.read_text())
    now = time.time()
    records = []
    for i in range(jobs):
        r = copy.deepcopy(template)
        start = now - float(rng.uniform(60, 12 * 3600))
        r.update(
            job_id=100_000 + i,
            name=f"train-{i}",
            user_name=f"user{i % 40}",
            user_id=os.getuid(),  # the owner of the heartbeats written here, or the agent believes none
            node_count=int(rng.choice([1, 2, 4, 8, 16, 32, 64, 128])),
            start_time=int(start),
            submit_time=int(start - rng.uniform(0, 3600)),
            time_limit=int(rng.choice([60, 360, 720, 1440])),
            job_state="RUNNING",
            comment="",
        )
        r["cpus"] = 64 * r["node_count"]
        if rng.random() < 0.7:
            path = directory / f"job{i}" / FILENAME
            path.parent.mkdir()
            committed = now - float(rng.uniform(0, min(3600, now - start)))
            beat = CheckpointHeartbeat(step=i, committed=committed, period=float(rng.uniform(300, 3600)), restore=30.0,
                             written=committed, host="n", pid=1)  # fmt: skip
            path.write_text(json.dumps(beat.__dict__))
            r["comment"] = f"rf-heartbeat:{path}"
        records.append(r)
    for k in range(REQUESTS):
        r = copy.deepcopy(template)
        r.update(job_id=900_000 + k, name=f"analytics-{k}", job_state="PENDING", node_count=int(16 << k),
                 cpus=64 * (16 << k), start_time=0, submit_time=int(now - 10 + k), comment="rf-ondemand",
                 state_reason="Resources")  # fmt: skip
        records.append(r)
    squeue = json.dumps({"meta": {"Slurm": {"release": "22.05.8"}}, "errors": [], "jobs": records}, indent=2)
    sinfo = json.dumps({"nodes": [{"name": f"n{i}", "state": "idle", "state_flags": [], "idle_cpus": 64}
                                  for i in range(8)]})  # fmt: skip
    return squeue, sinfo


def timed_polls(squeue: str, sinfo: str, policy: str, polls: int) -> tuple[float, int]:
    """Median milliseconds of a poll, and how many decisions a poll made."""
    batch = SlurmBatch(run=lambda argv: squeue if argv[0] == "squeue" else sinfo)
    agent = Agent(batch, AgentConfig(policy=policy, dry_run=True, max_delay=1800))
    times, decisions = [], 0
    for _ in range(polls):
        agent.served.clear()  # every request is decided again
        agent.preempting.clear()
        began = time.perf_counter()
        events = agent.poll()
        times.append(1000 * (time.perf_counter() - began))
        decisions = sum(e["event"] == "decision" for e in events)
    return statistics.median(times), decisions


def parse_ms(squeue: str, polls: int) -> float:
    return 1000 * median_time(lambda: parse_squeue_json(squeue), polls)


STEP_S = 0.1


def cluster_run(
    policy: str, directory: Path, age_s: float, *, waiting_s: float = 0.0, prioritize: bool = True
) -> dict[str, float | str]:
    """One real preemption on the Slurm cluster; what it cost. With ``waiting_s``, a batch job of
    that length waits too, ranked above the on-demand job (submitted before it)."""
    import subprocess

    from resilient_flows.checkpoint._heartbeat import read_checkpoint_heartbeat

    def sbatch(*args: str) -> str:
        out = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, check=True, timeout=30)
        return out.stdout.strip().split(";")[0]

    def member(name: str, every: int) -> str:
        (directory / name).mkdir(parents=True)
        command = (
            f"exec {sys.executable} -m resilient_flows.examples.preemptible {directory / name} --steps 400 "
            f"--every {every} --step-s {STEP_S} --no-signal-checkpoint"
        )
        return sbatch(
            "-n1", "--requeue", "-J", f"rf-bench-{name}", "-o", str(directory / name / "out"), "--wrap", command
        )

    batch = SlurmBatch()

    def until(what: str, predicate, timeout: float = 120.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}")

    ids = {"fresh": member("fresh", 1)}
    try:
        beats = {name: directory / name / "shared" / FILENAME for name in ("fresh", "stale")}
        # the stale job starts seconds later (Slurm's start times are whole seconds): the younger
        until("fresh checkpointing", beats["fresh"].exists)
        ids["stale"] = member("stale", 100_000)
        until("heartbeats", lambda: all(b.exists() for b in beats.values()))
        until("comments", lambda: all(j.comment for j in batch.jobs() if j.id in ids.values()))
        if waiting_s:
            wrap = f"sleep {waiting_s:g}"
            ids["waiting"] = sbatch("-n1", "-J", "rf-bench-waiting", "-o", "/dev/null", "--wrap", wrap)
        time.sleep(age_s)
        submitted = time.time()
        ids["ondemand"] = sbatch(
            "-n1", "-J", "rf-bench-ondemand", "--comment=rf-ondemand", "-o", "/dev/null", "--wrap", "sleep 5"
        )
        agent = Agent(batch, AgentConfig(policy=policy, unit="cpus", interval=0.5, grace=20, prioritize=prioritize))
        decision = until("a decision", lambda: [e for e in agent.poll() if e["event"] == "decision"])[0]
        victim = next(name for name, job_id in ids.items() if [job_id] == decision["decision"]["preempt"])
        expected = next(r for r in decision["inputs"]["running"] if r["id"] == ids[victim])

        def started() -> float | None:
            agent.poll()
            job = next((j for j in batch.jobs() if j.id == ids["ondemand"]), None)
            return job.start if job is not None and job.state == "running" else None

        began = until("the on-demand job running", started, timeout=120 + waiting_s)
        until("the victim released", lambda: (agent.poll(), not agent.preempting)[1])
        until("the victim finished", lambda: (directory / victim / "final.npy").exists(), timeout=180)
        stopped = int((directory / victim / "stops").read_text().split()[0])
        resumed = int((directory / victim / "starts").read_text().splitlines()[1].split()[0])
        return {
            "victim": victim,
            "lost_s": (stopped - resumed) * STEP_S,
            "expected_lost_s": decision["t"] - expected["last_checkpoint"],
            "latency_s": began - submitted,
            "heartbeat_age_s": decision["t"] - read_checkpoint_heartbeat(beats[victim]).committed,
        }
    finally:
        subprocess.run(["scancel", *ids.values()], capture_output=True, check=False)


def main(argv: list[str] | None = None) -> int:
    parser, _ = options(__doc__, quick="1,000 jobs, 15 polls", full="also 50,000 jobs")
    parser.add_argument("--json", type=Path, help="write every figure printed, with units, to this file")
    parser.add_argument("--cluster", action="store_true", help="also preempt for real on the Slurm cluster")
    parser.add_argument("--age", type=float, default=8.0, help="--cluster: seconds the stale job's checkpoint ages")
    parser.add_argument(
        "--waiting", type=float, default=10.0, help="--cluster: seconds of the batch job ranked above the request"
    )
    args = parser.parse_args(argv)
    scales = [1000] if args.quick else [1000, 10_000, 50_000] if args.full else [1000, 10_000]
    polls = 15 if args.quick else 31
    figures: dict[str, float] = {}
    labels: dict[str, tuple[str, str, str]] = {}
    for jobs in scales:
        with tempfile.TemporaryDirectory(prefix="agent-bench-") as tmp:
            squeue, sinfo = machine(jobs, Path(tmp))
            n = polls if jobs <= 10_000 else 5
            for policy in ("dp", "youngest"):
                ms, decisions = timed_polls(squeue, sinfo, policy, n)
                figures[f"{policy}_{jobs}_ms"] = ms
                labels[f"{policy}_{jobs}_ms"] = (f"{jobs} jobs", "ms", f"poll with {policy} ({decisions} decisions)")
            figures[f"parse_{jobs}_ms"] = parse_ms(squeue, n)
            labels[f"parse_{jobs}_ms"] = (f"{jobs} jobs", "ms", f"squeue --json parse ({len(squeue) >> 10} KiB)")
    if args.cluster:
        for policy in ("dp", "youngest"):
            with tempfile.TemporaryDirectory(prefix="agent-cluster-", dir=Path.cwd()) as tmp:
                run = cluster_run(policy, Path(tmp), args.age)
            console.print(f"cluster, {policy}: preempted the {run['victim']} job")
            for key, label in (
                ("lost_s", "work lost by the victim (measured)"),
                ("expected_lost_s", "work the policy expected it to lose"),
                ("latency_s", "on-demand latency, submission to start"),
            ):
                figures[f"cluster_{policy}_{key}"] = float(run[key])
                labels[f"cluster_{policy}_{key}"] = (f"cluster, {policy} ({run['victim']})", "s", label)
        for name, prioritize in (("prioritized", True), ("unprioritized", False)):
            with tempfile.TemporaryDirectory(prefix="agent-cluster-", dir=Path.cwd()) as tmp:
                run = cluster_run("dp", Path(tmp), args.age, waiting_s=args.waiting, prioritize=prioritize)
            section = f"cluster, dp, a {args.waiting:g} s batch job ranked above the request"
            figures[f"cluster_{name}_latency_s"] = float(run["latency_s"])
            labels[f"cluster_{name}_latency_s"] = (
                section,
                "s",
                f"on-demand latency, {'request put first' if prioritize else '--no-prioritize'}",
            )
    figures["target_ms"] = TARGET_MS
    labels["target_ms"] = ("target", "ms", "a dp poll at 1,000 jobs")
    checks = judge(figures, RATIOS)
    print_figures(console, figures, labels)
    print_checks(console, checks)
    if args.json:
        units = {key: unit for key, (_, unit, _) in labels.items()}
        write_json(args.json, {"figures": figures, "units": units, "checks": checks})
    return int(failed(checks))


if __name__ == "__main__":
    sys.exit(main())
