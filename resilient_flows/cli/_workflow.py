"""The commands on a workflow and its runs: ``validate``, ``run``, ``status``, ``resume``, ``preempt``,
``clone`` and ``lineage`` (``logs``: :mod:`resilient_flows.cli._logs`).

``status`` is what a user types while waiting, so it imports neither torch nor Parsl. ``validate``
builds the site's Parsl configuration as ``run`` does (Parsl's import, under a second), and
imports the workflow's own functions in a separate process, as a worker will; never torch itself.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from resilient_flows.cli._console import console, print_document, warn, warn_damage
from resilient_flows.errors import WorkflowError
from resilient_flows.workflow import GROUP_ABOVE

DETACH_HELP = (
    "start the runner in the background, out of reach of the terminal's or ssh session's end (its output: "
    "RUN_DIR/runner.log); return once it holds the run"
)


def add_parsers(commands: argparse._SubParsersAction) -> None:
    validate = commands.add_parser("validate", help="check a workflow file and the site it names")
    validate.add_argument("file", metavar="FILE", help="a workflow YAML file")
    validate.add_argument("--site", help="check against this site instead of the workflow's")
    _add_site_options(validate)
    validate.set_defaults(handler=_validate)
    run = commands.add_parser("run", help="run a workflow through Parsl")
    run.add_argument("file", metavar="FILE", help="a workflow YAML file")
    run.add_argument("--site", help="a site name (`resilient-flows sites`) or a site file; default: the workflow's")
    _add_site_options(run)
    run.add_argument("--run-dir", help="where the run's files go; default: runs/<name>-<time>")
    run.add_argument("--detach", action="store_true", help=DETACH_HELP)
    run.set_defaults(handler=_run)
    status = commands.add_parser("status", help="show what each member of a run is doing")
    status.add_argument("run_dir", metavar="RUN_DIR")
    status.add_argument(
        "--all", action="store_true", help=f"a row per member even above {GROUP_ABOVE} members (default: per family)"
    )
    status.add_argument(
        "--follow",
        action="store_true",
        help="redraw the table every 2 s until the runner ends (or Ctrl-C), then print the final one",
    )
    _add_json(status)
    status.set_defaults(handler=_status)
    resume = commands.add_parser("resume", help="continue a run: finished members are skipped")
    resume.add_argument("run_dir", metavar="RUN_DIR")
    resume.add_argument(
        "--ranks",
        action="append",
        default=[],
        metavar="[MEMBER=]N",
        help="run resumed members on N ranks (all of them, or MEMBER=N, repeatable); checkpoints are resharded",
    )
    resume.add_argument("--detach", action="store_true", help=DETACH_HELP)
    _add_site_options(resume, "for this resume only")
    resume.set_defaults(handler=_resume)
    _add_member_parsers(commands)


def _add_site_options(parser: argparse.ArgumentParser, scope: str = "") -> None:
    """``--set KEY=VALUE``: the site options (``resilient_flows.sites.SITE_OPTIONS``, named here
    without importing pydantic for ``--help``)."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="site_options",
        help="change the site's blocks: nodes, walltime, queue, account (repeatable, e.g. --set nodes=4 "
        f"--set walltime=2h){'; ' + scope if scope else ''}",
    )


def _add_member_parsers(commands: argparse._SubParsersAction) -> None:
    """The commands that act on one member of a running workflow, or show how its members were cloned."""
    preempt = commands.add_parser("preempt", help="ask a running member to checkpoint and stop; Parsl requeues it")
    preempt.add_argument("run_dir", metavar="RUN_DIR")
    preempt.add_argument("member", metavar="MEMBER")
    preempt.add_argument("--reason", default="requested from the command line")
    preempt.set_defaults(handler=_preempt)
    clone = commands.add_parser("clone", help="fork a running member into variants without stopping it")
    clone.add_argument("run_dir", metavar="RUN_DIR")
    clone.add_argument("member", metavar="MEMBER")
    clone.add_argument("-n", type=int, default=1, help="how many clones (default 1)")
    clone.add_argument("--ranks", type=int, help="run the clones on this many ranks (resharded); default: the source's")
    clone.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override for every clone, e.g. lr=0.01"
    )
    clone.set_defaults(handler=_clone)
    lineage = commands.add_parser("lineage", help="show which member was cloned from which, and how")
    lineage.add_argument("run_dir", metavar="RUN_DIR")
    _add_json(lineage)
    lineage.set_defaults(handler=_lineage)


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print a JSON document for scripts instead (README: Output for scripts)"
    )


def _validate(args: argparse.Namespace) -> int:
    """Plan the workflow as ``run`` would, without starting anything: the workflow, the site's
    facts and Parsl configuration, and the functions its members and stages name."""
    from resilient_flows.sites import parse_site_options
    from resilient_flows.workflow import describe_families, plan_workflow, visualize_note
    from resilient_flows.workflow.schema import load_workflow

    options = parse_site_options(args.site_options)
    plan = plan_workflow(load_workflow(args.file), args.site, options=options)
    stages = [stage.name for stage in plan.workflow.stages]
    before = f"{len(stages)} stage(s) ({', '.join(stages)}), then " if stages else ""
    changed = plan.workflow.site.describe()
    site = f"{plan.site} ({changed})" if changed else plan.site
    out = console()
    out.print(f"{escape(args.file)}: valid; {before}{len(plan.members)} member(s) on site {escape(site)}")
    for line in describe_families((m.name, m.family) for m in plan.members):
        out.print(f"  {escape(line)}")
    note = visualize_note() if plan.workflow.monitoring else None
    if note is not None:  # the run records all the same; parsl-visualize can run elsewhere
        warn(note)
    return 0


def _run(args: argparse.Namespace) -> int:
    from resilient_flows.sites import parse_site_options
    from resilient_flows.workflow import prepare_run, start_run

    options = parse_site_options(args.site_options)
    if args.detach:  # the run directory is created here, so that a mistake is reported here; a resume runs it
        from resilient_flows.cli._detach import detach_runner

        directory, _ = prepare_run(args.file, site=args.site, run_dir=args.run_dir, options=options)
        return detach_runner(directory, [], console())
    return start_run(args.file, site=args.site, run_dir=args.run_dir, console=console(), options=options)


def _resume(args: argparse.Namespace) -> int:
    from resilient_flows.sites import parse_site_options

    ranks = _rank_counts(args.ranks)
    options = parse_site_options(args.site_options)
    if args.detach:  # without Parsl: the runner imports it
        from resilient_flows.cli._detach import detach_runner
        from resilient_flows.workflow import read_plan

        read_plan(Path(args.run_dir))  # a run directory, or a clear error before anything starts
        passed = [f"--ranks={item}" for item in args.ranks] + [f"--set={item}" for item in args.site_options]
        return detach_runner(Path(args.run_dir), passed, console())
    from resilient_flows.workflow import resume_run

    return resume_run(args.run_dir, console=console(), ranks=ranks, options=options)


def _rank_counts(items: list[str]) -> int | dict[str, int] | None:
    """``--ranks N`` (every resumed member) or ``--ranks MEMBER=N`` pairs."""
    counts: dict[str, int] = {}
    every = None
    for item in items:
        name, sep, text = item.rpartition("=")
        try:
            count = int(text)
        except ValueError:
            count = 0
        if count < 1 or (sep and not name):
            raise WorkflowError(f"--ranks {item!r}: expected a count of at least 1 (N) or MEMBER=N, e.g. --ranks 4")
        if sep:
            counts[name] = count
        else:
            every = count
    if every is not None and (counts or len(items) > 1):
        raise WorkflowError(
            f"--ranks {' '.join(items)}: give a single N for every resumed member, or only MEMBER=N pairs"
        )
    return every if every is not None else counts or None


def _status(args: argparse.Namespace) -> int:
    if args.follow and args.json:
        raise WorkflowError("status --follow draws a live table for a terminal; --json prints one document: choose one")
    if args.follow:  # the live table while a runner holds the run, then the final one as below
        from resilient_flows.workflow import follow_run

        follow_run(Path(args.run_dir), console(), all_members=args.all)

    from resilient_flows.rundir import DamageLog
    from resilient_flows.training import stage_finished
    from resilient_flows.workflow import (
        OutputTails,
        StatusTracker,
        failed_tails,
        liveness,
        member_notes,
        read_plan,
        run_members,
        stage_rows,
        stage_table,
        status_document,
        status_table,
    )

    run_dir = Path(args.run_dir)
    plan = read_plan(run_dir)
    stages = plan.workflow.stage_specs()
    damage = DamageLog()
    members = run_members(run_dir, plan, damage=damage)
    families = {m.name: m.family for m in members}
    tracker = StatusTracker(run_dir, follow=False, damage=damage)  # the event log read once, for all
    statuses = tracker.update([(m.name, m.steps) for m in members], families)
    stage_events = tracker.events_of([s.name for s in stages])
    if stages and not args.json:
        console().print(stage_table(run_dir, stages, stage_events))
    stages_done = all(stage_finished(args.run_dir, s.name) for s in stages)
    done = stages_done and all(s.state in ("finished", "retired") for s in statuses.values())
    runner = liveness(run_dir, [*statuses, *(s.name for s in stages)], damage)
    if args.json:
        rows = stage_rows(run_dir, stages, stage_events)
        document = status_document(
            run_dir, plan.workflow.name, plan.site, statuses, rows, damage, done, runner.document()
        )
        print_document(document)
    else:
        title = f"{plan.workflow.name} on {plan.site}: {args.run_dir}"
        console().print(status_table(statuses, title, all_members=args.all))
        console().print(OutputTails(run_dir, failed_tails(run_dir, statuses.values())), crop=False)
    for note in member_notes(statuses.values()):
        warn(note)
    warn_damage(run_dir, damage)
    active = any(s.state in ("queued", "running", "retrying") for s in statuses.values())
    advice = None if done else runner.advice(run_dir, active)
    if advice is not None:  # the states are the last ones recorded: say what they are worth now
        warn(advice)
    return 0 if done else 1


def _preempt(args: argparse.Namespace) -> int:
    from resilient_flows.rundir import has_result, request_preemption
    from resilient_flows.workflow import read_plan, run_members

    names = [m.name for m in run_members(Path(args.run_dir), read_plan(Path(args.run_dir)))]
    if args.member not in names:
        raise WorkflowError(f"{args.run_dir} has no member {args.member!r}; its members: {', '.join(names)}")
    if has_result(args.run_dir, args.member):  # as clone refuses: nothing would ever read the request
        raise WorkflowError(f"member {args.member!r} has finished: only a running member can be preempted")
    request_preemption(args.run_dir, args.member, args.reason)
    console().print(f"{args.member} will commit a checkpoint and stop after its current step, then be requeued")
    return 0


def _clone(args: argparse.Namespace) -> int:
    import yaml

    from resilient_flows.clone import request_clone
    from resilient_flows.workflow import read_plan

    read_plan(Path(args.run_dir))  # a run directory, or a clear error
    overrides = {}
    for item in args.set:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise WorkflowError(f"--set {item!r}: expected KEY=VALUE, e.g. --set lr=0.01")
        overrides[key.strip()] = yaml.safe_load(text)
    names = request_clone(args.run_dir, args.member, args.n, overrides, ranks=args.ranks)
    console().print(f"cloning {args.member} into {', '.join(names)} at its next step; the runner starts them")
    return 0


def _lineage(args: argparse.Namespace) -> int:
    from resilient_flows.clone import lineage_document, lineage_tree
    from resilient_flows.rundir import DamageLog
    from resilient_flows.workflow import member_statuses, read_plan, run_members

    run_dir = Path(args.run_dir)
    damage = DamageLog()
    members = run_members(run_dir, read_plan(run_dir), damage=damage)
    statuses = member_statuses(args.run_dir, [(m.name, m.steps) for m in members], damage=damage)
    if args.json:
        progress = {
            n: {"state": s.state, "steps_done": 0 if s.step is None else s.step + 1, "steps": s.steps}
            for n, s in statuses.items()
        }
        print_document(lineage_document(run_dir, progress, damage))
    else:
        states = {n: f"{s.state}, step {'-' if s.step is None else s.step + 1}/{s.steps}" for n, s in statuses.items()}
        console().print(lineage_tree(args.run_dir, states, damage))
    warn_damage(run_dir, damage)
    return 0
