"""One run supervised from start to leftovers: the runner started and resumed, the faults injected,
a hard timeout, whatever lives on counted and killed, what it wrote read back. The chaos run and
the fault-free reference both go through it.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from chaoslib.config import (
    BENCH_DIR,
    GATE_ENV,
    LOOK_S,
    Config,
    SiteFacts,
    gate_of,
    harness_site,
    site_kinds,
    workflow_yaml,
)
from chaoslib.faults import Chaos
from chaoslib.procs import Proc, Watcher, read_proc, send
from chaoslib.rundata import RunData, parse_lines, read_run
from chaoslib.runner import Runner
from chaoslib.schedule import Fault, plan_bursts
from chaoslib.slurm import SLURM_ACTIVE, slurm_jobs

#: How long the run's processes have to go once the last runner exited, before they count as left over.
LEFTOVER_GRACE_S = 10.0
#: Seconds between two looks at the states of a ``--walltime`` run's Slurm jobs.
JOBS_LOOK_S = 3.0


@dataclass
class Execution:
    """One supervised run: its data and what was measured from outside."""

    data: RunData
    wall_s: float
    runner_cpu_s: float
    runner_peak_rss_mib: float
    runner_starts: int
    runner_exits: list[str]  # runners that exited on their own with members unfinished
    members_cpu_s: float
    timed_out: bool
    returncode: int | None
    leftovers: Counter[str]
    leftover_details: list[str]
    log: Path
    slurm_states: dict[int, str] = field(default_factory=dict)  # job -> last state seen (``--walltime``)
    hang: str = ""  # a timed-out run as it stood: see :func:`hang_snapshot`


class JobWatch(threading.Thread):
    """The last state seen of each of a run's Slurm jobs, every :data:`JOBS_LOOK_S`: the controller
    forgets finished jobs after ``MinJobAge``, and a block that hit its walltime ends ``TIMEOUT``."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(name="slurm jobs", daemon=True)
        self.run_dir = run_dir
        self.states: dict[int, str] = {}
        self._done = threading.Event()

    def run(self) -> None:
        while True:
            self.look()
            if self._done.wait(JOBS_LOOK_S):
                return

    def look(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.states.update(slurm_jobs(self.run_dir))

    def finish(self) -> dict[int, str]:
        self._done.set()
        self.join(timeout=60)
        self.look()
        return dict(self.states)


def execute(
    workflow: Path,
    run_dir: Path,
    site: str,
    log: Path,
    timeout_s: float,
    chaos: Callable[[Runner, Watcher, Path | None], Chaos] | None = None,
    keep: Path | None = None,
    nodes: Path | None = None,
    gate: Path | None = None,
    site_file: Path | None = None,
    watch_jobs: bool = False,
) -> Execution:
    """Run ``workflow`` into ``run_dir`` (with ``chaos`` injected), wait for it up to ``timeout_s``,
    count and kill what it left, and read what it wrote. ``keep``: copy the run directory there;
    ``nodes``: where the emulated nodes of ``local-nodes`` keep their node-local directories;
    ``gate``: where the members of a held chaos run wait (see :func:`paced`), removed first;
    ``site_file``: the site's file to run on instead of ``site``'s own; ``watch_jobs``: record the
    states of the run's Slurm jobs (:class:`JobWatch`)."""
    if gate is not None:
        for spanning in (False, True):
            gate_of(gate, spanning).unlink(missing_ok=True)  # an earlier run's, in the same directory
    env = {
        **os.environ,
        "COLUMNS": "200",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")])),
        **({"RESILIENT_FLOWS_NODES": str(nodes)} if nodes is not None else {}),
        **({GATE_ENV: str(gate)} if gate is not None else {}),
    }
    runner = Runner(workflow, run_dir, str(site_file or site), log, env)
    watcher = Watcher(run_dir, runner)
    injector = None
    jobs = JobWatch(run_dir) if watch_jobs else None
    states: dict[int, str] = {}
    started = time.monotonic()
    timed_out = False
    hang = ""
    try:
        runner.start()
        if jobs is not None:
            jobs.start()
        if chaos is not None:
            injector = chaos(runner, watcher, gate)
            injector.start()
        while not runner.poll():
            watcher.look()
            if time.monotonic() - started > timeout_s:
                timed_out = True
                hang = hang_snapshot(run_dir, runner, watcher, injector)
                break
            time.sleep(LOOK_S)
        wall_s = time.monotonic() - started
    finally:
        if injector is not None:
            injector.finish()
        runner.stop()
        if jobs is not None:
            states = jobs.finish()
        leftovers, details = reap(run_dir, watcher, site != "local")
    data = read_run(run_dir)
    if keep is not None:
        shutil.copytree(run_dir, keep, ignore=shutil.ignore_patterns("ballast-*"), dirs_exist_ok=True)
    return Execution(
        data,
        wall_s,
        runner.cpu_s,
        runner.peak_rss_kib / 1024,
        len(runner.pids),
        runner.exits,
        watcher.members_cpu_s(),
        timed_out,
        runner.returncode,
        leftovers,
        details,
        log,
        states,
        hang,
    )


def hang_snapshot(run_dir: Path, runner: Runner, watcher: Watcher, injector: Chaos | None) -> str:
    """What a run that outlived its timeout was doing, for the report of a hang: the faults still
    waiting for a target (a held run's members wait for them), the runner's state, the run's
    processes, every job Slurm holds (another's can keep the node) and the run's last events."""
    lines = []
    if injector is not None:
        waiting = [f"{f.kind} (burst {f.burst})" for f in injector.faults if f.time == 0.0 and f.skipped is None]
        lines.append(f"faults waiting for a target: {', '.join(waiting) or 'none'}")
    runner_proc = None if runner.pid is None else read_proc(runner.pid)
    lines.append(f"runner: {'gone' if runner_proc is None else f'pid {runner_proc.pid}, state {runner_proc.state}'}")
    procs = watcher.look()
    for pool in procs.pools:
        children = procs.spawned[pool.pid]
        states = " ".join(f"{c.pid}:{c.state}" for c in children)
        lines.append(f"pool {pool.pid} ({pool.state}): {len(children)} processes {states}")
    lines.append(f"interchanges: {' '.join(f'{i.pid}:{i.state}' for i in procs.interchanges) or 'none'}")
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        queue = subprocess.run(
            ["squeue", "-h", "-t", "all", "-o", "%i %T %r %j %o"], capture_output=True, text=True, timeout=30
        )
        lines += ["squeue:", *(line[:160] for line in queue.stdout.splitlines())]
    with contextlib.suppress(OSError):
        events = (run_dir / "events.jsonl").read_text().splitlines()[-15:]
        lines += ["last events:", *(line[:200] for line in events)]
    return "\n".join(lines)


def recorded_interchanges(run_dir: Path) -> list[tuple[str, Proc]]:
    """The interchanges ``blocks.jsonl`` records, as processes to look for."""
    found = []
    lines, _ = parse_lines(run_dir / "blocks.jsonl")
    for record in lines:
        if "interchange" in record and record.get("started") is not None:
            found.append(("interchange", Proc(int(record["interchange"]), 0, int(record["started"]), "", 0.0, "")))
    return found


def reap(run_dir: Path, watcher: Watcher, slurm: bool) -> tuple[Counter[str], list[str]]:
    """Count what of the run lives on after it ended (after a grace for its own cleanup), then
    kill it: pools, their processes, interchanges, block scripts, active Slurm jobs. The counts by
    kind, and each leftover in words."""
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    living = watcher.living(recorded_interchanges(run_dir))
    while living and time.monotonic() < deadline:
        time.sleep(LOOK_S)
        living = watcher.living(recorded_interchanges(run_dir))
    left = Counter(role for role, _ in living)
    details = [f"{role} {proc.pid}: {proc.cmdline[:150]}" for role, proc in living]
    for _, proc in living:
        send(proc, signal.SIGCONT)  # a stopped process cannot even die until it runs
        send(proc, signal.SIGKILL)
    if slurm:
        while True:
            active = [job for job, state in slurm_jobs(run_dir).items() if state in SLURM_ACTIVE]
            if not active or time.monotonic() > deadline:
                break
            time.sleep(LOOK_S)
        left["Slurm job"] = len(active)
        details += [f"Slurm job {job}" for job in active]
        if active:
            subprocess.run(["scancel", *map(str, active)], capture_output=True, timeout=30)
    return left, details


@contextlib.contextmanager
def shared_tmpfs(path: Path, size_mib: int, console: Console) -> Iterator[Path | None]:
    """A tmpfs of ``size_mib`` at ``path`` (root only), unmounted afterwards; None when it cannot be mounted."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        reason = "not root" if os.geteuid() != 0 else done.stderr.strip()
        console.print(f"[yellow]storage-full skipped: cannot mount a tmpfs for the shared tier ({reason})[/]")
        yield None
        return
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(path)], capture_output=True)


def run_chaos(
    config: Config,
    work: Path,
    site: str,
    span_s: float,
    seed: int,
    shared_mib: int,
    timeout_s: float,
    console: Console,
    keep: bool = False,
    kinds: tuple[str, ...] | None = None,
) -> tuple[Execution, list[Fault]]:
    """The workflow under the chaos schedule of ``seed``, its bursts spread over ``span_s`` seconds
    after the first checkpoint; the run directory on a tmpfs of ``shared_mib`` when root.
    ``kinds``: the faults to strike (default: every kind of the site, :func:`site_kinds`); with
    :attr:`Config.walltime_s`, on a copy of the site whose blocks have that walltime (and on a copy
    in any case: :func:`harness_site`)."""
    facts = SiteFacts.of(site)
    kinds = site_kinds(site, config) if kinds is None else kinds
    work.mkdir(parents=True, exist_ok=True)
    site_file = harness_site(site, config.walltime_s, work)
    workflow = work / "chaos.yaml"
    workflow.write_text(workflow_yaml(config, site, site_file))
    with shared_tmpfs(work / "shared", shared_mib, console) as shared:
        if shared is None:
            kinds = tuple(k for k in kinds if k != "storage-full")
        bursts = plan_bursts(kinds, config, random.Random(seed))
        run_dir = (shared or work) / "run"

        gate = work / "chaos.gate" if config.hold else None

        cluster = nodes_dir = None
        if site == "local-slurm-nodes":  # the nodes' scratch: DIR/nodes/NODE/local of the cluster in DIR
            nodes_dir = Path(os.environ["RESILIENT_FLOWS_TEST_NODES_DIR"])
            cluster = nodes_dir.parent

        def chaos(runner: Runner, watcher: Watcher, gate: Path | None) -> Chaos:
            nodes = work / "nodes" if site == "local-nodes" else nodes_dir
            return Chaos(bursts, span_s, run_dir, shared, runner, watcher, facts, config, seed, nodes, gate, cluster)

        execution = execute(
            workflow,
            run_dir,
            site,
            work / "chaos.log",
            timeout_s,
            chaos,
            work / "chaos-run" if keep else None,
            nodes=work / "nodes",
            gate=gate,
            site_file=site_file,
            watch_jobs=config.walltime_s is not None,
        )
    return execution, [fault for burst in bursts for fault in burst]


def run_reference(config: Config, work: Path, site: str, timeout_s: float) -> Execution:
    """The same workflow without faults, on disk."""
    work.mkdir(parents=True, exist_ok=True)
    workflow = work / "reference.yaml"
    workflow.write_text(workflow_yaml(config, site))
    nodes = work / "nodes-reference"
    return execute(workflow, work / "reference", site, work / "reference.log", timeout_s, nodes=nodes)
