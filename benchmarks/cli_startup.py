"""How long ``resilient-flows --help``, ``validate`` and ``status`` take, from a cold process to exit.

Every figure is the wall time of the real command (the installed ``resilient-flows`` script, else
``python -m resilient_flows.cli``) in a fresh process, Python's own start-up included, its output
sent to a pipe as when a script reads it; the median over rounds (``spread``: median absolute
deviation). Targets (issue 13):

- ``--help`` and ``validate workflows/quickstart.yaml``: under 0.5 s;
- ``status RUN_DIR`` of a 1,000-member run: under 1 s (and under 0.5 s of start-up, which
  ``--help`` measures).

The run directory is synthetic, made here the way a run makes it: ``plan.json`` and each member's
``spec.json`` through :func:`~resilient_flows.workflow._recorded_plan.create_run_dir` (a ``count: N``
workflow on the local site), then ``events.jsonl``, ``metrics.jsonl`` and ``result.json`` in the
shapes that :mod:`resilient_flows.rundir._events` and ``run_member`` write. Its members are caught
mid-run: 70 % finished, 20 % running, 4 % queued, 3 % retrying after a lost worker, 3 % failed
for good; events hold a ``checkpointed`` line every 20 steps.

For information: a bare ``python -c pass`` (the floor under every command), ``status --all`` (a
row per member), whether each command imported torch or Parsl (a separate run that lists
``sys.modules`` at exit), and the runner's view of the same run: one
:class:`~resilient_flows.workflow._status.StatusTracker` update when nothing was appended (the
runner's poll in a quiet moment: it refreshes only the running members), against the first one
that read the whole run.

Run ``python benchmarks/cli_startup.py [--quick | --full] [--json PATH]``: ``--quick``: members of
50 steps, 3 rounds (about 20 s); default: 200 steps, 7 rounds; ``--full``: 1,000 steps, 15 rounds.
Members: 1,000 in every mode (``--members N`` to change).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from harness import Clock, median_time, options, size_of, spread, with_units, write_json
from report import print_figures
from rich.table import Table

from resilient_flows.training._spec import MemberSpec
from resilient_flows.workflow._plan import plan_workflow
from resilient_flows.workflow._recorded_plan import create_run_dir
from resilient_flows.workflow._status import StatusTracker
from resilient_flows.workflow.schema import load_workflow

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "workflows" / "quickstart.yaml"
MODES = {  # steps per member, rounds per median
    "quick": {"steps": 50, "reps": 3},
    "default": {"steps": 200, "reps": 7},
    "full": {"steps": 1000, "reps": 15},
}
MEMBERS = 1000
CHECKPOINT_EVERY = 20
#: Share of members in each state, in the order they are assigned (the rest: finished).
MIX = {"running": 0.20, "queued": 0.04, "retrying": 0.03, "failed": 0.03}
console = harness.console()

#: key: (section, unit, label), in print order.
FIGURES = {
    "python": ("baseline", "s", "python -c pass"),
    "help": ("--help", "s", "resilient-flows --help"),
    "help_spread": ("--help", "s", "  spread over rounds (MAD)"),
    "validate": ("validate", "s", "validate workflows/quickstart.yaml"),
    "validate_spread": ("validate", "s", "  spread over rounds (MAD)"),
    "status": ("status", "s", "status RUN_DIR ({members} members)"),
    "status_spread": ("status", "s", "  spread over rounds (MAD)"),
    "status_all": ("status", "s", "status --all RUN_DIR (a row per member)"),
    "run_bytes": ("run", "MiB", "run directory: events, metrics, results, specs"),
    "tracker_first": ("runner", "ms", "StatusTracker: first update (reads the run)"),
    "tracker_quiet": ("runner", "ms", "StatusTracker: update with nothing appended"),
    "tracker_refreshed": ("runner", "members", "  members it refreshed (running or retrying)"),
}
#: key judged, operator, target in the figure's unit.
TARGETS = {"help": 0.5, "validate": 0.5, "status": 1.0}
#: command, what it must not import.
IMPORT_CHECKS = ("help", "validate", "status")


def command() -> list[str]:
    """The ``resilient-flows`` a user runs: the script beside this Python, else the module."""
    script = Path(sys.executable).with_name("resilient-flows")
    return [str(script)] if script.exists() else [sys.executable, "-m", "resilient_flows.cli"]


def arguments(run_dir: Path) -> dict[str, list[str]]:
    return {
        "help": ["--help"],
        "validate": ["validate", str(QUICKSTART)],
        "status": ["status", str(run_dir)],
        "status_all": ["status", "--all", str(run_dir)],
    }


# ---------------------------------------------------------------------- the synthetic run


def build_run(root: Path, members: int, steps: int, seed: int = 0) -> Path:
    """A run directory of ``members`` members of ``steps`` steps, caught mid-run (see :data:`MIX`)."""
    text = (
        f"name: synthetic\nsite: local\ncheckpoint: {{interval: {CHECKPOINT_EVERY}}}\n"
        f"members:\n  - {{name: m, workload: mlp-digits, steps: {steps}, count: {members}}}\n"
    )
    source = root / "synthetic.yaml"
    source.write_text(text)
    plan = plan_workflow(load_workflow(source), build_site=False)
    run_dir = create_run_dir(root / "run", plan, text)
    rng = random.Random(seed)
    states = [state for state, share in MIX.items() for _ in range(round(share * members))]
    states += ["finished"] * (members - len(states))
    rng.shuffle(states)
    clock = time.time() - 3600.0
    events: list[dict[str, Any]] = []
    for spec, state in zip(plan.members, states, strict=True):
        events += write_member(run_dir, spec, state, clock + rng.uniform(0, 60), rng)
    events.sort(key=lambda e: e["time"])
    with (run_dir / "events.jsonl").open("w") as f:
        f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in events)
    return run_dir


def write_member(run_dir: Path, spec: MemberSpec, state: str, start: float, rng: random.Random) -> list[dict]:
    """Write one member's metrics (and result); its events, as the runner and the member emit them."""
    steps, name, pace = spec.steps, spec.name, rng.uniform(0.004, 0.008)

    def event(kind: str, when: float, **fields: Any) -> dict[str, Any]:
        return {"time": round(when, 6), "kind": kind, "member": name, **fields}

    out = [event("submitted", start - 5.0, ranks=1, parent=None)]
    if state == "queued":
        return out
    last = rng.randrange(1, steps) if state == "running" else steps - 1
    if state in ("retrying", "failed"):
        last = rng.randrange(steps // 2, steps)
    died = last if state in ("retrying", "failed") else None
    attempts = [(1, 0, last)]
    if state == "failed":  # lost once, resumed from its checkpoint, then failed for good
        died = rng.randrange(CHECKPOINT_EVERY, steps // 2)
        attempts = [(1, 0, died), (2, died - died % CHECKPOINT_EVERY, last)]
    lines, when, loss = [], start, 2.3
    for attempt, first, end in attempts:
        out.append(event("started", when, attempt=attempt, host="node", pid=rng.randrange(1000, 99999)))
        if first:
            out.append(event("resumed", when + 0.2, attempt=attempt, step=first - 1))
        for step in range(first, end + 1):
            when += pace
            loss = max(1e-4, loss * rng.uniform(0.97, 1.0))
            lines.append(json.dumps({"step": step, "attempt": attempt, "time": when, "loss": loss}) + "\n")
            if (step + 1) % CHECKPOINT_EVERY == 0:
                out.append(event("checkpointed", when, step=step, stall_ms=1.3))
        if attempt == 1 and died is not None:
            committed = died - died % CHECKPOINT_EVERY - 1
            error = "WorkerLost: Task failure due to loss of worker 0 on host node"
            cause = "lost after progress"
            out.append(event("failed", when + 1.0, error=error, cause=cause, cost=0.0, checkpoint=committed))
            out.append(event("retried", when + 1.0, attempt=2, from_step=committed))
            when += 2.0
    directory = run_dir / "members" / name
    (directory / "metrics.jsonl").write_text("".join(lines))
    if state == "failed":
        error = f"RuntimeError: injected error in member {name} at step {last}"
        out.append(event("failed", when + 0.5, error=error, cause="error", cost=1.0, checkpoint=last - 1))
    if state == "finished":
        result = {"member": name, "attempts": 1, "step": last, "loss": loss, "test_loss": loss * 1.5}
        result |= {"test_accuracy": rng.uniform(0.9, 0.99), "digest": f"{rng.getrandbits(256):064x}"}
        (directory / "result.json").write_text(json.dumps(result, indent=2))
        scalars = {k: v for k, v in result.items() if k not in ("member", "attempts")}
        out.append(event("finished", when + 0.3, attempt=1, **scalars))
    return out


def directory_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())


# ---------------------------------------------------------------------- measurements


def wall(argv: list[str], ok: tuple[int, ...] = (0,)) -> float:
    """Seconds from starting ``argv`` to its exit; its output goes to a pipe, read and dropped."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, cwd=REPO, check=False)
    took = time.perf_counter() - start
    if done.returncode not in ok:
        raise SystemExit(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.decode()[-2000:]}")
    return took


def timings(run_dir: Path, reps: int) -> dict[str, float]:
    """Median wall time of each command and the bare interpreter, rounds interleaved; their spreads."""
    runs: dict[str, list[float]] = {"python": [], **{key: [] for key in arguments(run_dir)}}
    for _ in range(reps):
        runs["python"].append(wall([sys.executable, "-c", "pass"]))
        for key, args in arguments(run_dir).items():
            runs[key].append(wall(command() + args, ok=(0, 1) if key.startswith("status") else (0,)))
    figures = {key: statistics.median(values) for key, values in runs.items()}
    for key in ("help", "validate", "status"):
        figures[f"{key}_spread"] = spread(runs[key], figures[key])
    return figures


def heavy_imports(run_dir: Path) -> dict[str, list[str]]:
    """For each command, which of torch and Parsl it imported (run in a process that reports at exit)."""
    probe = (
        "import sys\n"
        "from resilient_flows.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print('\\nIMPORTED', *(m for m in ('torch', 'parsl') if m in sys.modules))\n"
    )
    found = {}
    for key in IMPORT_CHECKS:
        done = subprocess.run(
            [sys.executable, "-c", probe, *arguments(run_dir)[key]], capture_output=True, text=True, cwd=REPO
        )
        marker = [line for line in done.stdout.splitlines() if line.startswith("IMPORTED")]
        if not marker:
            raise SystemExit(f"the import probe of {key} printed nothing: {done.stderr[-2000:]}")
        found[key] = marker[-1].split()[1:]
    return found


def tracker_costs(run_dir: Path) -> dict[str, float]:
    """The runner's StatusTracker on this run: its first update, then one with nothing appended."""
    from resilient_flows.workflow._recorded_plan import read_plan

    members = [(m.name, m.steps) for m in read_plan(run_dir).members]
    tracker = StatusTracker(run_dir)
    start = time.perf_counter()
    statuses = tracker.update(members)
    first = time.perf_counter() - start
    active = sum(1 for s in statuses.values() if s.active)
    return {
        "tracker_first": 1000 * first,
        "tracker_quiet": 1000 * median_time(lambda: tracker.update(members), 5),
        "tracker_refreshed": active,
    }


# ---------------------------------------------------------------------- report


def checks(figures: dict[str, float]) -> dict[str, dict[str, Any]]:
    result = {}
    for key, target in TARGETS.items():
        value = figures[key]
        result[key] = {
            "label": FIGURES[key][2],
            "value": value,
            "target": f"< {target:g} s",
            "result": "PASS" if value < target else "FAIL",
        }
    return result


def labelled(members: int) -> dict[str, tuple[str, str, str]]:
    """FIGURES with the run's number of members in the labels that name it."""
    return {key: (section, unit, label.format(members=members)) for key, (section, unit, label) in FIGURES.items()}


def print_report(
    figures: dict[str, float], verdicts: dict[str, dict[str, Any]], imported: dict[str, list[str]], members: int
) -> None:
    title = "Figures (medians of wall time, Python's start-up included)"
    print_figures(console, figures, labelled(members), title)
    table = Table(title="Targets")
    for column in ("command", "wall", "target", "result", "imports torch or Parsl"):
        table.add_column(column, justify="right" if column == "wall" else "left")
    for key, verdict in verdicts.items():
        style = "green" if verdict["result"] == "PASS" else "red"
        heavy = ", ".join(imported.get(key, [])) or "neither"
        table.add_row(
            verdict["label"].format(members=members),
            f"{verdict['value']:.3f} s",
            verdict["target"],
            f"[{style}]{verdict['result']}",
            f"[{'green' if heavy == 'neither' else 'red'}]{heavy}",
        )
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    parser, _ = options(__doc__, quick="members of 50 steps, 3 rounds", full="members of 1,000 steps, 15 rounds")
    parser.add_argument("--members", type=int, default=MEMBERS, help=f"members of the run (default {MEMBERS})")
    parser.add_argument("--json", type=Path, help="write every figure with its unit, and the verdicts")
    args = parser.parse_args(argv)
    name = size_of(args)
    steps, reps = MODES[name]["steps"], MODES[name]["reps"]
    if args.members < 50:
        parser.error("--members must be at least 50: the run mixes states by share")

    clock = Clock(console)
    root = Path(tempfile.mkdtemp(prefix="cli-startup-"))
    try:
        console.print(f"[dim]building a run of {args.members} members of {steps} steps in {root}")
        run_dir = build_run(root, args.members, steps)
        figures: dict[str, float] = {"run_bytes": directory_bytes(run_dir) / (1 << 20)}
        clock.phase(f"timing the commands, {reps} rounds")
        figures |= timings(run_dir, reps)
        imported = heavy_imports(run_dir)
        figures |= tracker_costs(run_dir)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    verdicts = checks(figures)
    print_report(figures, verdicts, imported, args.members)
    console.print(f"wall time {clock.elapsed():.1f} s; {os.cpu_count()} cores")
    if args.json:
        out = {
            "figures": with_units(figures, labelled(args.members)),
            "checks": verdicts,
            "imports": imported,
            "config": {"mode": name, "members": args.members, "steps": steps, "reps": reps, "mix": MIX},
        }
        write_json(args.json, out)


if __name__ == "__main__":
    main()
