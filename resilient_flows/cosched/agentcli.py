"""``resilient-flows cosched agent``: the preemption agent as a long-running command."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from resilient_flows.cosched.agent import ONDEMAND_MARKER, Agent, AgentConfig
from resilient_flows.cosched.batch import UNITS, BatchSystem
from resilient_flows.cosched.policies import POLICIES
from resilient_flows.units import duration_argument

__all__ = ["SCHEDULERS", "add_cosched_parser", "batch_system"]

SCHEDULERS = ("slurm", "pbspro")


def add_cosched_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``cosched`` (with its ``agent`` action) to ``resilient-flows``' subcommands."""
    cosched = subparsers.add_parser("cosched", help="co-schedule on-demand jobs with batch jobs on a real scheduler")
    actions = cosched.add_subparsers(required=True, metavar="ACTION")
    text = "watch the queue and preempt the batch jobs that lose least when an on-demand job needs nodes"
    agent = actions.add_parser("agent", help=text, description=text + ".")
    agent.add_argument("--scheduler", choices=SCHEDULERS, default="slurm", help="the batch system (default slurm)")
    where = agent.add_argument_group("which jobs")
    where.add_argument("--partition-ondemand", metavar="NAME", help="pending jobs here are on-demand requests")
    where.add_argument(
        "--ondemand-marker",
        default=ONDEMAND_MARKER,
        help=f"pending jobs whose comment holds this are on-demand requests too (default {ONDEMAND_MARKER})",
    )
    where.add_argument(
        "--partition", action="append", default=[], metavar="NAME", help="preempt only jobs here (repeatable)"
    )
    where.add_argument("--user", action="append", default=[], metavar="NAME", help="preempt only their jobs")
    where.add_argument("--unit", choices=UNITS, default="nodes", help="count nodes, or CPUs on shared nodes")
    policy = agent.add_argument_group("policy")
    policy.add_argument("--policy", choices=POLICIES, default="dp", metavar="POLICY", help="dp (default) or a baseline")
    policy.add_argument("--alpha", type=float, default=1.0, help="weight of the request's wait per node-s (1)")
    policy.add_argument("--beta", type=float, default=1.0, help="weight of lost and restart work per node-s (1)")
    policy.add_argument("--max-delay", type=duration_argument, default=1800.0, help="longest wait dp may choose (30m)")
    policy.add_argument(
        "--restart-cost", type=duration_argument, default=60.0, help="for jobs without a heartbeat (60s)"
    )
    acting = agent.add_argument_group("acting")
    acting.add_argument("--interval", type=duration_argument, default=5.0, help="between polls (5s)")
    acting.add_argument("--signal", default="USR1", help="what a victim gets to checkpoint and exit (USR1)")
    acting.add_argument(
        "--grace", type=duration_argument, default=60.0, help="before a signalled victim is requeued anyway (60s)"
    )
    acting.add_argument(
        "--no-prioritize",
        dest="prioritize",
        action="store_false",
        help="leave a served request's priority alone (default: Slurm puts it ahead of other pending jobs)",
    )
    acting.add_argument("--dry-run", action="store_true", help="print the decisions; signal and requeue nothing")
    acting.add_argument("--log", type=Path, help="append every decision and action to this JSON-lines file")
    acting.add_argument("--polls", type=int, help=argparse.SUPPRESS)
    agent.set_defaults(handler=run_agent)
    return agent


def batch_system(name: str) -> BatchSystem:
    if name == "slurm":
        from resilient_flows.cosched.slurm import SlurmBatch

        return SlurmBatch()
    from resilient_flows.cosched.pbspro import PBSProBatch

    return PBSProBatch()


def run_agent(args: argparse.Namespace) -> int:
    config = AgentConfig(
        ondemand_partition=args.partition_ondemand,
        ondemand_marker=args.ondemand_marker,
        partitions=tuple(args.partition),
        users=tuple(args.user),
        policy=args.policy,
        alpha=args.alpha,
        beta=args.beta,
        max_delay=args.max_delay,
        interval=args.interval,
        signal=args.signal,
        grace=args.grace,
        restart_cost=args.restart_cost,
        unit=args.unit,
        prioritize=args.prioritize,
        dry_run=args.dry_run,
    )
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(message)s")
    agent = Agent(batch_system(args.scheduler), config, log_path=args.log)
    try:
        agent.run(polls=args.polls)
    except KeyboardInterrupt:
        return 130
    return 0
