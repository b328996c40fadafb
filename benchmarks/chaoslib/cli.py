"""The command line of ``benchmarks/chaos.py``: options checked against each other, the fault-free
reference and the chaos run, the report, and the exit status (0 only when every target is met).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import harness
from rich.console import Console

from chaoslib.agent import agent_main
from chaoslib.config import MODES, WALLTIME_MEMBER, Config, SiteFacts, site_kinds, walltime_config, workflow_yaml
from chaoslib.execution import Execution, run_chaos, run_reference
from chaoslib.figures import figures, notes
from chaoslib.members import fault_free_digests
from chaoslib.report import print_report, write_json
from chaoslib.resumes import node_loss_resumes
from chaoslib.rundata import directory_mib, members_span_s
from chaoslib.schedule import Fault
from chaoslib.slurm import slurm_cluster, slurm_nodes_cluster
from resilient_flows.units import duration_argument


def parser_of(doc: str) -> argparse.ArgumentParser:
    """The options, described by ``doc`` (``chaos.py``'s)."""
    parser, _ = harness.options(
        doc, quick="4 paced members, two bursts of faults: a minute or a few", full="1,000 members of tiny steps"
    )
    parser.add_argument(
        "--slurm", action="store_true", help="on the local-slurm site (starts a cluster if none answers)"
    )
    parser.add_argument(
        "--nodes",
        action="store_true",
        help="on the local-nodes site: three emulated nodes with node-local tiers, and node-loss faults",
    )
    parser.add_argument(
        "--slurm-nodes",
        type=int,
        metavar="N",
        help="on local-slurm-nodes: a Slurm cluster of N >= 3 network namespaces, started here, and node crashes",
    )
    parser.add_argument(
        "--peer",
        action="store_true",
        help="with --slurm-nodes: half the members span two nodes with tiers [local, peer, shared], "
        "and node-and-buddy-loss faults",
    )
    parser.add_argument(
        "--walltime",
        type=duration_argument,
        metavar="D",
        help="with --slurm or --slurm-nodes: blocks of this walltime (whole minutes, e.g. 2m), drained before it",
    )
    parser.add_argument(
        "--kinds", metavar="K,K", help="only these kinds of fault (comma-separated; 'none': no fault at all)"
    )
    parser.add_argument(
        "--agent",
        action="store_true",
        help="instead: the preemption agent's faults, against the tests' fake PBS Pro (seconds)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the chaos schedule's seed (default 0)")
    parser.add_argument("--json", type=Path, help="write every figure with its unit, the checks and the faults")
    parser.add_argument("--dir", type=Path, help="working directory (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory and a copy of the chaos run")
    parser.add_argument("--timeout", type=float, help="seconds each run may take (default: from the reference)")
    return parser


@dataclass(frozen=True)
class Plan:
    """What the options ask for: the size, its configuration, the site and the kinds of fault."""

    size: str
    config: Config
    site: str
    kinds: tuple[str, ...]


def plan_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Plan:
    """The run the options ask for; a usage error (exit 2) for options that contradict each other."""
    if args.slurm_nodes is not None and args.slurm_nodes < 3:
        parser.error("--slurm-nodes needs at least 3 nodes: blocks of 2, and one to spare when a node is lost")
    if sum((args.slurm, args.nodes, args.slurm_nodes is not None)) > 1:
        parser.error("choose one of --slurm, --nodes and --slurm-nodes")
    if args.peer and args.slurm_nodes is None:
        parser.error("--peer needs --slurm-nodes: members spanning nodes run on local-slurm-nodes")
    if args.walltime is not None and not (args.slurm or args.slurm_nodes is not None):
        parser.error("--walltime needs --slurm or --slurm-nodes: the runner learns when a block started from Slurm")
    if args.walltime is not None and (args.walltime < 60 or args.walltime % 60):
        parser.error("--walltime is whole minutes, at least 1m: Slurm's time limits are")
    size = harness.size_of(args)
    config = MODES[size]
    site = "local-slurm" if args.slurm else "local-nodes" if args.nodes else "local"
    if args.slurm_nodes is not None:
        site = "local-slurm-nodes"
    if args.peer:
        config = replace(config, peer_members=config.members // 2)
    if args.walltime is not None:
        config = walltime_config(config, args.walltime)
    kinds = site_kinds(site, config)
    if args.kinds is not None:
        chosen = () if args.kinds.strip() == "none" else tuple(k.strip() for k in args.kinds.split(",") if k.strip())
        unknown = [k for k in chosen if k not in kinds]
        if unknown:
            parser.error(f"--kinds: {', '.join(unknown)} not among this run's kinds ({', '.join(kinds)})")
        kinds = chosen
    return Plan(size, config, site, kinds)


@dataclass(frozen=True)
class Baseline:
    """What the chaos run is judged against, and the sizes taken from it."""

    reference: Execution | None  # the fault-free run; None: weights trained in this process (``--quick``)
    digests: dict[str, str]
    span_s: float  # the bursts spread over this many seconds
    shared_mib: int  # the shared tier's tmpfs
    timeout_s: float  # the chaos run's


def baseline(plan: Plan, work: Path, timeout: float | None, console: Console) -> Baseline | None:
    """The fault-free run (None when it did not finish), or for a run that spans its bursts over
    a set time, the fault-free weights trained here: no wall time or runner CPU to compare with."""
    config, site = plan.config, plan.site
    if config.span_s is None:
        reference = run_reference(config, work, site, timeout or 40.0 * config.members + 300)
        failures = [name for name in reference.data.names if name not in reference.data.digests]
        if failures or reference.timed_out:
            console.print(f"[red]fault-free run unfinished ({len(failures)} members); see {reference.log}")
            return None
        console.print(f"fault-free run: {reference.wall_s:.0f} s")
        return Baseline(
            reference,
            reference.data.digests,
            0.6 * members_span_s(reference.data),
            max(512, int(4 * directory_mib(work / "reference"))),
            timeout or 3 * reference.wall_s + 120,
        )
    # a node lost on local-slurm-nodes takes a minute to notice and replace
    patience = 400.0 if site == "local-slurm-nodes" else 200.0
    if config.peer_members:  # a node and its buddy lost: on three nodes, no block for 45 s
        patience += 200.0
    if config.walltime_s is not None:  # members of 1.2 walltimes, two at a time, several blocks each
        patience += 3 * WALLTIME_MEMBER * config.walltime_s * config.members
    (work / "reference").mkdir(parents=True)
    (work / "reference.yaml").write_text(workflow_yaml(config, site))
    digests = fault_free_digests(work / "reference.yaml", work / "reference")
    console.print(f"fault-free weights trained in this process ({len(digests)} members)")
    return Baseline(None, digests, config.span_s, 256, timeout or patience)


def cluster_of(args: argparse.Namespace, console: Console) -> contextlib.AbstractContextManager[Any]:
    """The Slurm cluster the site needs for the run, if any."""
    if args.slurm_nodes is not None:
        return slurm_nodes_cluster(console, args.slurm_nodes)
    return slurm_cluster(console) if args.slurm else contextlib.nullcontext()


def chaos_run(
    plan: Plan, work: Path, args: argparse.Namespace, console: Console
) -> tuple[Baseline, Execution, list[Fault]] | None:
    """The baseline, then the chaos run, on the site's cluster; None when the baseline failed."""
    config = plan.config
    with cluster_of(args, console):
        console.print(f"{plan.size}: {config.members} members of {config.steps} steps on {plan.site}; work in {work}")
        base = baseline(plan, work, args.timeout, console)
        if base is None:
            return None
        console.print(f"chaos over {base.span_s:.0f} s, seed {args.seed}, shared tier {base.shared_mib} MiB")
        if config.walltime_s is not None:
            console.print(f"blocks of {config.walltime_s / 60:g} min walltime")
        chaos, faults = run_chaos(
            config,
            work / "chaos",
            plan.site,
            base.span_s,
            args.seed,
            base.shared_mib,
            base.timeout_s,
            console,
            args.keep,
            plan.kinds,
        )
    return base, chaos, faults


def main(doc: str, argv: list[str] | None = None) -> int:
    """``chaos.py``: 0 when every target is met, 1 otherwise (or when the fault-free run failed)."""
    parser = parser_of(doc)
    args = parser.parse_args(argv)
    plan = plan_of(parser, args)
    config, site = plan.config, plan.site
    console = harness.console()
    # SIGTERM (a CI timeout) unwinds like Ctrl-C: processes, mounts and clusters are cleaned up.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    work = Path(tempfile.mkdtemp(prefix="chaos-", dir=args.dir))
    if args.agent:
        return agent_main(console, work, args)
    try:
        ran = chaos_run(plan, work, args, console)
        if ran is None:
            return 1
        base, chaos, faults = ran
        found = figures(config, SiteFacts.of(site), chaos, faults, base.digests, base.reference)
        resumes = node_loss_resumes(chaos.data, faults, chaos.data.spanning)
        remarks = notes(chaos, faults)
        print_report(
            console, f"Chaos: {config.members} members on {site}, seed {args.seed}", found, faults, remarks, resumes
        )
        verdict = all(f.ok is not False for f in found)
        console.print(
            f"{'PASS' if verdict else 'FAIL'}; runner log: {chaos.log}" if args.keep else "PASS" if verdict else "FAIL"
        )
        if args.json:
            meta = {
                "mode": plan.size,
                "site": site,
                "seed": args.seed,
                "config": asdict(config),
                "cpus": os.cpu_count(),
            }
            meta["kinds"] = list(plan.kinds)
            write_json(args.json, meta, found, faults, remarks, resumes)
        return 0 if verdict else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
