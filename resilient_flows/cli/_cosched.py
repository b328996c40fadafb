"""``resilient-flows cosched agent``: the preemption agent as a long-running command."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from resilient_flows.cosched import ONDEMAND_MARKER, POLICIES, UNITS, BatchSystem
from resilient_flows.units import duration_argument

logger = logging.getLogger(__name__)

SCHEDULERS = ("slurm", "pbspro")


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Add ``cosched`` (with its ``agent`` action) to ``resilient-flows``' subcommands."""
    cosched = commands.add_parser("cosched", help="co-schedule on-demand jobs with batch jobs on a real scheduler")
    actions = cosched.add_subparsers(required=True, metavar="ACTION")
    text = "watch the queue and preempt the batch jobs that lose least when an on-demand job needs nodes"
    agent = actions.add_parser("agent", help=text, description=text + ".")
    agent.add_argument("--scheduler", choices=SCHEDULERS, default="slurm", help="the batch system (default slurm)")
    _add_job_options(agent.add_argument_group("which jobs"))
    _add_policy_options(agent.add_argument_group("policy"))
    _add_acting_options(agent.add_argument_group("acting"))
    agent.set_defaults(handler=run_agent)


def _add_job_options(where: argparse._ArgumentGroup) -> None:
    where.add_argument(
        "--partition-ondemand",
        metavar="NAME",
        help="pending jobs here, and only these, are on-demand requests (job comments are then ignored)",
    )
    where.add_argument(
        "--ondemand-marker",
        default=ONDEMAND_MARKER,
        help="without --partition-ondemand: pending jobs with this word in their comment are on-demand requests "
        f"(default {ONDEMAND_MARKER}; any user can write it, so prefer a partition on a shared machine)",
    )
    where.add_argument(
        "--partition", action="append", default=[], metavar="NAME", help="preempt only jobs here (repeatable)"
    )
    where.add_argument("--user", action="append", default=[], metavar="NAME", help="preempt only their jobs")
    where.add_argument("--unit", choices=UNITS, default="nodes", help="count nodes, or CPUs on shared nodes")


def _add_policy_options(policy: argparse._ArgumentGroup) -> None:
    policy.add_argument("--policy", choices=POLICIES, default="dp", metavar="POLICY", help="dp (default) or a baseline")
    policy.add_argument("--alpha", type=float, default=1.0, help="weight of the request's wait per node-s (1)")
    policy.add_argument("--beta", type=float, default=1.0, help="weight of lost and restart work per node-s (1)")
    policy.add_argument("--max-delay", type=duration_argument, default=1800.0, help="longest wait dp may choose (30m)")
    policy.add_argument(
        "--restart-cost", type=duration_argument, default=60.0, help="for jobs without a heartbeat (60s)"
    )
    policy.add_argument(
        "--max-restore",
        type=duration_argument,
        default=3600.0,
        help="the most restore time a heartbeat is believed to claim (1h; also at most the job's elapsed time)",
    )
    policy.add_argument(
        "--heartbeat-deadline",
        type=duration_argument,
        default=2.0,
        help="time a poll may spend reading heartbeats; those not read by then count as none (2s)",
    )


def _add_acting_options(acting: argparse._ArgumentGroup) -> None:
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
    acting.add_argument(
        "--state",
        type=Path,
        help="keep the preemptions under way here, to finish them after a restart (default: beside --log, "
        "LOG.state.json)",
    )
    acting.add_argument("--polls", type=int, help=argparse.SUPPRESS)


def batch_system(name: str) -> BatchSystem:
    """The adapter for scheduler ``name`` (one of :data:`SCHEDULERS`), imported only when chosen."""
    if name == "slurm":
        from resilient_flows.cosched import SlurmBatch

        return SlurmBatch()
    from resilient_flows.cosched import PBSProBatch

    return PBSProBatch()


def state_path(state: Path | None, log: Path | None) -> Path | None:
    """Where the agent keeps its preemptions under way: ``--state``, else beside the log."""
    if state is not None or log is None:
        return state
    return log.with_name(f"{log.stem}.state.json")


def run_agent(args: argparse.Namespace) -> int:
    """Run the agent until interrupted (or for ``--polls``); its state file is read first."""
    from resilient_flows.cosched import Agent, AgentConfig

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
        heartbeat_deadline=args.heartbeat_deadline,
        max_restore=args.max_restore,
    )
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(message)s")
    state = state_path(args.state, args.log)
    if state is None and not args.dry_run:
        logger.warning("no --state or --log: victims held when this agent dies stay held until released by hand")
    agent = Agent(batch_system(args.scheduler), config, log_path=args.log, state_path=state)
    try:
        agent.run(polls=args.polls)
    except KeyboardInterrupt:
        return 130
    return 0
