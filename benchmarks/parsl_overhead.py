"""What our Parsl app costs against a bare Parsl ``python_app``, and how long a killed member takes to resume.

Everything runs on one loaded DataFlowKernel of the ``local`` site (one HighThroughputExecutor,
one worker per core, ``heartbeat_period`` 1 s), configured as the workflow runner configures it:
``retries=2`` and a :class:`~resilient_flows.apps.ResumingRetryHandler`. Tasks run one at a time,
after every worker has run a warm-up task (torch, the data set and our modules imported).

Side by side (sections ``zero-step``, ``wide`` and ``narrow``)
    ``train_app`` (``run_member``: TrainContext, Checkpointer, restore, events, metrics, result
    file, weights digest) against ``bare_app``, a plain ``python_app`` defined here around
    :func:`bare_train`: the same built-in workload (``mlp-digits``: same model, data, seed,
    optimizer, batches and steps, the same test-set evaluation in its result) written as a plain
    script would have it, with nothing of ours around it. Each figure is the time from calling
    the app to holding its result, in this process. Rounds alternate the order (ours first, then
    bare first); the added cost is the median of the per-round differences (``spread``: their
    median absolute deviation). Results must match exactly (``same results``): both did the
    same work.

    - ``zero-step``: ``steps=0``, a 1024-wide MLP: our fixed cost per task, three times as many
      rounds as the others.
    - ``wide``: the 5-second task (``--quick``: 1 second), a 1024-wide MLP (about 7 ms a step,
      8.6 MiB of weights and momentum), checkpointing every fifth of its steps: five checkpoints,
      the last at the final step, which ``train_app`` waits for before it returns. The step count
      is calibrated on a worker (the faster of two short bare runs) so that the bare loop takes
      about the task's length.
    - ``narrow``: the same at the built-in defaults (64 wide, about 0.3 ms a step): many tiny
      steps, where any cost per step shows.

    The added time that the zero-step task does not explain is spread over the wide task's
    checkpoints (``wide_per_checkpoint``, an upper bound: the steps' own cost is in it too) and
    over the narrow task's steps (``narrow_per_step``: its checkpoints are 70 KiB). From our
    members' own records: how long ``save`` blocked (``wide_stall``, the ``checkpointed``
    events), and the time from the last step's metrics line to ``finished`` (``*_tail``: waiting
    for the final checkpoint's commit and fsync, the evaluation both do, the weights' digest and
    the result file).

Kill to resume (section ``resume``)
    A 1024-wide member of 100 steps, checkpointing every 50, whose worker is SIGKILLed after step
    90 (``FaultSpec("kill", 90)``, first attempt only). A thread here finds the worker's pid in
    the ``started`` event and notes when ``/proc/<pid>/stat`` stops saying it runs (falling back
    to the attempt's last metrics line, written just before the kill). From that moment:

    - ``detection`` (Parsl): until the retry handler records ``failed``. The worker pool's
      watchdog looks for dead workers every ``heartbeat_period``, so this is anywhere in 0-1 s.
    - ``resubmission`` (Parsl, and our bookkeeping): ``failed`` until attempt 2's ``started``:
      the retry, interchange, worker, unpickling, and the Checkpointer's construction and the
      attempt count (both come before ``started``).
    - ``restore`` (ours): ``started`` until ``resumed``: what happens before the first step,
      i.e. building the model and optimizer, then ``Checkpointer.restore`` of the step-49
      checkpoint.
    - ``first step``: ``resumed`` until attempt 2's first metrics line (one training step).

    The watchdog replaces the dead worker with a fresh process at the moment it reports the loss,
    so on a small machine that process's start-up competes with the resume. Section ``control``
    therefore precedes each kill with the same member failing by an exception at the same step
    (``FaultSpec("error", 90)``), which Parsl retries without replacing a worker. Both workers are
    warmed again after every kill but the last; ``fresh_workers`` counts resumes that still landed
    on a worker that had run nothing (they would pay imports inside ``restore``).

Load alone (section ``load``), the baseline of ``restore``
    The least a resume does, as a plain ``python_app`` timed inside the worker: build the
    member's model and optimizer, ``read_checkpoint``, ``load_state_dict`` into both. It runs on
    each resumed member's final checkpoint (the same shapes) right after the member returns, so
    that it starts as the resumed attempt did: on a warm worker, just after another task, which
    on this machine is measurably slower than a loop in a process that keeps the CPU. Section
    ``in-process`` repeats the load in this process (one torch thread, medians of ``3 x rounds``
    after one discarded), beside ``read_checkpoint`` alone, the build alone and our engine's
    ``Checkpointer.restore``: engine against plain reader with nothing else in the way.

Parsl ships both apps alike (their functions pickled by value, the globals they use by their
module's name: about 2.3 KB each), so workers import this module by name, as they import
``resilient_flows.apps`` for ``train_app``: the benchmark puts its own directory on
``PYTHONPATH`` before Parsl starts the workers, and runs this file imported as ``parsl_overhead``
rather than as ``__main__``.

The machine this was written on has 2 cores shared with other work: every figure is a median,
and the ``spread`` figures say how far single rounds stray, which bounds what a 2 % target can
resolve. The resume figures are single events per round and vary most.

Run ``python benchmarks/parsl_overhead.py [--quick | --full] [--reps N] [--json PATH]``:
``--quick``: 1-second tasks, 3 rounds and 2 kills (under a minute); default: 5-second tasks, 7
rounds and 5 kills (a few minutes); ``--full``: 15 rounds and 11 kills. Starting the workers
(Parsl and torch imported in each) takes about 10 s of any run.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import parsl
import torch
from harness import Clock, options, rounds, scratch, size_of, spread, with_units, write_json
from parsl import python_app
from report import print_figures
from rich.table import Table
from torch import nn

from resilient_flows.apps import ResumingRetryHandler, train_app
from resilient_flows.checkpoint import CheckpointConfig, Checkpointer, TrainState, read_checkpoint
from resilient_flows.rundir import member_dir
from resilient_flows.rundir._events import read_events
from resilient_flows.sites import load_site
from resilient_flows.training import FaultSpec, MemberSpec
from resilient_flows.training._workloads import batch_indices, builtin_model, evaluate_model

MiB = 1 << 20
BENCH_DIR = Path(__file__).resolve().parent
WORKLOAD = "mlp-digits"
WIDE = {"hidden": 1024}
NARROW: dict[str, Any] = {}  # the built-in defaults: 64 wide
CHECKPOINTS_PER_TASK = 5
KILL_STEPS, KILL_INTERVAL, KILL_AT = 100, 50, 90
MODES = {  # length of the long tasks, rounds of them; rounds of kill and exception resumes
    "quick": {"task_s": 1.0, "reps": 3, "resumes": 2},
    "default": {"task_s": 5.0, "reps": 7, "resumes": 5},
    "full": {"task_s": 5.0, "reps": 15, "resumes": 11},
}
ZERO_FACTOR = 3  # zero-step rounds per round of the long tasks: they are short and noisy
RETRIES = 2
console = harness.console()

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
    "wide_spread": ("wide", "%", "  spread of that over rounds (MAD)"),
    "wide_per_checkpoint": ("wide", "ms", "added per checkpoint, beyond the zero-step cost"),
    "wide_stall": ("wide", "ms", "  of which save() blocked training"),
    "wide_tail": ("wide", "ms", "last step -> finished (final commit, digest)"),
    "narrow_step": ("narrow", "ms", "bare step (64-wide MLP, built-in defaults)"),
    "narrow_steps": ("narrow", "steps", "steps per task"),
    "narrow_ours": ("narrow", "s", "train_app, submit -> result"),
    "narrow_bare": ("narrow", "s", "bare python_app, submit -> result"),
    "narrow_added_s": ("narrow", "s", "added per task"),
    "narrow_added": ("narrow", "%", "added per task"),
    "narrow_spread": ("narrow", "%", "  spread of that over rounds (MAD)"),
    "narrow_per_step": ("narrow", "us", "added per step, beyond the zero-step cost"),
    "narrow_tail": ("narrow", "ms", "last step -> finished (final commit, digest)"),
    "heartbeat_period": ("resume", "s", "Parsl heartbeat_period (watchdog interval)"),
    "detection": ("resume", "s", "kill -> failed (Parsl detection)"),
    "resubmission": ("resume", "s", "failed -> started (Parsl resubmission)"),
    "restore": ("resume", "ms", "started -> resumed (our restore)"),
    "first_step": ("resume", "ms", "resumed -> first new step logged"),
    "fault_to_step": ("resume", "s", "kill -> first new step"),
    "fresh_workers": ("resume", "runs", "resumed on a worker that had run nothing"),
    "error_detection": ("control", "s", "exception -> failed"),
    "error_resubmission": ("control", "s", "failed -> started"),
    "error_restore": ("control", "ms", "started -> resumed (no worker replaced)"),
    "error_first_step": ("control", "ms", "resumed -> first new step logged"),
    "error_fault_to_step": ("control", "s", "exception -> first new step"),
    "error_fresh_workers": ("control", "runs", "resumed on a worker that had run nothing"),
    "checkpoint_bytes": ("load", "MiB", "checkpoint (model + momentum)"),
    "load_alone": ("load", "ms", "build + read_checkpoint + load_state_dict (task)"),
    "local_read": ("in-process", "ms", "read_checkpoint alone"),
    "local_build": ("in-process", "ms", "build model + optimizer"),
    "local_load": ("in-process", "ms", "build + read_checkpoint + load_state_dict"),
    "local_engine": ("in-process", "ms", "build + Checkpointer.restore"),
}
#: label ({task}: the long task's length), ours, baseline, how "added" is shown ("diff" in ours'
#: unit, "pct", "ratio"), the figure it is judged by, op, target (None: for information).
ROWS = [
    ("zero-step task", "zero_ours", "zero_bare", "diff", "zero_added", "<", 50.0),
    ("{task} task, 1024 wide", "wide_ours", "wide_bare", "pct", "wide_added", "<", 2.0),
    ("{task} task, 64 wide", "narrow_ours", "narrow_bare", "pct", "narrow_added", "<", 2.0),
    ("restore in a resume", "restore", "load_alone", "ratio", "restore_ratio", "<=", 1.0),
    ("  same, after an exception", "error_restore", "load_alone", "ratio", None, None, None),
    ("  both in-process: engine / load", "local_engine", "local_load", "ratio", None, None, None),
    ("detection (Parsl)", "detection", None, None, None, None, None),
    ("resubmission (Parsl)", "resubmission", None, None, None, None, None),
    ("first new step", "first_step", "wide_step", "ratio", None, None, None),
    ("kill -> first new step", "fault_to_step", None, None, None, None, None),
]


# ---------------------------------------------------------------------- what the workers run


def bare_train(workload: str, params: dict[str, Any], seed: int, steps: int, threads: int) -> dict[str, Any]:
    """The built-in workload's training as a plain script has it: no context, checkpoint, event or metric."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model, data, p = builtin_model(workload, params)
    optimizer = torch.optim.SGD(model.parameters(), lr=p["lr"], momentum=p["momentum"], weight_decay=p["weight_decay"])
    model.train()
    start, last = time.perf_counter(), None
    for step in range(steps):
        index = batch_indices(seed, step, len(data.x_train), int(p["batch_size"]))
        loss = nn.functional.cross_entropy(model(data.x_train[index]), data.y_train[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        last = loss.item()
    loop_s = time.perf_counter() - start
    return {"loss": last, "loop_s": loop_s, "pid": os.getpid(), **evaluate_model(model, data)}


@python_app
def bare_app(workload: str, params: dict[str, Any], seed: int, steps: int, threads: int) -> dict[str, Any]:
    """The baseline: Parsl's own python_app around the same training, as ``train_app`` wraps ``run_member``."""
    return bare_train(workload, params, seed, steps, threads)


def fresh_member(params: dict[str, Any]) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A built-in member's model and optimizer before any step, as its workload builds them."""
    torch.manual_seed(0)
    model, _, p = builtin_model(WORKLOAD, params)
    optimizer = torch.optim.SGD(model.parameters(), lr=p["lr"], momentum=p["momentum"], weight_decay=p["weight_decay"])
    return model, optimizer


def load_alone(directory: str | Path, params: dict[str, Any]) -> None:
    """The least a resume does: build the model and optimizer, read the checkpoint, load both."""
    model, optimizer = fresh_member(params)
    _, state = read_checkpoint(directory)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


@python_app
def load_app(directory: str, params: dict[str, Any], threads: int) -> tuple[float, int]:
    """:func:`load_alone` as a task, timed inside the worker: the baseline of a resume's restore; and the pid."""
    torch.set_num_threads(threads)
    builtin_model(WORKLOAD, {})  # its dataset is cached on a warm worker, as for the resumed member
    start = time.perf_counter()
    load_alone(directory, params)
    return time.perf_counter() - start, os.getpid()


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
        pids = {f.result(timeout=300) for f in [warm_app(0.3) for _ in range(workers)]}
        if len(pids) == workers:
            break
    return pids


def calibrate(params: dict[str, Any], steps: int) -> float:
    """Seconds per bare step on a warm worker: the faster of two runs."""
    loops = [bare_app(WORKLOAD, params, 0, steps, 1).result(timeout=300)["loop_s"] for _ in range(2)]
    return min(loops) / steps


def side_by_side(root: Path, label: str, params: dict[str, Any], steps: int, reps: int) -> tuple[dict, bool]:
    """``train_app`` and ``bare_app`` on the same task, alternately; medians, and whether results matched."""
    interval = max(1, steps // CHECKPOINTS_PER_TASK)
    ours, bare, same = [], [], True
    for i in range(reps):
        spec = MemberSpec(
            f"{label}-{i}", WORKLOAD, params, steps=steps, checkpoint=CheckpointConfig(interval_steps=interval)
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
    middle = statistics.median(pct)
    figures = {
        "ours": statistics.median(ours),
        "bare": statistics.median(bare),
        "added_s": statistics.median(added),
        "added": middle,
        "spread": spread(pct, middle),
    }
    return figures, same


def member_costs(run_dir: Path, label: str) -> dict[str, float]:
    """From the side-by-side members' records: median checkpoint stall, and last step -> finished."""
    stalls, tails, finished = [], [], {}
    for event in read_events(run_dir):
        if event["member"] is None or not event["member"].startswith(f"{label}-"):
            continue
        if event["kind"] == "checkpointed":
            stalls.append(event["stall_ms"])
        elif event["kind"] == "finished":
            finished[event["member"]] = event["time"]
    for name, end in finished.items():
        lines = (member_dir(run_dir, name) / "metrics.jsonl").read_text().splitlines()
        if lines:
            tails.append(end - json.loads(lines[-1])["time"])
    figures = {"stall": statistics.median(stalls)} if stalls else {}
    return figures | ({"tail": 1000 * statistics.median(tails)} if tails else {})


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


def resume_once(run_dir: Path, warm: set[int], kind: str) -> dict[str, Any] | None:
    """One member failed after step KILL_AT (``kind``: kill, error) and resumed by the retry; its timeline.

    None if it did not resume from a checkpoint.
    """
    run_dir.mkdir(parents=True)
    spec = MemberSpec(
        kind,
        WORKLOAD,
        WIDE,
        steps=KILL_STEPS,
        checkpoint=CheckpointConfig(interval_steps=KILL_INTERVAL),
        faults=(FaultSpec(kind, KILL_AT),),
    )
    watch = DeathWatch(run_dir)
    if kind == "kill":
        watch.start()
    try:
        train_app(spec.to_dict(), str(run_dir)).result(timeout=600)
    finally:
        if kind == "kill":
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
    if failed is None or started is None or resumed is None or not first or not second:
        return None
    last_logged = max(m["time"] for m in first)
    fault = watch.died if watch.died is not None else last_logged
    first_new = min(m["time"] for m in second)
    return {
        "fault": kind,
        "fault_time_from": "process" if watch.died is not None else "last metrics line",
        "logged_to_fault_s": fault - last_logged,
        "detection": failed["time"] - fault,
        "resubmission": started["time"] - failed["time"],
        "restore": resumed["time"] - started["time"],
        "first_step": first_new - resumed["time"],
        "fault_to_step": first_new - fault,
        "failed_after_step": max(m["step"] for m in first),
        "resumed_step": resumed["step"],
        "fresh_worker": started["pid"] not in warm,
        "cause": failed.get("cause"),
    }


def measure_resumes(root: Path, reps: int, workers: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Kills, each after the same member failing with an exception instead (no worker replaced).

    Right after each resumed member returns, a task loads its final checkpoint alone (the baseline),
    so that it starts as the resumed attempt did: on a warm worker, just after another task. Loads
    that ran on the fresh worker which replaced a killed one are left out.
    """
    timelines, loads, warm = [], [], warm_workers(workers)
    for i in range(reps):
        for kind in ("error", "kill"):
            timeline = resume_once(root / f"{kind}-{i}", warm, kind)
            checkpoints = member_dir(root / f"{kind}-{i}", kind) / "checkpoints"
            seconds, pid = load_app(str(checkpoints), WIDE, 1).result(timeout=300)
            if pid in warm:  # after a kill it may land on the fresh worker instead, which is not warm
                loads.append(seconds)
            if timeline is None:
                console.print(f"[yellow]{kind} run {i}: the member did not resume from a checkpoint; left out")
            else:
                timelines.append(timeline)
            if kind == "kill" and i < reps - 1:
                warm = warm_workers(workers)  # the watchdog replaced the killed worker with a fresh one
    figures: dict[str, float] = {"load_alone": 1000 * statistics.median(loads)}
    for kind, prefix in (("kill", ""), ("error", "error_")):
        runs = [t for t in timelines if t["fault"] == kind]
        if not runs:
            continue
        for key, scale in (("detection", 1), ("resubmission", 1), ("fault_to_step", 1), ("restore", 1000)):
            figures[prefix + key] = scale * statistics.median(t[key] for t in runs)
        figures[prefix + "first_step"] = 1000 * statistics.median(t["first_step"] for t in runs)
        figures[prefix + "fresh_workers"] = sum(t["fresh_worker"] for t in runs)
    return figures, timelines


def measure_local_loads(directory: Path, reps: int) -> dict[str, float]:
    """Loading the checkpoint a resume restores, in this process with one thread: plain and with our engine."""
    torch.set_num_threads(1)
    ck = Checkpointer(directory)  # constructed before "started" in a resume too

    def engine() -> None:
        model, optimizer = fresh_member(WIDE)
        ck.restore(TrainState(model, optimizer))

    def one_round() -> dict[str, float]:
        return {
            "local_read": timed(lambda: read_checkpoint(directory))[0],
            "local_build": timed(lambda: fresh_member(WIDE))[0],
            "local_load": timed(lambda: load_alone(directory, WIDE))[0],
            "local_engine": timed(engine)[0],
        }

    try:
        figures = {k: 1000 * v for k, v in rounds(reps, one_round, warmup=1).items()}
    finally:
        ck.close()
    _, state = read_checkpoint(directory)
    tensors = [*state["model"].values(), *(v for s in state["optimizer"]["state"].values() for v in s.values())]
    figures["checkpoint_bytes"] = sum(t.numel() * t.element_size() for t in tensors) / MiB
    return figures


# ---------------------------------------------------------------------- report


def checks(figures: dict[str, float], task: str) -> dict[str, dict[str, Any]]:
    """Every target of ROWS whose figure exists, with its verdict; ``task`` names the long task's length."""
    if "restore" in figures and "load_alone" in figures:
        figures["restore_ratio"] = figures["restore"] / figures["load_alone"]
    result = {}
    for label, _, _, shown, judged, op, target in ROWS:
        if target is None or judged not in figures:
            continue
        value = figures[judged]
        ok = value < target if op == "<" else value <= target
        unit = {"diff": " ms", "pct": " %"}.get(shown, "")
        result[judged] = {
            "label": label.format(task=task),
            "value": value,
            "target": f"{op} {target:g}{unit}",
            "result": "PASS" if ok else "FAIL",
        }
    return result


def print_report(figures: dict[str, float], verdicts: dict[str, dict[str, Any]], task: str) -> None:
    print_figures(console, figures, FIGURES)
    table = Table(title="Ours against bare Parsl")
    for column in ("figure", "ours", "baseline", "added", "target", "result"):
        table.add_column(column, justify="right" if column in ("ours", "baseline", "added") else "left")
    for label, ours, base, shown, judged, _, target in ROWS:
        if ours not in figures:
            continue
        unit = FIGURES[ours][1]
        cells = [label.format(task=task), f"{figures[ours]:.4g} {unit}", "", "", "", ""]
        if base is not None and base in figures:
            cells[2] = f"{figures[base]:.4g} {FIGURES[base][1]}"
            if shown == "diff":
                cells[3] = f"{figures[judged]:+.3g} {unit}"
            elif shown == "pct":
                cells[3] = f"{figures[judged]:+.3g} %"
            else:
                cells[3] = f"x {figures[ours] / figures[base]:.3g}"
        if target is None:
            cells[4] = "(information)"
        elif judged in verdicts:
            verdict = verdicts[judged]["result"]
            style = "green" if verdict == "PASS" else "red"
            cells[4] = verdicts[judged]["target"]
            cells[5] = f"[{style}]{verdict}"
        table.add_row(*cells)
    console.print(table)


def calibrated_steps(task_s: float, figures: dict[str, float]) -> dict[str, int]:
    """Steps of each MLP (``wide``, ``narrow``) for tasks of about ``task_s`` seconds, a multiple of
    :data:`CHECKPOINTS_PER_TASK`; each one's step time and steps into ``figures``."""
    steps = {}
    for label, params, probe in (("wide", WIDE, 50), ("narrow", NARROW, 800)):
        per_step = calibrate(params, probe)
        figures[f"{label}_step"] = 1000 * per_step
        steps[label] = max(CHECKPOINTS_PER_TASK, round(task_s / per_step / CHECKPOINTS_PER_TASK))
        steps[label] *= CHECKPOINTS_PER_TASK
        figures[f"{label}_steps"] = steps[label]
    return steps


def run_config(mode: str, task_s: float, reps: int, resumes: int, same: dict[str, bool], wall: float) -> dict[str, Any]:
    """What the run measured with, and on which versions: the JSON document's ``config``."""
    return {
        "mode": mode,
        "task_s": task_s,
        "reps": reps,
        "zero_reps": ZERO_FACTOR * reps,
        "resume_rounds": resumes,
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


def main(argv: list[str] | None = None) -> None:
    parser, _ = options(
        __doc__, quick="1-second tasks, 3 rounds, 2 kills: under a minute", full="5-second tasks, 15 rounds, 11 kills"
    )
    parser.add_argument("--reps", type=int, help="rounds per median, kills too, >= 3 (default 7, 5 kills)")
    parser.add_argument("--dir", type=Path, help="working directory (default: a temporary one in ./bench-results)")
    parser.add_argument(
        "--json", type=Path, help="write every figure with its unit, the verdicts and the kill timelines"
    )
    args = parser.parse_args(argv)
    settings = MODES[size_of(args)]
    task_s, reps, resumes = settings["task_s"], args.reps or settings["reps"], settings["resumes"]
    if args.reps:
        resumes = args.reps
    if reps < 3:
        parser.error("--reps must be at least 3")

    clock = Clock(console)
    # Workers import bare_train from this module, by name: they inherit this environment.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")]))
    same: dict[str, bool] = {}
    timelines: list[dict[str, Any]] = []
    with scratch("parsl-overhead-", args.dir) as root:
        config = load_site(
            "local", run_dir=str(root / "parsl"), retries=RETRIES, retry_handler=ResumingRetryHandler(RETRIES)
        )
        figures: dict[str, float] = {"heartbeat_period": float(config.executors[0].heartbeat_period)}
        with parsl.load(config) as dfk:
            workers = int(dfk.executors[config.executors[0].label].workers_per_node)
            clock.phase(f"warming {workers} workers, calibrating steps for {task_s:g}-second tasks")
            warm_workers(workers)
            steps = calibrated_steps(task_s, figures)
            clock.phase(f"zero-step tasks, {ZERO_FACTOR * reps} rounds")
            zero, same["zero-step"] = side_by_side(root / "tasks", "zero", WIDE, 0, ZERO_FACTOR * reps)
            figures |= {"zero_ours": 1000 * zero["ours"], "zero_bare": 1000 * zero["bare"]}
            figures["zero_added"] = 1000 * zero["added_s"]
            for label, params in (("wide", WIDE), ("narrow", NARROW)):
                clock.phase(f"{task_s:g}-second tasks, {label} MLP ({steps[label]} steps), {reps} rounds")
                long, same[label] = side_by_side(root / "tasks", label, params, steps[label], reps)
                figures |= {f"{label}_{k}": v for k, v in long.items()}
                costs = member_costs(root / "tasks", label)
                figures[f"{label}_tail"] = costs["tail"]
                if label == "wide":
                    figures["wide_stall"] = costs["stall"]
                beyond = long["added_s"] - zero["added_s"]
                if label == "wide":  # 8.6 MiB checkpoints every 1/5 of the task: they dominate
                    figures["wide_per_checkpoint"] = 1000 * beyond / CHECKPOINTS_PER_TASK
                else:  # checkpoints of 70 KiB: what is left is a cost per step
                    figures["narrow_per_step"] = 1e6 * beyond / steps[label]
            clock.phase(f"kill -> resume and exception -> resume, {resumes} of each")
            found, timelines = measure_resumes(root / "resumes", resumes, workers)
            figures |= found
        clock.phase("loading the checkpoint in this process")
        figures |= measure_local_loads(member_dir(root / "resumes" / "kill-0", "kill") / "checkpoints", 3 * reps)
    verdicts = checks(figures, f"{task_s:g}-s")
    print_report(figures, verdicts, f"{task_s:g}-s")
    wall = clock.elapsed()
    resumed = {kind: sum(t["fault"] == kind for t in timelines) for kind in ("kill", "error")}
    console.print(
        f"wall time {wall:.1f} s; {reps} rounds ({ZERO_FACTOR * reps} zero-step); resumed after {resumed['kill']}"
        f" of {resumes} kills and {resumed['error']} of {resumes} exceptions; same results, ours and bare: "
        + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items())
    )
    if args.json:
        config_out = run_config(size_of(args), task_s, reps, resumes, same, wall)
        units = with_units(figures, FIGURES)
        if "restore_ratio" in figures:
            units["restore_ratio"] = {
                "value": figures["restore_ratio"],
                "unit": "ratio",
                "label": "restore / load alone",
            }
        out = {"figures": units, "checks": verdicts, "resumes": timelines, "config": config_out}
        write_json(args.json, out)


if __name__ == "__main__":
    # Run as the module ``parsl_overhead`` (not ``__main__``) so that Parsl sends its functions by name.
    sys.path.insert(0, str(BENCH_DIR))
    importlib.import_module("parsl_overhead").main()
