"""Goodput: the time one fault costs a training member, split into where it goes, per kind of fault.

A member of fixed pace (``goodput_member:paced``: a tiny model, ``step_s`` of sleep per step, a checkpoint
every ``interval`` steps, so that the figures are about recovery and not the interval) runs
through the real ``resilient-flows`` command, once without faults and once per kind of fault,
struck from outside every ``period`` seconds (15 s) while it trains. A fault strikes only once the
member trained 2 s again after the previous one (a recovery slower than the period is not struck
before it made progress, which would rightly cost a retry) and not in its last few seconds. The
kinds (local site; chaos.py's injectors where it has one):

``member-kill``   SIGKILL of the process that runs the member's training (its heartbeat's pid:
                  for a Python member, the Parsl worker that runs ``run_member``);
``worker-kill``   SIGKILL of a busy worker of the run's pools, found through ``/proc`` as
                  chaos.py finds it (for a Python member, the same process as ``member-kill``);
``pool-kill``     SIGKILL of the worker pool (``process_worker_pool.py``);
``manager-kill``  SIGKILL of the pool's multiprocessing manager process;
``preempt``       the member asked to stop through its control file (the runner's preempt path),
                  then requeued by the retry handler;
``node-loss``     ``--cluster``: on the emulated 3-node Slurm cluster (``.ci/slurm-up --nodes 3``),
                  where the member spans two nodes (DDP, tiers [local, peer, shared]), the node
                  of its rank 1 crashes (``.ci/slurm-node down``: every process there SIGKILLed,
                  its node-local scratch gone) once its attempt committed two checkpoints; it
                  boots again after the run or 45 s. ``--spare-nodes 1``: the block holds a
                  third node, on which the member restarts with its survivor, inside the block.

The **cost of one fault** is (the faulted member's wall time - the fault-free member's) / faults,
a member's wall time counted from its first ``started`` event to its ``finished`` one (the
runner's own start and stop are no recovery). It is split (:mod:`recovery_split`) into
detection (fault -> the runner's ``failed``/``lost`` event), restart (-> the next attempt's
``started``), restore (-> its ``resumed``: training again) and redone steps (steps computed twice
x the fault-free step time); what the four leave is ``other`` (the step the fault interrupted,
checkpoint waits). **Goodput at one fault a minute** is 1 - cost / 60 s. Figures are medians
(and p95) over rounds; each round runs the fault-free member and every kind side by side.

``--workload gpt`` measures the flagship GPT member instead (``resilient_flows.examples.gpt:train``,
its shuffled ``DataLoader`` of two workers, AdamW; see :data:`GPT_MODES` for its sizes), its
checkpoints on the memory tier (node memory under ``/dev/shm``, the run's own, which a killed
process leaves behind) and the shared one (``--tiers T,T`` names others: ``--tiers shared`` for
a restore from the shared tier); its redone steps cost its own fault-free step time. Every run
also reports what checkpoints cost the training loop: the median and p95 of each checkpoint's
stall (``stall_ms`` of its ``checkpointed`` events), beside the fault-free run's, and the bytes
its restores read from each tier.

Checks: every faulted member's digest equals the fault-free one's (bit for bit), and no retry
was charged (the ``cost`` of the ``failed`` events is 0); after a node loss, the restore read no
byte from the shared tier (the lost shards come from the buddy's peer copy) and, with a spare
node, no block beyond the first was started. Targets: a member process SIGKILLed every 15 s
costs <= 1.5 s per fault on a quiet machine; with ``--cluster`` and a spare node, a node loss
trains again <= 10 s after the kill. ``--spare-nodes N`` writes ``facts.spare_nodes: N`` into the
run's copy of the site (said so when this commit's sites do not know the option).

``python benchmarks/goodput.py [--quick | --full] [--workload paced|gpt] [--tiers T,T] [--cluster]
[--spare-nodes N] [--kinds K,K] [--rounds N] [--period S] [--json PATH] [--dir DIR]``; ``--quick``
(member-kill only, one round) takes about two minutes on a 2-core machine (each run's runner
start is half of it; with ``--workload gpt`` three and a half at a load average of 5 to 9), the
default (every local kind, two rounds) 15 to 40, as loaded as the machine is; ``--cluster``
(member kill and one node loss per run; ``--quick``: node loss only, one round) about three
minutes a round and half a minute to start the cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import chaos  # noqa: E402
import harness  # noqa: E402
import recovery_split  # noqa: E402
from goodput_report import print_report, rows_of, write_document  # noqa: E402

LOCAL_KINDS = ("member-kill", "worker-kill", "pool-kill", "manager-kill", "preempt")
CLUSTER_KINDS = ("member-kill", "node-loss")
#: chaos.py's injector of each kind that it has (the others are :class:`Periodic`'s own).
CHAOS_KIND = {"worker-kill": "worker-kill", "pool-kill": "pool-kill", "manager-kill": "manager-process-kill"}
#: No fault in a member's last seconds: it would finish before the runner noticed.
MARGIN_S = 4.0
#: How long an attempt trains before the next fault may strike it (see :class:`Periodic`).
SETTLE_S = 2.0
#: How often the injector looks at the member's progress.
LOOK_S = 0.1


@dataclass(frozen=True)
class Mode:
    """A size of a workload: the member measured, how long it trains, and the faults struck."""

    kinds: tuple[str, ...]
    rounds: int
    steps: int
    step_s: float = 0.1  # the paced member's sleep per step; otherwise an estimate, for the injector only
    interval: int = 2  # checkpoint every so many steps
    workload: str = "goodput_member:paced"
    params: dict[str, Any] = field(default_factory=dict)  # the member's params, besides paced's own two
    tiers: tuple[str, ...] = ()  # the checkpoint's tiers (none: the site's default)

    @property
    def paced(self) -> bool:
        """Whether the member's pace is known (:data:`step_s` of sleep per step), not measured."""
        return self.workload == "goodput_member:paced"


MODES = {
    "quick": Mode(kinds=("member-kill",), rounds=1, steps=220),
    "default": Mode(kinds=LOCAL_KINDS, rounds=2, steps=350),
    "full": Mode(kinds=LOCAL_KINDS, rounds=5, steps=950),
}
#: The flagship GPT (``resilient_flows.examples.gpt:train``: its shuffled two-worker ``DataLoader``,
#: AdamW, a state of 12 bytes a parameter) with a memory tier, which a killed process leaves
#: behind: ``--quick`` the tiny size at half its batch; the default the example's own size, batch
#: and steps; ``--full`` the small size (37 MiB of checkpoint tensors). The step times are a quiet
#: core's (tiny at batch 8 takes 0.1 s), which only the injector's margins and the least number
#: of steps that leaves room for a fault read: a loaded machine's slower steps leave more room.
GPT = "resilient_flows.examples.gpt:train"
GPT_TIERS = ("memory", "shared")
GPT_MODES = {
    "quick": Mode(("member-kill",), 1, 250, 0.1, 10, GPT, {"size": "tiny", "batch_size": 8}, GPT_TIERS),
    "default": Mode(("member-kill",), 2, 300, 0.15, 25, GPT, {"size": "tiny", "batch_size": 16}, GPT_TIERS),
    "full": Mode(("member-kill",), 3, 150, 1.0, 10, GPT, {"size": "small", "batch_size": 16}, GPT_TIERS),
}
WORKLOADS = {"paced": MODES, "gpt": GPT_MODES}
#: The tiers ``--tiers`` may name on one node, and where the memory tier's node memory is.
TIERS = ("memory", "local", "shared")
MEMORY_ROOT = "/dev/shm"
#: On the emulated cluster a lost node without a spare costs a new block (about a minute): one
#: loss per run, so that the member trains between losses (struck again 2 s after each restart,
#: it would crawl).
CLUSTER_STEPS = {"quick": 300, "default": 450, "full": 900}
MAX_FAULTS = {"node-loss": 1}


def config_of(mode: Mode, steps: int, spanning: bool) -> chaos.Config:
    """chaos.py's configuration of one paced member: its workflow, and what its injectors read.
    ``spanning``: the member spans two nodes with a peer tier (chaos.py's ``--peer`` member)."""
    params = {"steps": steps, "step_s": mode.step_s} if mode.paced else dict(mode.params)
    return chaos.Config(
        members=1,
        steps=steps,
        interval=mode.interval,
        params=params,
        workload=mode.workload,
        peer_members=int(spanning),
    )


def workflow_of(config: chaos.Config, mode: Mode, site: str, site_file: Path | None) -> str:
    """chaos.py's workflow of ``config``, its checkpoint on the mode's tiers (if it names any)."""
    text = chaos.workflow_yaml(config, site, site_file)
    if not mode.tiers:
        return text
    document = yaml.safe_load(text)
    document["checkpoint"]["tiers"] = list(mode.tiers)
    return yaml.safe_dump(document, sort_keys=False)


# ---------------------------------------------------------------------- the injector


class Periodic(chaos.Chaos):
    """Strikes ``kind`` every ``period_s`` while the member trains, counted from its first step:
    only once the attempt the previous fault started trained :data:`SETTLE_S` (and past two
    checkpoints), so that a recovery slower than the period is not struck again before it made
    progress (which would rightly be charged a retry), and not within :data:`MARGIN_S` of its end."""

    def __init__(self, kind: str, period_s: float, step_s: float, steps: int, interval: int, **parts: Any) -> None:
        super().__init__([], 0.0, seed=0, **parts)
        self.kind, self.period_s = kind, period_s
        self.last_step = steps - 1 - int(MARGIN_S / step_s)
        self.settle_steps = max(2 * interval + 1, int(SETTLE_S / step_s))
        self.metrics: chaos.EventTail | None = None

    def run(self) -> None:
        struck_at, struck_attempt = None, 0
        while not self._done.wait(LOOK_S):
            progress = self._progress()
            if progress is None:
                continue
            attempt, step, trained, first_time = progress
            if step >= self.last_step or len(self.faults) >= MAX_FAULTS.get(self.kind, len(self.faults) + 1):
                return
            origin = first_time if struck_at is None else struck_at
            if attempt <= struck_attempt or trained < self.settle_steps or time.time() - origin < self.period_s:
                continue
            fault = chaos.Fault(self.kind, len(self.faults))
            if self._strike(fault):
                self.faults.append(fault)
                struck_at, struck_attempt = fault.time, attempt

    def _progress(self) -> tuple[int, int, int, float] | None:
        """(attempt, step, lines of that attempt, time of the run's first step) of the member's
        newest line; None before any."""
        if self.metrics is None:
            found = list((self.run_dir / "members").glob("*/metrics.jsonl"))
            if not found:
                return None
            self.metrics = chaos.EventTail(found[0])
        lines = self.metrics.read()
        if not lines:
            return None
        attempt = int(lines[-1]["attempt"])
        trained = sum(int(line["attempt"]) == attempt for line in lines)
        return attempt, int(lines[-1]["step"]), trained, float(lines[0]["time"])

    def _strike(self, fault: chaos.Fault) -> bool:
        if self.kind in CHAOS_KIND:
            return getattr(self, "_" + CHAOS_KIND[self.kind].replace("-", "_"))(fault, self.rng)
        if self.kind == "node-loss":
            return self._rank_one_node_loss(fault) if self.config.peer_members else self._node_loss(fault, self.rng)
        running = chaos.running_members(self.run_dir)
        if not running:
            return False
        name, (attempt, pid) = next(iter(running.items()))
        proc = chaos.read_proc(pid)
        if proc is None:
            return False
        if self.kind == "member-kill":
            self._begin(fault, {name: attempt}, f"member process {pid} of {name}", [proc])
            return chaos.send(proc, signal.SIGKILL)
        from resilient_flows.rundir import request_preemption

        self._begin(fault, {name: attempt}, f"{name} asked to stop (control file)")
        request_preemption(self.run_dir, name, "goodput benchmark")
        return True

    def _rank_one_node_loss(self, fault: chaos.Fault) -> bool:
        """The node of rank 1 of the member spanning nodes, once its attempt committed
        :data:`chaos.PEER_CHECKPOINTS` checkpoints (its buddy holds copies of them): a node that a
        spare can replace inside the block (rank 0's also runs the block's worker pool)."""
        targets = self._spanning(lambda a: a.checkpoints >= chaos.PEER_CHECKPOINTS)
        if not targets or not self._claim((targets[0].hosts[1],)):
            return False
        target, node = targets[0], targets[0].hosts[1]
        hit, doomed = self._struck_on((node,), self.watcher.look(), chaos.slurm_job_of(target.proc.pid))
        self._begin(fault, hit, f"node {node} of {target.member} (rank 1's)", doomed)
        return self._crash(fault, (node,))


# ---------------------------------------------------------------------- one run


@dataclass
class Measured:
    """One run of the member: its wall time, digest, faults and their splits."""

    kind: str
    wall_s: float  # the member's, first started -> finished
    run_wall_s: float  # the runner's, start to exit
    digest: str | None
    faults: int
    splits: list[recovery_split.Split]
    step_s: float
    charged: float  # retries charged: the ``cost`` of every ``failed`` event of the run
    timed_out: bool
    blocks: int = 1  # blocks the run started (``block_started`` events)
    shared_bytes: int = 0  # bytes its restores read from the shared tier (``resumed`` events)
    stalls_ms: list[float] = field(default_factory=list)  # each checkpoint's stall (``checkpointed`` events)
    restored_bytes: dict[str, int] = field(default_factory=dict)  # tier -> bytes its restores read


def restored_bytes(events: list[dict[str, Any]]) -> dict[str, int]:
    """Bytes the run's restores read from each tier (``bytes_from`` of ``resumed`` events, whose
    sources name a tier, or a tier ``on HOST``), by tier."""
    by_tier: dict[str, int] = {}
    for e in events:
        if e["kind"] == "resumed":
            for source, count in (e.get("bytes_from") or {}).items():
                tier = source.split(" on ")[0]
                by_tier[tier] = by_tier.get(tier, 0) + int(count)
    return by_tier


def shared_bytes(events: list[dict[str, Any]]) -> int:
    """Bytes the run's restores read from the shared tier."""
    return restored_bytes(events).get("shared", 0)


def stalls_of(events: list[dict[str, Any]]) -> list[float]:
    """Each checkpoint's stall of the training loop, in ms (``stall_ms`` of ``checkpointed`` events)."""
    return [float(e["stall_ms"]) for e in events if e["kind"] == "checkpointed" and "stall_ms" in e]


def member_wall_s(data: chaos.RunData) -> float:
    """The member's wall time: its first ``started`` to its ``finished`` (0 when it did not finish)."""
    starts = [e["time"] for e in data.events if e["kind"] == "started"]
    ends = [e["time"] for e in data.events if e["kind"] == "finished"]
    return max(ends) - min(starts) if starts and ends else 0.0


def measure(
    kind: str | None, mode: Mode, steps: int, work: Path, site: str, period_s: float, site_file: Path | None
) -> Measured:
    """The member run once (``kind`` None: without faults) in its own directory under ``work``."""
    config = config_of(mode, steps, spanning=site == "local-slurm-nodes")
    label = kind or "fault-free"
    directory = work / label
    directory.mkdir(parents=True)
    workflow = directory / "goodput.yaml"
    workflow.write_text(workflow_of(config, mode, site, site_file))
    facts = chaos.SiteFacts.of(site)
    cluster = nodes_dir = None
    if site == "local-slurm-nodes":
        nodes_dir = Path(os.environ["RESILIENT_FLOWS_TEST_NODES_DIR"])
        cluster = nodes_dir.parent
    injector: Periodic | None = None

    def inject(runner: chaos.Runner, watcher: chaos.Watcher, gate: Path | None) -> chaos.Chaos:
        nonlocal injector
        parts = {"run_dir": directory / "run", "shared": None, "runner": runner, "watcher": watcher}
        parts.update(facts=facts, config=config, nodes=nodes_dir, cluster=cluster)
        injector = Periodic(kind, period_s, mode.step_s, steps, mode.interval, **parts)
        return injector

    timeout_s = 3 * steps * mode.step_s + 300
    execution = chaos.execute(
        workflow,
        directory / "run",
        site,
        directory / "runner.log",
        timeout_s,
        inject if kind is not None else None,
        nodes=directory / "nodes",
        site_file=site_file,
    )
    data = execution.data
    name = data.names[0]
    metrics = data.metrics.get(name, [])
    faults = [] if injector is None else [f for f in injector.faults if f.time > 0]
    step_s = recovery_split.step_time_s(metrics)
    pace = mode.step_s if mode.paced else step_s  # a redone step costs the member's own step time
    splits = [
        recovery_split.split_of(data.events, metrics, name, f.hit[name], f.time, pace) for f in faults if name in f.hit
    ]
    return Measured(
        label,
        member_wall_s(data),
        execution.wall_s,
        data.digests.get(name),
        len(faults),
        splits,
        step_s,
        sum(e["cost"] for e in data.events if e["kind"] == "failed" and isinstance(e.get("cost"), int | float)),
        execution.timed_out,
        sum(e["kind"] == "block_started" for e in data.events),
        shared_bytes(data.events),
        stalls_of(data.events),
        restored_bytes(data.events),
    )


# ---------------------------------------------------------------------- sites


def with_fact(text: str, key: str, value: object) -> str:
    """A site file's ``text`` with ``facts.KEY: VALUE``, in place of the line it had (if any)."""
    if "\nfacts:\n" not in text:
        raise SystemExit(f"the site has no facts: section to put {key} in")
    text = re.sub(rf"(?m)^  {key}:.*\n", "", text)
    return text.replace("\nfacts:\n", f"\nfacts:\n  {key}: {value}\n", 1)


def site_copy(
    site: str, spare_nodes: int | None, directory: Path, memory: Path | None = None
) -> tuple[Path | None, str | None]:
    """The run's copy of ``site`` with ``facts.spare_nodes: N`` and ``facts.memory_scratch: MEMORY``
    (neither asked: None, the site itself), and why spare nodes were left out when this commit's
    sites refuse them (None when they were kept or not asked)."""
    if spare_nodes is None and memory is None:
        return None, None
    from resilient_flows.errors import SiteConfigError
    from resilient_flows.sites import load_site

    text = (chaos.REPO / "site-configs" / f"{site}.yaml").read_text()
    path = directory / f"{site}.yaml"
    if memory is not None:
        text = with_fact(text, "memory_scratch", memory)
    path.write_text(text if spare_nodes is None else with_fact(text, "spare_nodes", spare_nodes))
    try:
        load_site(path)
    except SiteConfigError as exc:
        if spare_nodes is None or "spare_nodes" not in str(exc):
            raise SystemExit(f"the site {site} does not load: {exc}") from None
        path.write_text(text)
        remark = f"spare_nodes: {spare_nodes} is not known on this commit ({exc}); measured without spares"
        if memory is None:
            path.unlink()
            return None, remark
        return path, remark
    return path, None


@contextlib.contextmanager
def cluster_of(out: Any, enabled: bool) -> Iterator[str]:
    """The site to run on: ``local``, or ``local-slurm-nodes`` on a 3-node cluster started here."""
    if not enabled:
        yield "local"
        return
    with chaos.slurm_nodes_cluster(out, 3):
        yield "local-slurm-nodes"


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=chaos.REPO, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=chaos.REPO, capture_output=True
    )
    return done.stdout.strip() + ("+" if dirty.stdout.strip() else "")


# ---------------------------------------------------------------------- main


def run_rounds(args: Any, mode: Mode, site: str, work: Path, out: Any, site_file: Path | None) -> list[list[Measured]]:
    """Each round: the fault-free member, then each kind, in an order rotated round by round."""
    steps = CLUSTER_STEPS[harness.size_of(args)] if site != "local" else mode.steps
    steps = max(steps, int((args.period + MARGIN_S + SETTLE_S + 1.0) / mode.step_s))  # room for one fault at least
    rounds = []
    for r in range(args.rounds or mode.rounds):
        measured = []
        for kind in harness.rotated((None, *mode.kinds), r):
            out.print(f"[dim]round {r + 1}: {kind or 'fault-free'} ({os.getloadavg()[0]:.1f} load)")
            measured.append(measure(kind, mode, steps, work / f"round-{r}", site, args.period, site_file))
        rounds.append(measured)
    return rounds


def mode_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Mode:
    """The size of the workload asked for, with the kinds and tiers the options name (a mistake in
    them: the parser's one line and exit)."""
    size = harness.size_of(args)
    mode = WORKLOADS[args.workload][size]
    known = CLUSTER_KINDS if args.cluster else LOCAL_KINDS
    if args.cluster:
        if not mode.paced:
            parser.error("--cluster measures the paced member only")
        mode = dataclasses.replace(mode, kinds=CLUSTER_KINDS if size != "quick" else ("node-loss",))
    if args.kinds:
        chosen = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
        if unknown := [k for k in chosen if k not in known]:
            parser.error(f"--kinds: {', '.join(unknown)} not among {', '.join(known)}")
        mode = dataclasses.replace(mode, kinds=chosen)
    if args.tiers:
        tiers = tuple(t.strip() for t in args.tiers.split(",") if t.strip())
        if unknown := [t for t in tiers if t not in TIERS]:
            parser.error(f"--tiers: {', '.join(unknown)} not among {', '.join(TIERS)}")
        mode = dataclasses.replace(mode, tiers=tiers)
    if args.spare_nodes is not None and (not args.cluster or args.spare_nodes < 0):
        parser.error("--spare-nodes N needs --cluster and N >= 0")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return mode


def parser_of() -> argparse.ArgumentParser:
    """The benchmark's options."""
    parser, _ = harness.options(
        __doc__, quick="member-kill only, one round: about a minute", full="five rounds of longer members"
    )
    parser.add_argument("--workload", choices=tuple(WORKLOADS), default="paced", help="the member (default paced)")
    parser.add_argument("--cluster", action="store_true", help="on a 3-node Slurm cluster started here, with node loss")
    parser.add_argument("--spare-nodes", type=int, metavar="N", help="with --cluster: spare_nodes: N in the site")
    parser.add_argument("--kinds", metavar="K,K", help="only these kinds of fault")
    parser.add_argument("--tiers", metavar="T,T", help="the checkpoint's tiers (default: the workload's)")
    parser.add_argument("--rounds", type=int, help="rounds (default: the size's)")
    parser.add_argument("--period", type=float, default=15.0, help="seconds between faults (default 15)")
    parser.add_argument("--json", type=Path, help="write the figures, checks and splits")
    parser.add_argument("--dir", type=Path, help="working directory (default: a new temporary one)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = parser_of()
    args = parser.parse_args(argv)
    size = harness.size_of(args)
    mode = mode_of(parser, args)
    out = harness.console()
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    work = Path(tempfile.mkdtemp(prefix="goodput-", dir=args.dir))
    # node memory for the memory tier, this run's own: no run of another restores from it
    memory = Path(tempfile.mkdtemp(prefix="goodput-", dir=MEMORY_ROOT)) if "memory" in mode.tiers else None
    load_before, revision = os.getloadavg(), commit()  # the code measured, not a commit made meanwhile
    try:
        with cluster_of(out, args.cluster) as site:
            site_file, remark = site_copy(site, args.spare_nodes, work, memory)
            if remark:
                out.print(f"[yellow]{remark}")
            tiers = ", ".join(mode.tiers) or "the site's"
            out.print(
                f"{size}: {args.workload} member ({mode.params or 'paced'}, tiers {tiers}), kinds"
                f" {', '.join(mode.kinds)} on {site}, a fault every {args.period:g} s; work {work}"
            )
            rounds = run_rounds(args, mode, site, work, out, site_file)
        meta = {
            "mode": size,
            "workload": args.workload,
            "member": {"workload": mode.workload, "params": mode.params, "interval": mode.interval},
            "tiers": list(mode.tiers),
            "site": site,
            "commit": revision,
            "period_s": args.period,
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "cpus": os.cpu_count(),
            "spare_nodes": args.spare_nodes,
            "remarks": [remark] if remark else [],
        }
        rows, checks = rows_of(rounds, spares=bool(args.spare_nodes) and remark is None, timed=mode.paced)
        print_report(out, meta, rows, checks)
        if args.json:
            write_document(args.json, meta, rows, checks, rounds)
        return 1 if harness.failed(checks) else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if memory is not None:
            shutil.rmtree(memory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
