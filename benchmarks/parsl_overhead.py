"""What our Parsl app costs against a bare Parsl ``python_app``, and how long a killed member takes to resume.

Everything runs on one loaded DataFlowKernel of the ``local`` site (one HighThroughputExecutor,
one worker per core, ``heartbeat_period`` 2 s), configured as the workflow runner configures it:
``retries=2`` and a :class:`~resilient_flows.apps.ResumingRetryHandler`. Tasks run one at a time.

Side by side (sections ``zero-step``, ``wide`` and ``narrow``)
    ``train_app`` (``run_member``: TrainContext, Checkpointer, restore, events, metrics, result
    file, weights digest) against ``bare_app``, a plain ``python_app`` defined here around
    :func:`bare_train`: the same built-in workload (``mlp-digits``: same model, data, seed,
    optimizer, batches and steps, same test-set evaluation in the result) written as a plain
    script would write it, with nothing of ours around it. Each figure is the time from calling
    the app to holding its result, in the benchmark process. Rounds alternate the order (ours
    first, then bare first) and the added cost is the median of the per-round differences; the
    two results must match exactly (``same_result``), which shows both did the same work.

    - ``zero-step``: ``steps=0``, a 1024-wide MLP: our fixed cost per task.
    - ``wide``: the 5-second task (``--quick``: 1 second), a 1024-wide MLP (about 7 ms a step,
      8.4 MiB of model and momentum), checkpointing every fifth of its steps (five checkpoints,
      the last at the final step, each waited for before the result). The step count is
      calibrated on a worker so that the bare loop takes the task's length.
    - ``narrow``: the same at the built-in defaults (64 wide, about 0.3 ms a step): many tiny
      steps, so this is where any cost per step shows. ``*_per_step`` spreads the added time that
      the zero-step task does not explain over the steps.

Kill to resume (section ``resume``)
    A 1024-wide member of 100 steps, checkpointing every 50, whose worker is SIGKILLed after step
    90 (``FaultSpec("kill", 90)``, the first attempt only). A thread here finds the worker's pid in
    the ``started`` event and notes when ``/proc/<pid>/stat`` stops saying it runs (falling back
    to the attempt's last metrics line, written just before the kill). From that moment:

    - ``detection`` (Parsl): until the retry handler records ``failed``. The worker pool's
      watchdog looks for dead workers every ``heartbeat_period``, so this is up to that period.
    - ``resubmission`` (Parsl, and our attempt bookkeeping): ``failed`` until attempt 2's
      ``started``: the retry, interchange, worker, unpickling, and the Checkpointer's
      construction and attempt count (both come before ``started``).
    - ``restore`` (ours): ``started`` until ``resumed``: what the workload does before its first
      step, i.e. building the model and optimizer, then ``Checkpointer.restore``.
    - ``first step``: ``resumed`` until attempt 2's first metrics line (one training step).

    After each kill both workers are warmed again (the watchdog replaces the dead one with a
    fresh process), and the attempts that resumed on a worker that had run nothing yet are
    counted (``resume_fresh_workers``): those pay imports in ``restore``.

Load alone (section ``load``), the baseline of ``restore``
    In this process with one torch thread, on the last kill run's checkpoint (same shapes):
    ``read_checkpoint`` alone; building the member's model and optimizer, reading the checkpoint
    and ``load_state_dict`` into both (the least any resume does: the target); and building them
    then ``Checkpointer.restore`` (our engine without the worker around it).

Workers import :func:`bare_train` from this module by name: the benchmark puts its own directory
on ``PYTHONPATH`` before Parsl starts the workers, and uses this file imported as
``parsl_overhead`` rather than as ``__main__`` so that functions travel by reference.

The machine has 2 cores shared with whatever else runs; every figure is a median, and the kill
figures are single events (detection is uniform over the heartbeat period), so they vary most.

Run ``python benchmarks/parsl_overhead.py [--quick | --full] [--reps N] [--json PATH]``:
``--quick`` uses 1-second tasks and 3 rounds (under a minute), the default 5-second tasks and 5
rounds (a few minutes), ``--full`` 5-second tasks and 11 rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import parsl
import torch
from parsl import python_app
from rich.console import Console
from rich.table import Table
from torch import nn

from resilient_flows.apps import ResumingRetryHandler, train_app
from resilient_flows.checkpoint import Checkpointer, TrainState, read_checkpoint
from resilient_flows.sites import load_site
from resilient_flows.training import CheckpointSpec, FaultSpec, MemberSpec, member_dir
from resilient_flows.training.events import read_events
from resilient_flows.training.workloads import _BUILDERS, _batch, _evaluate_model, _params, load_dataset

MiB = 1 << 20
BENCH_DIR = Path(__file__).resolve().parent
WORKLOAD = "mlp-digits"
WIDE = {"hidden": 1024}
NARROW: dict[str, Any] = {}  # the built-in defaults: 64 wide
CHECKPOINTS_PER_TASK = 5
KILL_STEPS, KILL_INTERVAL, KILL_AT = 100, 50, 90
MODES = {
    "quick": {"task_s": 1.0, "reps": 3},
    "default": {"task_s": 5.0, "reps": 5},
    "full": {"task_s": 5.0, "reps": 11},
}
ZERO_FACTOR = 3  # zero-step rounds per round of the long tasks: they are short and noisy
RETRIES = 2
console = Console()

#: key: (section, unit, label), in print order.
FIGURES = {
    "zero_ours": ("zero-step", "ms", "train_app, submit -> result"),
    "zero_bare": ("zero-step", "ms", "bare python_app, submit -> result"),
    "zero_added": ("zero-step", "ms", "added per task"),
    "wide_step": ("wide", "ms", "bare step (1024-wide MLP)"),
    "wide_steps": ("wide", "steps", "steps per task"),
    "wide_ours": ("wide", "s", "train_app, submit -> result"),
    "wide_bare": ("wide", "s", "bare python_app, submit -> result"),
    "wide_added_s": ("wide", "s", "added per task"),
    "wide_added": ("wide", "%", "added per task"),
    "wide_per_step": ("wide", "us", "added per step (beyond the zero-step cost)"),
    "narrow_step": ("narrow", "ms", "bare step (64-wide MLP, built-in defaults)"),
    "narrow_steps": ("narrow", "steps", "steps per task"),
    "narrow_ours": ("narrow", "s", "train_app, submit -> result"),
    "narrow_bare": ("narrow", "s", "bare python_app, submit -> result"),
    "narrow_added_s": ("narrow", "s", "added per task"),
    "narrow_added": ("narrow", "%", "added per task"),
    "narrow_per_step": ("narrow", "us", "added per step (beyond the zero-step cost)"),
    "heartbeat_period": ("resume", "s", "Parsl heartbeat_period (watchdog interval)"),
    "detection": ("resume", "s", "kill -> failed (Parsl detection)"),
    "resubmission": ("resume", "s", "failed -> started (Parsl resubmission)"),
    "restore": ("resume", "ms", "started -> resumed (our restore)"),
    "first_step": ("resume", "ms", "resumed -> first new step logged"),
    "kill_to_step": ("resume", "s", "kill -> first new step"),
    "resume_fresh_workers": ("resume", "runs", "resumed on a worker that had run nothing"),
    "checkpoint_bytes": ("load", "MiB", "checkpoint (model + momentum)"),
    "load_read": ("load", "ms", "read_checkpoint alone"),
    "load_build": ("load", "ms", "build model + optimizer"),
    "load_alone": ("load", "ms", "build + read_checkpoint + load_state_dict"),
    "load_engine": ("load", "ms", "build + Checkpointer.restore"),
}
#: label, ours, baseline, how "added" is shown ("diff" in ours' unit, "pct", "ratio"), the figure
#: it is judged by, op, target (None: for information).
ROWS = [
    ("zero-step task, submit -> result", "zero_ours", "zero_bare", "diff", "zero_added", "<", 50.0),
    ("5-s task, 1024-wide MLP", "wide_ours", "wide_bare", "pct", "wide_added", "<", 2.0),
    ("5-s task, 64-wide MLP (tiny steps)", "narrow_ours", "narrow_bare", "pct", "narrow_added", "<", 2.0),
    ("resume: restore / load alone", "restore", "load_alone", "ratio", "restore_ratio", "<=", 1.0),
    ("resume: detection (Parsl)", "detection", None, None, None, None, None),
    ("resume: resubmission (Parsl)", "resubmission", None, None, None, None, None),
    ("resume: first new step / bare step", "first_step", "wide_step", "ratio", None, None, None),
    ("resume: kill -> first new step", "kill_to_step", None, None, None, None, None),
]


# ---------------------------------------------------------------------- what the workers run


def bare_train(workload: str, params: dict[str, Any], seed: int, steps: int, threads: int) -> dict[str, Any]:
    """The built-in workload's training as a plain script has it: no context, checkpoint, event or metric."""
    torch.set_num_threads(threads)
    build, dataset = _BUILDERS[workload]
    p = _params(params)
    data = load_dataset(dataset)
    torch.manual_seed(seed)
    model = build(data, p)
    optimizer = torch.optim.SGD(model.parameters(), lr=p["lr"], momentum=p["momentum"], weight_decay=p["weight_decay"])
    model.train()
    start, last = time.perf_counter(), None
    for step in range(steps):
        index = _batch(seed, step, len(data.x_train), int(p["batch_size"]))
        loss = nn.functional.cross_entropy(model(data.x_train[index]), data.y_train[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        last = loss.item()
    loop_s = time.perf_counter() - start
    return {"loss": last, "loop_s": loop_s, "pid": os.getpid(), **_evaluate_model(model, data)}


@python_app
def bare_app(workload: str, params: dict[str, Any], seed: int, steps: int, threads: int) -> dict[str, Any]:
    """The baseline: Parsl's own python_app around the same training, as ``train_app`` wraps ``run_member``."""
    return bare_train(workload, params, seed, steps, threads)


@python_app
def warm_app(seconds: float) -> int:
    """Import and touch what the tasks use (torch, the data set, our modules), hold the worker; its pid."""
    import resilient_flows.training  # noqa: F401  (what train_app's worker side imports)

    pid = bare_train(WORKLOAD, WIDE, 0, 5, 1)["pid"]
    time.sleep(seconds)
    return pid


# ---------------------------------------------------------------------- measurements


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def warm_workers(workers: int, tries: int = 8) -> set[int]:
    """Give every worker a warm-up task at once; the pids of the workers that ran one."""
    pids: set[int] = set()
    for _ in range(tries):
        pids = {f.result(timeout=300) for f in [warm_app(0.5) for _ in range(workers)]}
        if len(pids) == workers:
            break
    return pids


def calibrate(params: dict[str, Any], steps: int) -> float:
    """Seconds per bare step on a worker: the second of two runs."""
    loops = [bare_app(WORKLOAD, params, 0, steps, 1).result(timeout=300)["loop_s"] for _ in range(2)]
    return loops[-1] / steps


def side_by_side(root: Path, label: str, params: dict[str, Any], steps: int, reps: int) -> tuple[dict, bool]:
    """``train_app`` and ``bare_app`` on the same task, alternately; medians, and whether results matched."""
    interval = max(1, steps // CHECKPOINTS_PER_TASK)
    ours, bare, same = [], [], True
    for i in range(reps):
        spec = MemberSpec(
            f"{label}-{i}", WORKLOAD, params, steps=steps, checkpoint=CheckpointSpec(interval_steps=interval)
        )

        def run_ours(spec: MemberSpec = spec) -> tuple[float, Any]:
            return timed(lambda: train_app(spec.to_dict(), str(root)).result(timeout=600))

        def run_bare() -> tuple[float, Any]:
            return timed(lambda: bare_app(WORKLOAD, params, 0, steps, 1).result(timeout=600))

        if i % 2 == 0:
            (t_ours, r_ours), (t_bare, r_bare) = run_ours(), run_bare()
        else:
            (t_bare, r_bare), (t_ours, r_ours) = run_bare(), run_ours()
        ours.append(t_ours)
        bare.append(t_bare)
        same &= r_ours["test_loss"] == r_bare["test_loss"] and r_ours.get("loss") == r_bare["loss"]
    added = [o - b for o, b in zip(ours, bare, strict=True)]
    pct = [100 * (o / b - 1) for o, b in zip(ours, bare, strict=True)]
    figures = {
        "ours": statistics.median(ours),
        "bare": statistics.median(bare),
        "added_s": statistics.median(added),
        "added": statistics.median(pct),
    }
    return figures, same


class DeathWatch(threading.Thread):
    """Finds attempt 1's worker in ``events.jsonl`` and notes (wall clock) when its process stops running."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.pid: int | None = None
        self.died: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while self.pid is None and not self.done.wait(0.002):
            for event in read_events(self.run_dir):
                if event["kind"] == "started" and event.get("attempt") == 1:
                    self.pid = int(event["pid"])
        while self.pid is not None and not self.done.is_set():
            if not _running(self.pid):
                self.died = time.time()
                return
            time.sleep(0.0005)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: the watchdog reaps it only at its next look)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def kill_once(run_dir: Path, warm: set[int]) -> dict[str, Any] | None:
    """One member killed after step KILL_AT and resumed by the retry; its timeline, or None if it did not resume."""
    run_dir.mkdir(parents=True)
    spec = MemberSpec(
        "killed",
        WORKLOAD,
        WIDE,
        steps=KILL_STEPS,
        checkpoint=CheckpointSpec(interval_steps=KILL_INTERVAL),
        faults=(FaultSpec("kill", KILL_AT),),
    )
    watch = DeathWatch(run_dir)
    watch.start()
    try:
        train_app(spec.to_dict(), str(run_dir)).result(timeout=600)
    finally:
        watch.done.set()
        watch.join()
    events = list(read_events(run_dir))
    lines = (member_dir(run_dir, spec.name) / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines if line.strip()]

    def event(kind: str, attempt: int | None = None) -> dict[str, Any] | None:
        found = [e for e in events if e["kind"] == kind and (attempt is None or e.get("attempt") == attempt)]
        return found[0] if found else None

    failed, started, resumed = event("failed"), event("started", 2), event("resumed", 2)
    first = [m for m in metrics if m["attempt"] == 1]
    second = [m for m in metrics if m["attempt"] == 2]
    if None in (failed, started, resumed) or not first or not second:
        return None
    last_logged = max(m["time"] for m in first)
    kill = watch.died if watch.died is not None else last_logged
    first_new = min(m["time"] for m in second)
    return {
        "kill_time_from": "process" if watch.died is not None else "last metrics line",
        "logged_to_kill_s": kill - last_logged,
        "detection": failed["time"] - kill,
        "resubmission": started["time"] - failed["time"],
        "restore": resumed["time"] - started["time"],
        "first_step": first_new - resumed["time"],
        "kill_to_step": first_new - kill,
        "killed_after_step": max(m["step"] for m in first),
        "resumed_step": resumed["step"],
        "fresh_worker": started["pid"] not in warm,
        "cause": failed.get("cause"),
    }


def measure_resumes(root: Path, reps: int, workers: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    timelines, warm = [], warm_workers(workers)
    for i in range(reps):
        timeline = kill_once(root / f"kill-{i}", warm)
        if timeline is None:
            console.print(f"[yellow]kill run {i}: the member did not resume from a checkpoint; left out")
        else:
            timelines.append(timeline)
        warm = warm_workers(workers)  # the watchdog replaced the killed worker with a fresh one
    if not timelines:
        return {}, []
    figures = {k: statistics.median(t[k] for t in timelines) for k in ("detection", "resubmission", "kill_to_step")}
    figures |= {k: 1000 * statistics.median(t[k] for t in timelines) for k in ("restore", "first_step")}
    figures["resume_fresh_workers"] = sum(t["fresh_worker"] for t in timelines)
    return figures, timelines


def measure_loads(directory: Path, reps: int) -> dict[str, float]:
    """Loading the checkpoint a resume restores, in this process with one thread, three ways."""
    torch.set_num_threads(1)
    build, dataset = _BUILDERS[WORKLOAD]
    data, p = load_dataset(dataset), _params(WIDE)

    def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = build(data, p)
        opt = torch.optim.SGD(model.parameters(), lr=p["lr"], momentum=p["momentum"], weight_decay=p["weight_decay"])
        return model, opt

    def load_alone() -> None:
        model, opt = fresh()
        _, state = read_checkpoint(directory)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])

    ck = Checkpointer(directory)  # constructed before "started" in a resume too

    def engine() -> None:
        model, opt = fresh()
        ck.restore(TrainState(model, opt))

    rows = []
    try:
        for _ in range(reps + 1):
            rows.append(
                {
                    "load_read": timed(lambda: read_checkpoint(directory))[0],
                    "load_build": timed(fresh)[0],
                    "load_alone": timed(load_alone)[0],
                    "load_engine": timed(engine)[0],
                }
            )
    finally:
        ck.close()
    figures = {k: 1000 * statistics.median(row[k] for row in rows[1:]) for k in rows[0]}
    _, state = read_checkpoint(directory)
    tensors = [*state["model"].values(), *(v for s in state["optimizer"]["state"].values() for v in s.values())]
    figures["checkpoint_bytes"] = sum(t.numel() * t.element_size() for t in tensors) / MiB
    return figures


# ---------------------------------------------------------------------- report


def checks(figures: dict[str, float]) -> dict[str, dict[str, Any]]:
    if "restore" in figures and "load_alone" in figures:
        figures["restore_ratio"] = figures["restore"] / figures["load_alone"]
    result = {}
    for label, _, _, _, judged, op, target in ROWS:
        if target is None or judged not in figures:
            continue
        value = figures[judged]
        ok = value < target if op == "<" else value <= target
        result[judged] = {
            "label": label,
            "value": value,
            "target": f"{op} {target:g}",
            "result": "PASS" if ok else "FAIL",
        }
    return result


def print_report(figures: dict[str, float], verdicts: dict[str, dict[str, Any]]) -> None:
    table = Table(title="Figures (medians)")
    for column in ("section", "quantity", "value", "unit"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for key, (section, unit, label) in FIGURES.items():
        if key in figures:
            table.add_row(section, label, f"{figures[key]:.4g}", unit)
    console.print(table)
    table = Table(title="Ours against bare Parsl")
    for column in ("figure", "ours", "baseline", "added", "target", "result"):
        table.add_column(column, justify="right" if column in ("ours", "baseline", "added") else "left")
    for label, ours, base, shown, judged, op, target in ROWS:
        if ours not in figures:
            continue
        unit = FIGURES[ours][1]
        cells = [label, f"{figures[ours]:.4g} {unit}", "", "", "", ""]
        if base is not None and base in figures:
            cells[2] = f"{figures[base]:.4g} {FIGURES[base][1]}"
            if shown == "diff":
                cells[3] = f"+{figures[judged]:.3g} {unit}"
            elif shown == "pct":
                cells[3] = f"+{figures[judged]:.3g} %"
            else:
                cells[3] = f"x {figures[ours] / figures[base]:.3g}"
        if target is None:
            cells[4] = "(information)"
        elif judged in verdicts:
            verdict = verdicts[judged]["result"]
            style = "green" if verdict == "PASS" else "red"
            cells[4] = f"{op} {target:g}" + (" ms" if shown == "diff" else " %" if shown == "pct" else "")
            cells[5] = f"[{style}]{verdict}"
        table.add_row(*cells)
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="1-second tasks, 3 rounds: under a minute")
    mode.add_argument("--full", action="store_true", help=f"5-second tasks, {MODES['full']['reps']} rounds")
    parser.add_argument("--reps", type=int, help="rounds per median, >= 3 (default 5, quick 3)")
    parser.add_argument("--dir", type=Path, help="working directory (default: a temporary one in ./bench-results)")
    parser.add_argument(
        "--json", type=Path, help="write every figure with its unit, the verdicts and the kill timelines"
    )
    args = parser.parse_args(argv)
    settings = MODES["quick" if args.quick else "full" if args.full else "default"]
    task_s, reps = settings["task_s"], args.reps or settings["reps"]
    if reps < 3:
        parser.error("--reps must be at least 3")

    started = time.perf_counter()
    # Workers import bare_train from this module, by name: they inherit this environment.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")]))
    base = args.dir or Path.cwd() / "bench-results"
    made_base = not base.exists()
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="parsl-overhead-", dir=base))
    config = load_site(
        "local", run_dir=str(root / "parsl"), retries=RETRIES, retry_handler=ResumingRetryHandler(RETRIES)
    )
    figures: dict[str, float] = {"heartbeat_period": float(config.executors[0].heartbeat_period)}
    same: dict[str, bool] = {}
    timelines: list[dict[str, Any]] = []

    def phase(name: str) -> None:
        console.print(f"[dim]{time.perf_counter() - started:5.0f} s: {name}")

    try:
        with parsl.load(config) as dfk:
            workers = int(dfk.executors[config.executors[0].label].workers_per_node)
            phase(f"warming {workers} workers, calibrating steps for {task_s:g}-second tasks")
            warm_workers(workers)
            steps = {}
            for label, params, probe in (("wide", WIDE, 100), ("narrow", NARROW, 1000)):
                per_step = calibrate(params, probe)
                figures[f"{label}_step"] = 1000 * per_step
                steps[label] = max(CHECKPOINTS_PER_TASK, round(task_s / per_step / CHECKPOINTS_PER_TASK))
                steps[label] *= CHECKPOINTS_PER_TASK
                figures[f"{label}_steps"] = steps[label]
            phase(f"zero-step tasks, {ZERO_FACTOR * reps} rounds")
            zero, same["zero-step"] = side_by_side(root / "tasks", "zero", WIDE, 0, ZERO_FACTOR * reps)
            figures |= {"zero_ours": 1000 * zero["ours"], "zero_bare": 1000 * zero["bare"]}
            figures["zero_added"] = 1000 * zero["added_s"]
            for label, params in (("wide", WIDE), ("narrow", NARROW)):
                phase(f"{task_s:g}-second tasks, {label} MLP ({steps[label]} steps), {reps} rounds")
                long, same[label] = side_by_side(root / "tasks", label, params, steps[label], reps)
                figures |= {f"{label}_{k}": v for k, v in long.items()}
                figures[f"{label}_per_step"] = 1e6 * (long["added_s"] - zero["added_s"]) / steps[label]
            phase(f"kill -> resume, {reps} kills")
            resumes, timelines = measure_resumes(root / "kills", reps, workers)
            figures |= resumes
        phase("loading the checkpoint alone")
        if timelines:
            figures |= measure_loads(
                member_dir(root / "kills" / f"kill-{reps - 1}", "killed") / "checkpoints", 3 * reps
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if made_base:
            with contextlib.suppress(OSError):  # another run may be using it
                base.rmdir()
    verdicts = checks(figures)
    print_report(figures, verdicts)
    wall = time.perf_counter() - started
    fresh = int(figures.get("resume_fresh_workers", 0))
    console.print(
        f"wall time {wall:.1f} s; {reps} rounds ({ZERO_FACTOR * reps} zero-step), {len(timelines)} kills resumed"
        f" ({fresh} on a fresh worker); results identical, ours vs bare: "
        + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items())
    )
    if args.json:
        config_out = {
            "mode": "quick" if args.quick else "full" if args.full else "default",
            "task_s": task_s,
            "reps": reps,
            "zero_reps": ZERO_FACTOR * reps,
            "workload": WORKLOAD,
            "wide_params": WIDE,
            "narrow_params": NARROW,
            "checkpoints_per_task": CHECKPOINTS_PER_TASK,
            "kill": {"steps": KILL_STEPS, "interval_steps": KILL_INTERVAL, "at_step": KILL_AT},
            "retries": RETRIES,
            "same_result": same,
            "wall_s": wall,
            "parsl": parsl.__version__,
            "torch": torch.__version__,
            "cpus": len(os.sched_getaffinity(0)),
        }
        units = {
            key: {"value": v, "unit": FIGURES[key][1], "label": FIGURES[key][2]}
            for key, v in figures.items()
            if key in FIGURES
        }
        if "restore_ratio" in figures:
            units["restore_ratio"] = {
                "value": figures["restore_ratio"],
                "unit": "ratio",
                "label": "restore / load alone",
            }
        out = {"figures": units, "checks": verdicts, "kills": timelines, "config": config_out}
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    # Run as the module ``parsl_overhead`` (not ``__main__``) so that Parsl sends its functions by name.
    sys.path.insert(0, str(BENCH_DIR))
    importlib.import_module("parsl_overhead").main()
