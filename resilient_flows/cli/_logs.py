"""``resilient-flows logs RUN_DIR MEMBER``: what a member's attempt printed, or follow it as it prints.

The output is the user's own bytes, written to stdout as they are: never through rich, which would
read its brackets as markup. Like ``status``, it imports neither torch nor Parsl.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from resilient_flows.errors import WorkflowError
from resilient_flows.rundir import TaskLayout

#: Seconds between two looks at a followed log.
POLL_S = 0.5


def add_parsers(commands: argparse._SubParsersAction) -> None:
    logs = commands.add_parser(
        "logs", help="print what a member (or stage) printed in an attempt: its stdout, stderr and traceback"
    )
    logs.add_argument("run_dir", metavar="RUN_DIR")
    logs.add_argument("member", metavar="MEMBER", help="a member or stage of the run")
    logs.add_argument("--attempt", type=int, metavar="N", help="which attempt (1 for the first); default: the latest")
    logs.add_argument(
        "--rank",
        type=int,
        metavar="R",
        help="only rank R of a member on several MPI ranks (default: every rank's, rank 0 first)",
    )
    logs.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="print the output as it comes, until the attempt ends (or Ctrl-C); one rank's: rank 0 unless --rank; "
        "waits for the first attempt while a runner holds the run",
    )
    logs.set_defaults(handler=_logs)


def _logs(args: argparse.Namespace) -> int:
    from resilient_flows.rundir import attempt_logs, copy_log

    run_dir = Path(args.run_dir)
    layout = _task_layout(run_dir, args.member)
    found = attempt_logs(layout)
    if not found and args.follow and args.attempt is None:
        try:
            found = _first_attempt(run_dir, layout)
        except KeyboardInterrupt:
            return 0
    if not found:
        raise WorkflowError(f"{args.member} has printed nothing yet: no attempt of it has started")
    attempt = max(found) if args.attempt is None else args.attempt
    if attempt not in found:
        listed = ", ".join(map(str, found))
        raise WorkflowError(f"{args.member} has no attempt {attempt}; its attempts with output: {listed}")
    ranks = found[attempt]
    if args.rank is not None and args.rank not in ranks:
        listed = ", ".join(map(str, ranks))
        raise WorkflowError(f"attempt {attempt} of {args.member} has no output of rank {args.rank}; ranks: {listed}")
    try:
        if args.follow:
            path = ranks[args.rank] if args.rank is not None else next(iter(ranks.values()))
            return _follow(run_dir, args.member, layout, attempt, path)
        chosen = {args.rank: ranks[args.rank]} if args.rank is not None else ranks
        out = sys.stdout.buffer
        for number, path in chosen.items():
            if len(chosen) > 1:
                out.write(f"==> rank {number}: {path} <==\n".encode())
                out.flush()
            copy_log(path, out)
    except BrokenPipeError:  # `logs ... | head` read what it wanted: no traceback, nothing more at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _first_attempt(run_dir: Path, layout: TaskLayout) -> dict[int, dict[int, Path]]:
    """The member's logs once its first attempt started, waiting while a runner holds the run
    (``logs --follow`` right after ``run --detach``); none if no runner does."""
    from resilient_flows.rundir import attempt_logs, holding_runner

    found = attempt_logs(layout)
    while not found and holding_runner(run_dir) is not None:
        time.sleep(POLL_S)
        found = attempt_logs(layout)
    return found


def _task_layout(run_dir: Path, name: str) -> TaskLayout:
    """The directory of the run's member or stage ``name``; one clear line when there is none."""
    from resilient_flows.rundir import member_layout, stage_layout
    from resilient_flows.workflow import read_plan, run_members

    plan = read_plan(run_dir)  # a run directory, or a clear error
    members = [m.name for m in run_members(run_dir, plan)]
    stages = [s.name for s in plan.workflow.stage_specs()]
    if name in members:
        return member_layout(run_dir, name)
    if name in stages:
        return stage_layout(run_dir, name)
    raise WorkflowError(f"{run_dir} has no member {name!r}; its members: {', '.join(members + stages)}")


def _follow(run_dir: Path, name: str, layout: TaskLayout, attempt: int, path: Path) -> int:
    """Copy the attempt's log as it grows until the attempt is over: a later attempt started, the
    member has its result, or its heartbeat stopped (having beaten, or with no runner holding the
    run to start it). Ctrl-C ends it quietly: following is no part of the run."""
    from resilient_flows.rundir import attempt_logs, follow_log, holding_runner
    from resilient_flows.workflow._liveness import fresh_heartbeats

    beaten = False

    def ended() -> bool:
        nonlocal beaten
        if max(attempt_logs(layout), default=attempt) > attempt or layout.has_result():
            return True
        if name in fresh_heartbeats(run_dir):
            beaten = True
            return False
        return beaten or holding_runner(run_dir) is None

    try:
        follow_log(path, sys.stdout.buffer, ended, time.sleep, POLL_S)
    except KeyboardInterrupt:
        sys.stdout.flush()
    return 0
