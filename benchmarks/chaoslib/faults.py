"""The fault kinds: a thread that strikes the schedule's bursts at live targets, one method per kind
(``_worker_kill`` strikes ``worker-kill``; ``goodput.py`` subclasses it for periodic faults), and
lifts what lasts (stopped workers, ballast, crashed nodes) when the window closes or the run ends.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from chaoslib.config import LOOK_S, NODE_LOSSES, PEER_CHECKPOINTS, Config, SiteFacts, gate_of
from chaoslib.procs import Proc, RunProcs, Watcher, send
from chaoslib.runner import Runner
from chaoslib.schedule import Fault
from chaoslib.slurm import process_environment, slurm_job_of, slurm_jobs, slurm_node
from chaoslib.targets import Attempt, EventTail, running_attempts, running_members

#: How long a node lost on ``local-slurm-nodes`` stays down: past Slurm's SlurmdTimeout of a
#: ``.ci/slurm-up --nodes`` cluster (20 s), so that Slurm notices and ends its block, then it boots.
NODE_DOWN_S = 45.0
#: How long a fault waits for a target (a busy worker, a pool, a runner back from a restart).
TARGET_WAIT_S = 90.0


def fill(directory: Path, name: str) -> Path:
    """Fill the file system of ``directory`` to its last page with a ballast file."""
    ballast = directory / name
    with ballast.open("wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12):
            chunk = bytes(size)
            try:
                while True:
                    f.write(chunk)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
    return ballast


class Chaos(threading.Thread):
    """Injects the bursts into a running run; :meth:`finish` stops it and lifts what it holds."""

    def __init__(
        self,
        bursts: list[list[Fault]],
        span_s: float,
        run_dir: Path,
        shared: Path | None,
        runner: Runner,
        watcher: Watcher,
        facts: SiteFacts,
        config: Config,
        seed: int,
        nodes: Path | None = None,
        gate: Path | None = None,
        cluster: Path | None = None,
    ) -> None:
        super().__init__(name="chaos", daemon=True)
        self.bursts, self.span_s, self.run_dir, self.shared = bursts, span_s, run_dir, shared
        self.nodes, self.gate, self.cluster = nodes, gate, cluster
        self.runner, self.watcher, self.facts, self.config = runner, watcher, facts, config
        self.seed = seed
        self.rng = random.Random(seed + 1)
        self.faults = [fault for burst in bursts for fault in burst]
        self.stop_s = facts.heartbeat_threshold_s + 5.0
        self.events = EventTail(run_dir / "events.jsonl")
        self._done = threading.Event()
        self._lifts: dict[threading.Timer, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._down: set[str] = set()  # nodes a fault crashed and that did not boot yet (or are being crashed)

    def run(self) -> None:
        try:
            self._strike_bursts()
        finally:
            self._open_gate()

    def _strike_bursts(self) -> None:
        if not self.bursts or not self._wait_for(self._first_checkpoint, float("inf")):
            return
        origin = time.monotonic()
        share = self.span_s / len(self.bursts)
        strikes = []
        for b, burst in enumerate(self.bursts):
            at = origin + (b + self.rng.uniform(0.15, 0.85)) * share
            if self._done.wait(max(0.0, at - time.monotonic())):
                break
            for i, fault in enumerate(burst):  # at once: one waiting for its target holds up no other
                rng = random.Random(f"{self.seed}-{b}-{i}")
                # the runner last, so that the others strike what it started
                delay = 0.6 if fault.kind == "runner-kill" else rng.uniform(0.0, 0.5)
                strike = threading.Thread(target=self._inject, args=(fault, rng, delay), name=f"chaos {fault.kind}")
                strike.start()
                strikes.append(strike)
        for strike in strikes:
            strike.join()
        for fault in self.faults:
            if fault.time == 0.0 and fault.skipped is None:
                fault.skipped = "the run ended first"

    def finish(self) -> None:
        self._done.set()
        self.join(timeout=30)
        self._open_gate()
        with self._lock:
            lifts, self._lifts = dict(self._lifts), {}
        for timer, lift in lifts.items():
            timer.cancel()
            lift()

    # ------------------------------------------------------------------ mechanics

    def _open_gate(self) -> None:
        """Let held members finish: every fault struck (or gave up on its target)."""
        if self.gate is not None:
            for spanning in (False, True):
                gate_of(self.gate, spanning).touch()

    def _first_checkpoint(self) -> bool:
        with contextlib.suppress(FileNotFoundError):
            return b'"checkpointed"' in (self.run_dir / "events.jsonl").read_bytes()
        return False

    def _wait_for(self, ready: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._done.is_set() and time.monotonic() < deadline:
            if ready():
                return True
            self._done.wait(LOOK_S)
        return False

    def _inject(self, fault: Fault, rng: random.Random, delay: float) -> None:
        strike = getattr(self, "_" + fault.kind.replace("-", "_"))
        if self._done.wait(delay):
            return
        # A held run keeps its members until every fault struck: a fault then waits for its target
        # as long as the run lasts (under load, a few faults of a burst take the few busy workers
        # between two recoveries, and a fixed wait would give up on the others).
        patience = float("inf") if self.gate is not None else TARGET_WAIT_S
        if not self._wait_for(lambda: strike(fault, rng), patience):
            fault.skipped = "the run ended first" if self._done.is_set() else f"no target within {TARGET_WAIT_S:g} s"
        self._open_family_gates()

    def _open_family_gates(self) -> None:
        """With members spanning nodes: release each family once every fault meant for it struck
        (node losses for the spanning members, the other kinds for the rest); a family held
        longer would keep the block's workers, the other family's targets, from it."""
        if self.gate is None or not self.config.peer_members:
            return
        pending = [f for f in self.faults if f.time == 0.0 and f.skipped is None]
        if not any(f.kind in NODE_LOSSES for f in pending):
            gate_of(self.gate, spanning=True).touch()
        if not any(f.kind not in NODE_LOSSES for f in pending):
            gate_of(self.gate, spanning=False).touch()

    def _later(self, delay: float, lift: Callable[[], None]) -> None:
        """Run ``lift`` after ``delay`` seconds, or at :meth:`finish`, whichever comes first; once."""
        once = threading.Lock()

        def run_once() -> None:
            if once.acquire(blocking=False):
                lift()

        timer = threading.Timer(delay, run_once)
        with self._lock:
            if self._done.is_set():  # the run is over: lift at once
                timer = None
            else:
                self._lifts[timer] = run_once
                timer.start()
        if timer is None:
            run_once()

    def _begin(self, fault: Fault, hit: dict[str, int], detail: str, doomed: Iterable[Proc] = ()) -> None:
        fault.running = {name: attempt for name, (attempt, _) in running_members(self.run_dir).items()}
        fault.time = fault.end = time.time()
        fault.hit, fault.detail, fault.doomed = hit, detail, frozenset(p.pid for p in doomed)

    def _busy_workers(self, procs: RunProcs) -> list[tuple[str, int, Proc]]:
        """(member, attempt, worker) of the members that run in a worker of this run's pools."""
        busy = []
        for name, (attempt, pid) in running_members(self.run_dir).items():
            if procs.pool_of(pid) is not None:
                busy.append((name, attempt, procs.table[pid]))
        return sorted(busy, key=lambda b: b[0])

    def _members_of_pool(self, procs: RunProcs, pool: int) -> dict[str, int]:
        return {
            name: attempt for name, attempt, worker in self._busy_workers(procs) if procs.pool_of(worker.pid) == pool
        }

    # ------------------------------------------------------------------ the faults

    def _worker_kill(self, fault: Fault, rng: random.Random) -> bool:
        busy = self._busy_workers(self.watcher.look())
        if not busy:
            return False
        name, attempt, worker = rng.choice(busy)
        self._begin(fault, {name: attempt}, f"worker {worker.pid} running {name}", [worker])
        return send(worker, signal.SIGKILL)

    def _busy_pool(self, procs: RunProcs, rng: random.Random) -> tuple[Proc, dict[str, int]] | None:
        pools = [(pool, self._members_of_pool(procs, pool.pid)) for pool in procs.pools]
        pools = [(pool, hit) for pool, hit in pools if hit and len(procs.spawned[pool.pid]) >= 2]
        return rng.choice(sorted(pools, key=lambda p: p[0].pid)) if pools else None

    def _pool_kill(self, fault: Fault, rng: random.Random) -> bool:
        procs = self.watcher.look()
        found = self._busy_pool(procs, rng)
        if found is None:
            return False
        pool, hit = found
        self._begin(fault, hit, f"pool {pool.pid}", procs.spawned[pool.pid][1:])
        return send(pool, signal.SIGKILL)

    def _manager_process_kill(self, fault: Fault, rng: random.Random) -> bool:
        procs = self.watcher.look()
        found = self._busy_pool(procs, rng)
        if found is None:
            return False
        pool, hit = found
        manager = procs.spawned[pool.pid][0]
        workers = procs.spawned[pool.pid][1:]
        self._begin(fault, hit, f"multiprocessing manager {manager.pid} of pool {pool.pid}", workers)
        return send(manager, signal.SIGKILL)

    def _node_loss(self, fault: Fault, rng: random.Random) -> bool:
        """A node lost with its node-local directories; the members resume from what is left."""
        if self.cluster is not None:
            return self._slurm_node_loss(fault, rng)
        return self._emulated_node_loss(fault, rng)

    def _emulated_node_loss(self, fault: Fault, rng: random.Random) -> bool:
        """An emulated node of ``local-nodes``: its block's processes killed at once, and its
        node-local directories (``node-<block>.*``) gone."""
        procs = self.watcher.look()
        found = self._busy_pool(procs, rng)
        if found is None or self.nodes is None:
            return False
        pool, hit = found
        block = next((b for b in pool.cmdline.split() if b.startswith("--block_id=")), "=?").split("=", 1)[1]
        try:
            group = os.getpgid(pool.pid)
        except ProcessLookupError:
            return False
        self._begin(
            fault, hit, f"node {block} (pool {pool.pid}) and its node-local directories", procs.spawned[pool.pid][1:]
        )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        for directory in self.nodes.glob(f"node-{block}.*"):
            shutil.rmtree(directory, ignore_errors=True)
        return True

    def _slurm_node_loss(self, fault: Fault, rng: random.Random) -> bool:
        """The node of a busy pool on ``local-slurm-nodes`` crashes (``.ci/slurm-node down``: every
        process in its namespace, and its node-local scratch); it boots again after
        :data:`NODE_DOWN_S` (``.ci/slurm-node up``), by when Slurm has ended its block. With
        members spanning nodes (``--peer``), the node is one of a running two-node member's."""
        assert self.cluster is not None
        if self.config.peer_members:
            return self._peer_node_loss(fault, rng)
        procs = self.watcher.look()
        found = self._busy_pool(procs, rng)
        node = None if found is None else process_environment(found[0].pid).get("SLURMD_NODENAME")
        if found is None or node is None or not self._claim((node,)):
            return False
        pool, hit = found
        self._begin(
            fault, hit, f"node {node} (pool {pool.pid}), back after {NODE_DOWN_S:g} s", procs.spawned[pool.pid][1:]
        )
        return self._crash(fault, (node,))

    def _spanning(self, ready: Callable[[Attempt], bool]) -> list[Attempt]:
        """Running attempts of members spanning nodes, none of them down, that are ``ready``."""
        attempts = running_attempts(self.run_dir, self.events.read())
        with self._lock:
            down = set(self._down)
        return [a for a in attempts if len(set(a.hosts)) > 1 and not down & set(a.hosts) and ready(a)]

    def _struck_on(self, nodes: tuple[str, ...], procs: RunProcs, job: int | None) -> tuple[dict[str, int], list[Proc]]:
        """The attempts running on ``nodes`` (members struck directly), and the workers of the
        pools in Slurm job ``job``, which dies with any of its nodes."""
        hit = {
            a.member: a.attempt for a in running_attempts(self.run_dir, self.events.read()) if set(a.hosts) & set(nodes)
        }
        doomed = [w for pool in procs.pools if slurm_job_of(pool.pid) == job for w in procs.spawned[pool.pid][1:]]
        return hit, doomed

    def _peer_node_loss(self, fault: Fault, rng: random.Random) -> bool:
        """One node of a running two-node member that committed :data:`PEER_CHECKPOINTS` checkpoints
        in its attempt: the pool's node (rank 0's) or the other, by the seed's choice."""
        targets = self._spanning(lambda a: a.checkpoints >= PEER_CHECKPOINTS)
        if not targets:
            return False
        target = rng.choice(targets)
        node = rng.choice(sorted(set(target.hosts)))
        if not self._claim((node,)):
            return False
        procs = self.watcher.look()
        hit, doomed = self._struck_on((node,), procs, slurm_job_of(target.proc.pid))
        rank = "rank 0's" if node == target.hosts[0] else "not rank 0's"
        self._begin(fault, hit, f"node {node} of {target.member} ({rank}), back after {NODE_DOWN_S:g} s", doomed)
        return self._crash(fault, (node,))

    def _node_and_buddy_loss(self, fault: Fault, rng: random.Random) -> bool:
        """Both nodes of a running two-node member crash together, each holding the other's peer
        copies, once the member has a checkpoint in the shared tier: the restore must fall back
        to it. Both boot again after :data:`NODE_DOWN_S`."""
        assert self.cluster is not None

        def in_shared(attempt: Attempt) -> bool:
            return (self.run_dir / "members" / attempt.member / "checkpoints" / "latest").is_file()

        targets = self._spanning(in_shared)
        if not targets:
            return False
        target = rng.choice(targets)
        nodes = tuple(sorted(set(target.hosts)))
        if not self._claim(nodes):
            return False
        procs = self.watcher.look()
        hit, doomed = self._struck_on(nodes, procs, slurm_job_of(target.proc.pid))
        detail = f"nodes {', '.join(nodes)} of {target.member}, back after {NODE_DOWN_S:g} s"
        self._begin(fault, hit, detail, doomed)
        return self._crash(fault, nodes)

    def _claim(self, nodes: tuple[str, ...]) -> bool:
        """Reserve ``nodes`` for one fault: none of them down or being crashed by another."""
        with self._lock:
            if self._down & set(nodes):
                return False
            self._down |= set(nodes)
            return True

    def _crash(self, fault: Fault, nodes: tuple[str, ...]) -> bool:
        """``nodes`` crash at once (a thread each); they boot again after :data:`NODE_DOWN_S`."""
        fault.nodes = nodes
        done = [False] * len(nodes)

        def down(i: int) -> None:
            done[i] = slurm_node("down", nodes[i], self.cluster)

        crashes = [threading.Thread(target=down, args=(i,)) for i in range(len(nodes))]
        for crash in crashes:
            crash.start()
        for crash in crashes:
            crash.join()

        def boot() -> None:
            for node in nodes:
                slurm_node("up", node, self.cluster)
            fault.end = time.time()
            with self._lock:
                self._down -= set(nodes)

        self._later(NODE_DOWN_S, boot)
        if not all(done):
            fault.detail += f" (crash failed on {[n for n, ok in zip(nodes, done, strict=True) if not ok]})"
        return all(done)

    def _interchange_kill(self, fault: Fault, rng: random.Random) -> bool:
        procs = self.watcher.look()
        mine = [p for p in procs.interchanges if p.ppid == self.runner.pid]
        if not mine or not self._busy_workers(procs):
            return False
        workers = [w for pool in procs.pools for w in procs.spawned[pool.pid][1:]]
        self._begin(fault, {}, f"interchange {mine[0].pid}", workers)  # prefetched tasks start, then die
        fault.hit = dict(fault.running)
        return send(mine[0], signal.SIGKILL)

    def _worker_stop(self, fault: Fault, rng: random.Random) -> bool:
        busy = self._busy_workers(self.watcher.look())
        if not busy:
            return False
        name, attempt, worker = rng.choice(busy)
        self._begin(fault, {name: attempt}, f"worker {worker.pid} running {name}, stopped {self.stop_s:g} s", [worker])
        if not send(worker, signal.SIGSTOP):
            return False

        def resume() -> None:
            send(worker, signal.SIGCONT)
            fault.end = time.time()

        self._later(self.stop_s, resume)
        return True

    def _runner_kill(self, fault: Fault, rng: random.Random) -> bool:
        if not self._busy_workers(self.watcher.look()):
            return False
        self._begin(fault, {}, "")
        fault.hit = dict(fault.running)
        pid = self.runner.kill()
        fault.detail = f"runner {pid}, then resume"
        return pid is not None

    def _pilot_cancel(self, fault: Fault, rng: random.Random) -> bool:
        procs = self.watcher.look()
        if not self._busy_workers(procs):
            return False
        running = [job for job, state in slurm_jobs(self.run_dir).items() if state == "RUNNING"]
        if not running:
            return False
        job = max(running)  # the newest: the current runner's
        workers = [w for pool in procs.pools if slurm_job_of(pool.pid) == job for w in procs.spawned[pool.pid][1:]]
        self._begin(fault, {}, f"Slurm job {job}", workers)
        fault.hit = dict(fault.running)
        fault.job = job
        return subprocess.run(["scancel", str(job)], capture_output=True, timeout=30).returncode == 0

    def _storage_full(self, fault: Fault, rng: random.Random) -> bool:
        assert self.shared is not None
        self._begin(fault, {}, "")
        ballast = fill(self.shared, f"ballast-{fault.burst}")
        fault.detail = f"{ballast.stat().st_size / 2**20:.0f} MiB of ballast for {self.config.full_window_s:g} s"

        def free() -> None:
            ballast.unlink(missing_ok=True)
            fault.end = time.time()

        self._later(self.config.full_window_s, free)
        return True

    def _shard_flip(self, fault: Fault, rng: random.Random) -> bool:
        """A byte flipped in the newest shared checkpoint's first shard, and in every node-local
        copy of that shard (on ``local-nodes``): an intact copy on another tier would be restored
        instead, rightly, and the damage would never be met."""
        busy = self._busy_workers(self.watcher.look())
        rng.shuffle(busy)
        for name, attempt, worker in busy:
            tier = self.run_dir / "members" / name / "checkpoints"
            try:
                step = int((tier / "latest").read_text())
                shard = sorted((tier / f"step-{step:08d}").glob("shard-*.safetensors"))[0]
            except (OSError, ValueError, IndexError):  # no checkpoint yet, or retention removed it
                continue
            local = [] if self.nodes is None else self.nodes.rglob(f"{name}/step-{step:08d}/{shard.name}")
            self._begin(fault, {name: attempt}, f"{shard.relative_to(self.run_dir)}, then worker {worker.pid}")
            if not flip_byte(shard):
                continue
            copies = sum(flip_byte(copy) for copy in local)
            fault.detail += f" ({copies} node-local copies flipped too)" if copies else ""
            fault.flipped_step = step
            send(worker, signal.SIGKILL)
            return True
        return False


def flip_byte(path: Path) -> bool:
    """Flip one bit of the byte in the middle of ``path``; False if it is gone (retention)."""
    try:
        with path.open("r+b") as f:
            f.seek(path.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x01]))
    except (OSError, IndexError):
        return False
    return True
