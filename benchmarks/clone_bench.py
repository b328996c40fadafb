"""Cloning a running member against stopping it and restarting from ``torch.save``, on the same state.

Every clone here is taken from a source that keeps training in its own process: an MLP and its Adam
moments (parameters are a third of the bytes; default 1 GiB in all), one thread each, trained on a
fixed batch. Each figure is the median of at least five clones (``--reps``); one more clone per
source before them is left out (its fork allocates the source's staging arena).

Ours (``request_clone``; sections ``shared`` and ``node-local``)
    The source runs :func:`~resilient_flows.training.run_member` on a registered spec whose
    workload is :func:`train` below. At a request, it serves the order at its next step boundary
    with one asynchronous checkpoint and keeps training; the checkpoint is hard-linked into the
    clone's tier as it commits, and the clone restores it. Transports: the shared tier (the spec
    has no node-local tier) and the node-local tier (a ``local`` tier under ``/dev/shm``,
    ``--local-dir``: on this VM ``/tmp`` is the same disk as the shared directory). Each transport
    has its own source process, and its clones run two ways, alternately:

    - started at the request: a new ``python`` process, started once ``request_clone`` returns,
      that imports torch and our package, builds the model and waits for its state;
    - pre-started: a process started before the request (forked from this one with torch, our
      modules and ``torch._dynamo`` imported: the first optimizer a process builds imports it,
      1.5 s here), which has run one tiny warm-up step and waits on a pipe for its task, as a warm
      Parsl worker waits for the next one. It gets the clone's name when ``request_clone`` returns.

    Source stall: the fork checkpoint's ``Checkpointer.save`` stall (the ``forked`` event). Standby:
    request until the clone sees its state (starts receiving); readiness: request until the clone
    begins its first step (both from the ``cloned`` event); first step: request until the clone
    logged its first step (its ``metrics.jsonl``). All count from ``request_clone``'s timestamp, so
    they include the wait for the source's next step boundary (half a step on average) and the
    fsyncs ``request_clone`` makes. A clone is killed once it has logged its first step.

Ours over MPI (section ``mpi``; left out if ``resilient_flows.clone._mpi``, mpi4py or ``mpiexec``
is missing, or with ``--skip-mpi``)
    One ``mpiexec -n 2`` job: rank 0 trains the same state and, at a request seen at a step
    boundary (a request file, as above), calls ``start_send_state`` (its stall: until that
    returns, which copies the state into a staging buffer) and trains on; rank 1, pre-started and
    warmed up like the processes above, sees the request, builds its model and ``recv_state`` s
    into it. Standby: until the source's metadata arrived; readiness: ``recv_state`` returned.
    Pre-started only (an MPI job's ranks exist from its start).

Baseline (section ``baseline``)
    The same model, optimizer and step in a plain torch process (nothing of ours imported), which
    checks for a request file at every step boundary as our members do. At a request it stops,
    ``torch.save`` s model and optimizer ``state_dict`` to the shared directory, fsyncs file and
    directory, and continues training: that is its stall. Once it has saved, a new process (started
    then, or pre-started like ours, for reference) builds the model and optimizer, ``torch.load`` s
    the file, loads both ``state_dict`` and runs a step. Standby: request until ``torch.load``
    begins; readiness: request until the first step begins; first step: until it is done.

One checkpoint's stall (section ``context``): a plain ``Checkpointer.save`` of the same state in a
quiet process (one thread), median after the first save, with the shared tier only and with the
node-local tier, against which each transport's fork stall is checked. The fork itself happens while
the clone process starts on the machine's other core, so its stall is measured under more load.

Targets (second table): readiness at least 3x faster than the baseline (baseline readiness /
ours, for each transport and clone start), and the fork stall no larger than one checkpoint's stall
(fork stall / plain stall <= 1). Rows marked ``info`` compare like with like (pre-started baseline
process) and carry no target.

The machine this was written on has 2 cores and 24 GiB, shared with other work: the source trains
on one core while the clone starts on the other, the writer, flusher and MPI progress threads take
their share of both, and every figure is a median over clones spread across the run.

Run ``python benchmarks/clone_bench.py [--quick | --full | --size 256MiB] [--reps N] [--json PATH]``.
``--quick`` (64 MiB; our clones in pre-started processes only, since a process started at the
request spends 3 s importing) takes under a minute; the default (1 GiB, all of it) about 7 minutes
on that VM, most of it processes starting and 1 GiB models being built; ``--full`` is 2 GiB with 7
clones per median.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import itertools
import json
import math
import multiprocessing
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import torch
from harness import Clock, options, parse_size, scratch, size_of, timed, write_json
from report import judge, print_checks

# Only torch and the standard library at module level: the baseline's processes import this module
# and nothing of ours. The driver and our members import resilient_flows and rich where they use them.

MiB = 1 << 20
GiB = 1 << 30
DEPTH = 8  # linear layers, as in checkpoint_bench
BATCH = 8  # a small batch: a step is mostly the Adam update over the whole state
LR = 1e-5
SEED = 0
SIZES = {"quick": 64 * MiB, "default": GiB, "full": 2 * GiB}
REPS = {"quick": 5, "default": 5, "full": 7}
START_STEPS = 6  # source steps before the first request (the first ones allocate)
SETTLE_STEPS = 1  # source steps between one clone's end (its hand-off done) and the next request
SETTLE_S = 0.3  # ... and at least this long
TIMEOUT_S = 300.0
HERE = Path(__file__).resolve().parent
WORKLOAD = "clone_bench:train"  # this module, imported by name (benchmarks/ on the path)

#: variant: (section, row label, which source, how the clone's process starts).
VARIANTS = {
    "shared_cold": ("shared", "ours, shared tier, process started at request", "shared", "cold"),
    "shared_warm": ("shared", "ours, shared tier, pre-started process", "shared", "warm"),
    "local_cold": ("node-local", "ours, node-local tier, process started at request", "local", "cold"),
    "local_warm": ("node-local", "ours, node-local tier, pre-started process", "local", "warm"),
    "mpi_warm": ("mpi", "ours, MPI point to point (mpiexec -n 2), clone rank waiting", "mpi", "warm"),
    "base_cold": ("baseline", "baseline: stop, torch.save, new process, torch.load", "baseline", "cold"),
    "base_warm": ("baseline", "baseline, pre-started process (reference)", "baseline", "warm"),
}
QUANTITIES = {"stall": "source stall", "standby": "standby", "readiness": "readiness", "first_step": "first step done"}
#: source: prefix of its figures, its words in labels.
SOURCES = {
    "shared": ("shared", "shared tier"),
    "local": ("local", "node-local tier"),
    "mpi": ("mpi", "MPI"),
    "baseline": ("base", "baseline"),
}
#: key: (unit, label) of figures beside the per-variant ones.
CONTEXT = {
    "state_bytes": ("MiB", "state (MLP + Adam moments)"),
    "width": ("", "MLP width (8 layers)"),
    "step_time": ("s", "training step, quiet process"),
    "plain_stall_shared": ("s", "one checkpoint's stall (Checkpointer.save), shared tier"),
    "plain_stall_local": ("s", "one checkpoint's stall (Checkpointer.save), node-local tier"),
    "plain_stall_first_shared": ("s", "  first save, shared tier (allocates the arena)"),
    "plain_stall_first_local": ("s", "  first save, node-local tier (allocates the arena)"),
    "plain_commit_shared": ("s", "save -> commit, shared tier"),
    "plain_commit_local": ("s", "save -> commit, node-local tier"),
    **{
        key: ("s", label)
        for source, (prefix, words) in SOURCES.items()
        if source != "baseline"
        for key, label in (
            (f"{prefix}_fork_stall", f"fork stall, {words} (all clones)"),
            (f"{prefix}_fork_stall_first", f"  first fork, {words} (left out: allocates)"),
            (f"{prefix}_boundary_extra", f"source's fork step beyond a quiet step, {words}"),
        )
    },
    "base_boundary_extra": ("s", "baseline source's save step beyond a quiet step"),
}
#: key, label, numerator, op, denominator, target (None: information only).
RATIOS = [
    *(
        (f"ready_{v}", f"readiness: baseline / {VARIANTS[v][1]}", "base_cold_readiness", ">=", f"{v}_readiness", 3.0)
        for v in VARIANTS
        if not v.startswith("base")
    ),
    *(
        (f"stall_{prefix}", f"source stall: {words} fork / one checkpoint", f"{prefix}_fork_stall", "<=", plain, 1.0)
        for prefix, words, plain in (
            ("shared", "shared tier", "plain_stall_shared"),
            ("local", "node-local tier", "plain_stall_local"),
            ("mpi", "MPI", "plain_stall_shared"),
        )
    ),
    ("stall_vs_base", "source stall: baseline / ours, shared tier", "base_cold_stall", ">=", "shared_fork_stall", None),
    *(
        (f"warm_{v}", f"readiness: pre-started baseline / {VARIANTS[v][1]}", "base_warm_readiness", ">=",
         f"{v}_readiness", None)
        for v in ("shared_warm", "local_warm", "mpi_warm")
    ),
]  # fmt: skip


# ---------------------------------------------------------------------- the training state


def state_bytes(width: int) -> int:
    """Parameters and two Adam moments, float32."""
    return 3 * 4 * DEPTH * (width * width + width)


def width_for(nbytes: int) -> int:
    """MLP width whose parameters are a third of ``nbytes`` (float32; Adam adds two moments)."""
    return max(8, int(math.sqrt(nbytes / 12 / DEPTH)))


def build(width: int, depth: int = DEPTH, batch: int = BATCH, seed: int = SEED, lr: float = LR) -> tuple:
    """Model, Adam optimizer and the fixed batch, as every process here builds them."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.randn(batch, width, generator=generator), torch.randn(batch, width, generator=generator)
    return model, optimizer, x, y


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    optimizer.zero_grad(set_to_none=False)  # reused gradient buffers: steadier step times
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def train(ctx: Any) -> dict[str, Any]:
    """The members' workload (``clone_bench:train``): ``params`` width, depth, batch, lr."""
    p = ctx.params
    model, optimizer, x, y = build(p["width"], p["depth"], p["batch"], ctx.seed, p["lr"])
    ctx.track(model=model, optimizer=optimizer)
    for step in ctx.steps(p["steps"]):
        ctx.log(step, loss=train_step(model, optimizer, x, y))
    return ctx.result()


# ---------------------------------------------------------------------- what each process does


def run_ours(task: dict[str, Any]) -> None:
    """A member of ours (a source or a clone): ``run_member`` on its registered spec."""
    from resilient_flows.training import run_member
    from resilient_flows.training._members import read_spec

    spec = read_spec(task["run_dir"], task["name"])
    run_member(spec.to_dict(), task["run_dir"])


def baseline_source(task: dict[str, Any]) -> None:
    """Train; at a request, stop, torch.save + fsync to the shared directory, report, continue."""
    torch.set_num_threads(1)
    model, optimizer, x, y = build(task["width"], task["depth"], task["batch"], SEED, task["lr"])
    directory = Path(task["dir"])
    request = directory / "request.json"
    with (directory / "metrics.jsonl").open("a", buffering=1) as metrics:
        for step in itertools.count():
            loss = train_step(model, optimizer, x, y)
            metrics.write(json.dumps({"step": step, "time": time.time(), "loss": loss}) + "\n")
            if not request.exists():  # one stat per step boundary, as our members make
                continue
            path = Path(json.loads(request.read_text())["path"])
            start = time.perf_counter()
            with path.open("wb") as out:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, out)
                out.flush()
                os.fsync(out.fileno())
            _fsync_dir(directory)
            stall = time.perf_counter() - start
            request.unlink()
            print(json.dumps({"step": step, "stall_s": stall}), flush=True)


def baseline_worker(task: dict[str, Any]) -> dict[str, float]:
    """The baseline's new process: build, torch.load, load_state_dict, one step; when each happened."""
    torch.set_num_threads(1)
    model, optimizer, x, y = build(task["width"], task["depth"], task["batch"], SEED, task["lr"])
    load_at = time.time()
    state = torch.load(task["path"], weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    del state
    ready_at = time.time()
    train_step(model, optimizer, x, y)
    return {"load_at": load_at, "ready_at": ready_at, "done_at": time.time()}


def plain_checkpoints(task: dict[str, Any]) -> dict[str, float]:
    """One checkpoint's stall and commit latency, shared tier alone and with the node-local tier."""
    from resilient_flows.checkpoint import Checkpointer, TrainState

    torch.set_num_threads(1)
    model, optimizer, x, y = build(task["width"], task["depth"], task["batch"], SEED, task["lr"])
    steps = [timed(lambda: train_step(model, optimizer, x, y)) for _ in range(START_STEPS)]
    out = {"step_time": statistics.median(steps[1:])}
    state = TrainState(model, optimizer)  # what TrainContext.track holds
    for tier, local in (("shared", None), ("local", task["local_dir"])):
        checkpointer = Checkpointer(
            Path(task["dir"]) / tier if local is None else [local, Path(task["dir"]) / tier], keep=1
        )
        rows = []
        for i in range(task["reps"] + 1):
            train_step(model, optimizer, x, y)
            stall = checkpointer.save(i, state, persist=False).last_stall
            checkpointer.wait()
            rows.append((stall, checkpointer.stats.last_commit_latency))
        checkpointer.close()
        out[f"plain_stall_{tier}"] = statistics.median(r[0] for r in rows[1:])
        out[f"plain_stall_first_{tier}"] = rows[0][0]
        out[f"plain_commit_{tier}"] = statistics.median(r[1] for r in rows[1:])
    return out


def mpi_pair(task: dict[str, Any]) -> None:
    """Under ``mpiexec -n 2``: rank 0 trains and sends its state at each request, rank 1 is the clone.

    Requests are ``request.json`` in ``task["dir"]`` (``id``; ``stop`` ends both ranks). Rank 0
    checks for one at every step boundary and serves it with ``start_send_state`` (its stall: until
    that returns), appending to ``forks.jsonl``; rank 1, warmed up and waiting, polls for it, builds
    its model, ``recv_state`` s into it and runs a step, appending when each happened to
    ``clones.jsonl``.
    """
    from mpi4py import MPI

    from resilient_flows.checkpoint import TrainState
    from resilient_flows.clone._mpi import CloneTransferStats, StagingBuffer, recv_state, start_send_state

    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    directory = Path(task["dir"])
    request = directory / "request.json"
    if comm.rank == 0:
        model, optimizer, x, y = build(task["width"], task["depth"], task["batch"], SEED, task["lr"])
        state, served, sending = TrainState(model, optimizer), None, None
        staging = StagingBuffer()  # reused by every transfer, as a long-running source would
        with (
            (directory / "metrics.jsonl").open("a", buffering=1) as metrics,
            (directory / "forks.jsonl").open("a", buffering=1) as forks,
        ):
            for step in itertools.count():
                loss = train_step(model, optimizer, x, y)
                metrics.write(json.dumps({"step": step, "time": time.time(), "loss": loss}) + "\n")
                order = _read_order(request)
                if order is None or order["id"] == served:
                    continue
                if sending is not None:
                    sending.wait()
                if order.get("stop"):
                    break
                start = time.perf_counter()
                sending = start_send_state(comm, state, [1], [0], timeout=TIMEOUT_S, staging=staging)
                stall = time.perf_counter() - start
                served = order["id"]
                forks.write(json.dumps({"id": served, "step": step, "stall_s": stall}) + "\n")
        return
    train_step(*build(8))  # warm up, as a worker that has run something
    handled = None
    with (directory / "clones.jsonl").open("a", buffering=1) as clones:
        while True:
            order = _read_order(request)
            if order is None or order["id"] == handled:
                time.sleep(0.005)
                continue
            if order.get("stop"):
                break
            handled = order["id"]
            model, optimizer, x, y = build(task["width"], task["depth"], task["batch"], SEED, task["lr"])
            stats, called = CloneTransferStats(), time.time()
            recv_state(comm, [0], into=TrainState(model, optimizer), timeout=TIMEOUT_S, stats=stats)
            ready_at = time.time()
            train_step(model, optimizer, x, y)
            record = {"id": handled, "receiving_at": called + stats.handshake_s, "ready_at": ready_at}
            clones.write(json.dumps({**record, "done_at": time.time(), "bytes": stats.payload_bytes}) + "\n")
            del model, optimizer


def _read_order(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


ROLES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "member": run_ours,
    "baseline-source": baseline_source,
    "baseline-worker": baseline_worker,
    "plain": plain_checkpoints,
    "mpi": mpi_pair,
}


def role_main(role: str, task_file: Path | None) -> None:
    """A process started by the driver: one task (a JSON line on stdin, or a file), its result on stdout."""
    task = json.loads(task_file.read_text() if task_file is not None else sys.stdin.readline())
    result = ROLES[role](task)
    if result is not None:
        print(json.dumps(result), flush=True)


def _fsync_dir(path: Path) -> None:
    """The baseline's own (it imports nothing of ours)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- processes and files


class BenchError(RuntimeError):
    pass


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    return env


class Spawned:
    """A new ``python`` process running one role (under ``launcher``); its stderr goes to ``log``."""

    def __init__(self, role: str, log: Path, launcher: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> None:
        self.log = log
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                [*launcher, sys.executable, str(Path(__file__).resolve()), "--role", role, *extra],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=_env(),
            )
        self._buffer = b""

    def send(self, task: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(task).encode() + b"\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float = TIMEOUT_S) -> dict[str, Any]:
        """The next JSON line the process prints."""
        assert self.proc.stdout is not None
        fd, deadline = self.proc.stdout.fileno(), time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"no answer within {timeout:.0f} s from {self.describe()}")
            if select.select([fd], [], [], min(left, 0.5))[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise BenchError(f"{self.describe()} ended without answering")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def describe(self) -> str:
        tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        return f"process {self.proc.pid} (exit {self.proc.poll()}; {self.log}):\n{tail}"

    def stop(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


def _forked_main(role: str, conn: Any) -> None:
    train_step(*build(8))  # warm up, as a worker that has run something
    conn.send("ready")
    conn.send(ROLES[role](conn.recv()))


class Forked:
    """A process started before the request: forked from the driver, imports done, waiting for a task."""

    def __init__(self, role: str) -> None:
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        self.proc = context.Process(target=_forked_main, args=(role, child), daemon=True)
        self.proc.start()
        child.close()
        self.receive()  # "ready"

    def send(self, task: dict[str, Any]) -> None:
        self.conn.send(task)

    def receive(self, timeout: float = TIMEOUT_S) -> Any:
        deadline = time.monotonic() + timeout
        while not self.conn.poll(0.05):
            if not self.alive() or time.monotonic() > deadline:
                raise BenchError(f"no answer from {self.describe()}")
        return self.conn.recv()

    def alive(self) -> bool:
        return self.proc.is_alive()

    def describe(self) -> str:
        return f"pre-started process {self.proc.pid} (exit {self.proc.exitcode}; its stderr is this terminal)"

    def stop(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


class Tail:
    """The records another process appends to a JSON-lines file, read as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._offset, self._partial = 0, b""

    def poll(self) -> int:
        """Read what was appended; how many records there are now."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return len(self.records)
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        self.records += [json.loads(line) for line in lines if line.strip()]
        return len(self.records)


def wait_until(predicate: Callable[[], object], what: str, worker: Spawned | Forked | None = None) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        if worker is not None and not worker.alive():
            raise BenchError(f"waiting for {what}: {worker.describe()}")
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {TIMEOUT_S:.0f} s waiting for {what}")
        time.sleep(0.005)


def wait_steps(tail: Tail, n: int, source: Spawned, min_s: float = 0.0) -> None:
    """Until the source has logged ``n`` more steps, and at least ``min_s`` passed."""
    start, goal = time.monotonic(), tail.poll() + n
    wait_until(lambda: tail.poll() >= goal and time.monotonic() - start >= min_s, f"{n} source steps", source)


def schedule(reps: int, cold: bool = True) -> list[str]:
    """A left-out clone first, then clones started both ways (``cold``), alternating which goes first."""
    order = ["warmup"]
    for i in range(reps):
        order += (["cold", "warm"] if i % 2 == 0 else ["warm", "cold"]) if cold else ["warm"]
    return order


def prestart(kind: str, role: str) -> Forked | None:
    """A process started before the request, or None for one started at the request."""
    return None if kind == "cold" else Forked(role)


# ---------------------------------------------------------------------- the measurements


def measure_ours(
    transport: str, work: dict[str, Any], reps: int, root: Path, local_root: Path, cold: bool
) -> dict[str, Any]:
    """Clones of one source over one transport: per-clone rows by how the clone started, source steps."""
    from resilient_flows.checkpoint import CheckpointConfig, TierSpec
    from resilient_flows.clone import request_clone
    from resilient_flows.rundir import member_dir
    from resilient_flows.training import MemberSpec, read_events
    from resilient_flows.training._members import read_spec, register_member

    run_dir = root / f"ours-{transport}"
    shared = TierSpec("checkpoints", name="shared")
    tiers = (TierSpec(str(local_root / "src"), name="local"), shared) if transport == "local" else (shared,)
    spec = MemberSpec(
        name="src",
        workload=WORKLOAD,
        params=dict(work),
        seed=SEED,
        steps=10**9,  # it trains until this benchmark kills it
        checkpoint=CheckpointConfig(tiers=tiers, interval_steps=None, keep=1),  # it saves only to fork
        threads=1,
    )
    register_member(run_dir, spec)
    source_dir = member_dir(run_dir, "src")
    source = Spawned("member", run_dir / "src.log")
    source.send({"run_dir": str(run_dir), "name": "src"})
    tail = Tail(source_dir / "metrics.jsonl")
    rows: dict[str, list[dict[str, Any]]] = {"warmup": [], "cold": [], "warm": []}
    workers: list[Spawned | Forked] = [source]
    try:
        wait_steps(tail, START_STEPS, source)
        for kind in schedule(reps, cold):
            wait_steps(tail, SETTLE_STEPS, source, SETTLE_S)
            worker = prestart(kind, "member")
            seen = sum(1 for _ in read_events(run_dir))
            (name,) = request_clone(run_dir, "src")
            if worker is None:
                worker = Spawned("member", run_dir / f"{name}.log")
            workers.append(worker)
            worker.send({"run_dir": str(run_dir), "name": name})
            clone_tail = Tail(member_dir(run_dir, name) / "metrics.jsonl")
            wait_until(clone_tail.poll, f"{name}'s first step", worker)
            worker.stop()
            wait_until(lambda: not any(source_dir.glob("clone-order.*")), f"src's hand-off to {name}", source)
            clone = read_spec(run_dir, name)
            assert clone is not None and clone.parent is not None
            events = list(read_events(run_dir))[seen:]
            forked = next(e for e in events if e["kind"] == "forked" and name in e["clones"])
            cloned = next(e for e in events if e["kind"] == "cloned" and e["member"] == name)
            rows[kind].append(
                {
                    "stall": forked["stall_ms"] / 1000,
                    "standby": cloned["standby_s"],
                    "readiness": cloned["readiness_s"],
                    "first_step": clone_tail.records[0]["time"] - clone.parent.requested_at,
                    "step": forked["step"],
                    "transport": cloned["transport"],
                    "fallback": cloned["fallback"],
                }
            )
            shutil.rmtree(member_dir(run_dir, name))
            local = clone.checkpoint.tier("local")
            if local is not None:
                shutil.rmtree(local.path, ignore_errors=True)
        tail.poll()
    finally:
        for worker in workers:
            worker.stop()
    return {"rows": rows, "source_steps": tail.records}


def measure_baseline(work: dict[str, Any], reps: int, root: Path) -> dict[str, Any]:
    """The same clones by stopping a plain torch process, torch.save, a new process and torch.load."""
    from resilient_flows.durable import write_durably

    run_dir = root / "baseline"
    run_dir.mkdir()
    source = Spawned("baseline-source", run_dir / "source.log")
    source.send({**work, "dir": str(run_dir)})
    tail = Tail(run_dir / "metrics.jsonl")
    rows: dict[str, list[dict[str, Any]]] = {"warmup": [], "cold": [], "warm": []}
    workers: list[Spawned | Forked] = [source]
    try:
        wait_steps(tail, START_STEPS, source)
        for i, kind in enumerate(schedule(reps)):
            wait_steps(tail, SETTLE_STEPS, source, SETTLE_S)
            worker = prestart(kind, "baseline-worker")
            path = run_dir / f"state-{i}.pt"
            requested_at = time.time()
            write_durably(run_dir / "request.json", json.dumps({"path": str(path)}))
            saved = source.receive()
            if worker is None:
                worker = Spawned("baseline-worker", run_dir / f"worker-{i}.log")
            workers.append(worker)
            worker.send({**work, "path": str(path)})
            done = worker.receive()
            worker.stop()
            path.unlink()
            rows[kind].append(
                {
                    "stall": saved["stall_s"],
                    "standby": done["load_at"] - requested_at,
                    "readiness": done["ready_at"] - requested_at,
                    "first_step": done["done_at"] - requested_at,
                    "step": saved["step"],
                }
            )
        tail.poll()
    finally:
        for worker in workers:
            worker.stop()
    return {"rows": rows, "source_steps": tail.records}


def measure_mpi(work: dict[str, Any], reps: int, root: Path) -> dict[str, Any]:
    """Clones over MPI point to point: ``mpiexec -n 2``, rank 0 the source, rank 1 a waiting clone rank."""
    from resilient_flows.durable import write_durably

    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        raise BenchError("mpiexec not found")
    run_dir = root / "mpi"
    run_dir.mkdir()
    task = run_dir / "task.json"
    task.write_text(json.dumps({**work, "dir": str(run_dir)}))
    request = run_dir / "request.json"
    job = Spawned("mpi", run_dir / "mpi.log", (mpiexec, "-n", "2"), ("--task", str(task)))
    tail, forks, clones = (Tail(run_dir / f"{name}.jsonl") for name in ("metrics", "forks", "clones"))
    rows: dict[str, list[dict[str, Any]]] = {"warmup": [], "warm": []}
    try:
        wait_steps(tail, START_STEPS, job)
        for i, kind in enumerate(schedule(reps, cold=False)):
            wait_steps(tail, SETTLE_STEPS, job, SETTLE_S)
            requested_at = time.time()
            write_durably(request, json.dumps({"id": i}))
            wait_until(lambda n=i + 1: forks.poll() >= n and clones.poll() >= n, f"MPI clone {i}", job)
            fork, clone = forks.records[i], clones.records[i]
            rows[kind].append(
                {
                    "stall": fork["stall_s"],
                    "standby": clone["receiving_at"] - requested_at,
                    "readiness": clone["ready_at"] - requested_at,
                    "first_step": clone["done_at"] - requested_at,
                    "step": fork["step"],
                    "bytes": clone["bytes"],
                }
            )
        tail.poll()
        write_durably(request, json.dumps({"id": -1, "stop": True}))
        with contextlib.suppress(subprocess.TimeoutExpired):
            job.proc.wait(timeout=30)
    finally:
        if job.alive():
            job.proc.terminate()  # mpiexec passes it on to the ranks
            with contextlib.suppress(subprocess.TimeoutExpired):
                job.proc.wait(timeout=10)
        job.stop()
    return {"rows": rows, "source_steps": tail.records}


def boundary_extra(records: list[dict[str, Any]], steps: list[int]) -> float:
    """Median over ``steps`` of (time from that step's log line to the next) minus a quiet step's."""
    times = {r["step"]: r["time"] for r in records}
    gaps = {s: times[s + 1] - times[s] for s in times if s + 1 in times}
    quiet = statistics.median(g for s, g in gaps.items() if 1 <= s < min(steps) - 1)  # before any request
    return statistics.median(gaps[s] - quiet for s in steps if s in gaps)


def summarize(
    measured: dict[str, dict[str, Any]], plain: dict[str, float], nbytes: int, width: int
) -> dict[str, float]:
    figures = {"state_bytes": nbytes / MiB, "width": float(width), **plain}
    for variant, (_, _, source, kind) in VARIANTS.items():
        rows = measured.get(source, {}).get("rows", {}).get(kind)
        if not rows:
            continue
        for quantity in QUANTITIES:
            figures[f"{variant}_{quantity}"] = statistics.median(r[quantity] for r in rows)
    for source, (prefix, _) in SOURCES.items():
        if source not in measured:
            continue
        rows = measured[source]["rows"]
        every = rows.get("cold", []) + rows["warm"]
        if source != "baseline":
            figures[f"{prefix}_fork_stall"] = statistics.median(r["stall"] for r in every)
            figures[f"{prefix}_fork_stall_first"] = rows["warmup"][0]["stall"]
        steps = [r["step"] for r in rows["warmup"] + every]
        figures[f"{prefix}_boundary_extra"] = boundary_extra(measured[source]["source_steps"], steps)
    return figures


def transport_problems(measured: dict[str, dict[str, Any]]) -> list[str]:
    """Clones that came by another path than their transport's (a fallback, or the other tier)."""
    expected = {"shared": "shared tier (hard link)", "local": "node-local tier (hard link)"}
    problems = []
    for source, want in expected.items():
        for kind, rows in measured.get(source, {}).get("rows", {}).items():
            for row in rows:
                if row["transport"] != want or row["fallback"]:
                    problems.append(
                        f"{source} {kind} clone at step {row['step']}: {row['transport']} {row['fallback']}"
                    )
    return problems


def print_report(console: Any, figures: dict[str, float], checks: dict[str, dict], reps: int) -> None:
    from rich.table import Table

    table = Table(title=f"Clone against baseline (seconds, medians of {reps} clones each)")
    for column in ("section", "variant", *QUANTITIES.values(), "readiness vs baseline"):
        table.add_column(column, justify="left" if column in ("section", "variant") else "right")
    base = figures.get("base_cold_readiness")
    for variant, (section, label, _, _) in VARIANTS.items():
        if f"{variant}_readiness" not in figures:
            continue
        values = [f"{figures[f'{variant}_{q}']:.3f}" for q in QUANTITIES]
        speedup = "" if base is None else f"{base / figures[f'{variant}_readiness']:.2f}x"
        table.add_row(section, label, *values, speedup)
    console.print(table)
    table = Table(title="Context (medians)")
    for column in ("quantity", "value", "unit"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for key, (unit, label) in CONTEXT.items():
        if key in figures:
            table.add_row(label, f"{figures[key]:.4g}", unit)
    console.print(table)
    print_checks(console, checks, heading="ratio", value_format=".3f")


def figure_units(figures: dict[str, float]) -> dict[str, dict[str, Any]]:
    out = {}
    for key, value in figures.items():
        if key in CONTEXT:
            unit, label = CONTEXT[key]
        else:
            variant, quantity = next((v, q) for v in VARIANTS for q in QUANTITIES if key == f"{v}_{q}")
            unit, label = "s", f"{VARIANTS[variant][1]}: {QUANTITIES[quantity]}"
        out[key] = {"value": value, "unit": unit, "label": label}
    return out


def default_local_root() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def mpi_missing() -> str | None:
    """Why the MPI transport cannot be measured here, or None."""
    if importlib.util.find_spec("resilient_flows.clone._mpi") is None:
        return "resilient_flows/clone/_mpi.py does not exist"
    if importlib.util.find_spec("mpi4py") is None or shutil.which("mpiexec") is None:
        return "mpi4py or mpiexec is missing (pip install mpich mpi4py)"
    return None


def parser_of() -> argparse.ArgumentParser:
    """The options; ``--role`` and ``--task`` (hidden) make this process one of the measured workers."""
    parser, sizes = options(
        __doc__,
        quick=f"{SIZES['quick'] // MiB} MiB state, our clones pre-started only: under a minute",
        full=f"{SIZES['full'] // GiB} GiB state, {REPS['full']} clones",
    )
    sizes.add_argument("--size", type=parse_size, help="state size, e.g. 256MiB (default 1GiB)")
    parser.add_argument("--reps", type=int, help=f"clones per median, >= 5 (default {REPS['default']})")
    parser.add_argument("--dir", type=Path, help="the shared directory (default: a temporary one in ./bench-results)")
    parser.add_argument("--local-dir", type=Path, help="where node-local tiers go (default /dev/shm)")
    parser.add_argument("--skip-mpi", action="store_true", help="leave out the MPI transport (mpiexec -n 2)")
    parser.add_argument("--json", type=Path, help="write every figure with its unit, the verdicts, every clone")
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--task", type=Path, help=argparse.SUPPRESS)
    return parser


def measure_plain(work: dict[str, Any], reps: int, root: Path, local_root: Path) -> dict[str, Any]:
    """One checkpoint's stall, in a worker of its own: what a clone is compared with."""
    worker = Spawned("plain", root / "plain.log")
    worker.send({**work, "dir": str(root / "plain"), "local_dir": str(local_root / "plain"), "reps": reps})
    try:
        return worker.receive()
    finally:
        worker.stop()
        shutil.rmtree(root / "plain", ignore_errors=True)
        shutil.rmtree(local_root / "plain", ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = parser_of()
    args = parser.parse_args(argv)
    if args.role:
        role_main(args.role, args.task)
        return
    size = args.size or SIZES[size_of(args)]
    reps = args.reps or REPS[size_of(args)]
    if reps < 5:
        parser.error("--reps must be at least 5")
    cold = not args.quick  # our clones in processes started at the request: 3 s of imports each

    import resilient_flows.clone
    import resilient_flows.training  # noqa: F401  (imported before pre-started clones fork from here)

    console = harness.console()
    clock = Clock(console)
    torch.set_num_threads(1)
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    importlib.import_module(WORKLOAD.partition(":")[0])  # pre-started clones find the workload imported
    torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])  # the first optimizer imports torch._dynamo (1.5 s)
    width = width_for(size)
    work = {"width": width, "depth": DEPTH, "batch": BATCH, "lr": LR}
    local_tier = tempfile.TemporaryDirectory(
        prefix="clone-bench-", dir=args.local_dir or default_local_root(), ignore_cleanup_errors=True
    )
    mpi = "left out (--skip-mpi)" if args.skip_mpi else mpi_missing()
    measured: dict[str, dict[str, Any]] = {}
    with scratch("clone-bench-", args.dir) as root, local_tier as local_name:
        local_root = Path(local_name)
        clock.phase("one checkpoint's stall")
        plain = measure_plain(work, reps, root, local_root)
        for transport, where in (("shared", "shared tier"), ("local", f"node-local tier ({local_root.parent})")):
            clock.phase(f"clones over the {where}")
            measured[transport] = measure_ours(transport, work, reps, root, local_root, cold)
            shutil.rmtree(root / f"ours-{transport}", ignore_errors=True)
        if mpi is None:
            clock.phase("clones over MPI")
            measured["mpi"] = measure_mpi(work, reps, root)
        clock.phase("baseline")
        measured["baseline"] = measure_baseline(work, reps, root)
        clock.phase("done")
    base = root.parent
    durations = clock.durations()
    figures = summarize(measured, plain, state_bytes(width), width)
    checks = judge(figures, RATIOS)
    print_report(console, figures, checks, reps)
    if mpi is not None:
        console.print(f"[yellow]no MPI transport row: {mpi}")
    if not cold:
        console.print("[yellow]--quick: our clones ran in pre-started processes only")
    for problem in transport_problems(measured):
        console.print(f"[red]clone did not come by its transport: {problem}")
    wall = clock.elapsed()
    console.print(
        f"wall time {wall:.0f} s ("
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in durations.items())
        + f"); {reps} clones per median; shared {base}, node-local {local_root.parent}"
    )
    if args.json:
        config = {"state_bytes": state_bytes(width), "width": width, "depth": DEPTH, "batch": BATCH, "reps": reps}
        config |= {"threads_per_process": 1, "shared_dir": str(base), "local_dir": str(local_root.parent)}
        config |= {"wall_s": wall, "phase_wall_s": durations, "torch": torch.__version__, "mpi": mpi or "measured"}
        samples = {source: m["rows"] for source, m in measured.items()}
        report = {"figures": figure_units(figures), "ratios": checks, "config": config, "clones": samples}
        write_json(args.json, report)


if __name__ == "__main__":
    main()
