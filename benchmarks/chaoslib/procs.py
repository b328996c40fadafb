"""A run's processes seen from outside, through ``/proc``, as an operator or a failing machine sees
them: faults find their targets here and the harness counts what was left over. A process is named
by its pid and start time, so that a recycled pid is never struck.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: int  # clock ticks after boot: with the pid, names one process for good
    state: str
    cpu_s: float
    cmdline: str


def read_proc(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) * TICK_S
    return Proc(pid, int(fields[1]), int(fields[19]), fields[0], cpu, cmdline.strip())


def processes() -> dict[int, Proc]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := read_proc(int(entry))) is not None:
            table[proc.pid] = proc
    return table


def alive(proc: Proc) -> bool:
    """Whether this very process (not a recycled pid) still runs; a zombie does not."""
    now = read_proc(proc.pid)
    return now is not None and now.start == proc.start and now.state != "Z"


def send(proc: Proc, sig: signal.Signals) -> bool:
    """Signal ``proc`` if it is still the process we looked at."""
    if not alive(proc):
        return False
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        return False
    return True


def peak_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class RunProcs:
    """The processes of one run at one moment."""

    table: dict[int, Proc]
    pools: list[Proc]
    spawned: dict[int, list[Proc]]  # pool pid -> its spawned (or forked) processes, oldest (the manager process) first
    interchanges: list[Proc]

    def pool_of(self, pid: int) -> int | None:
        """The pool whose worker ``pid`` is."""
        for pool, children in self.spawned.items():
            if any(child.pid == pid for child in children[1:]):
                return pool
        return None


class RunnerProcesses(Protocol):
    """The runner's processes, as many as it started (a resume starts another): the parents of
    the run's interchanges."""

    @property
    def pids(self) -> list[int]: ...


class Watcher:
    """Finds the processes of one run through ``/proc``; remembers every one it saw, and the
    workers' CPU time (the members' CPU)."""

    def __init__(self, run_dir: Path, runner: RunnerProcesses) -> None:
        self.marker = f"{run_dir}/parsl/"
        self.runner = runner
        self.seen: dict[tuple[int, int], tuple[str, Proc]] = {}  # (pid, start) -> (role, process)
        self.worker_cpu: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()

    def look(self) -> RunProcs:
        table = processes()
        pools = [p for p in table.values() if "process_worker_pool" in p.cmdline and self.marker in p.cmdline]
        pool_pids = {p.pid for p in pools}
        spawned: dict[int, list[Proc]] = {pid: [] for pid in pool_pids}
        roles: list[tuple[str, Proc]] = [("pool", p) for p in pools]
        runners = set(self.runner.pids)
        interchanges = []
        # a warm pool's workers are forked by its fork server (resilient_flows.sites._warmpool)
        servers = {p.pid: p.ppid for p in table.values() if p.ppid in pool_pids and "forkserver" in p.cmdline}
        for proc in table.values():
            if proc.ppid in servers:
                spawned[servers[proc.ppid]].append(proc)
            elif proc.ppid in pool_pids:
                if "spawn_main" in proc.cmdline:
                    spawned[proc.ppid].append(proc)
                else:
                    roles.append(("pool process", proc))
            elif proc.ppid in runners and "interchange" in proc.cmdline:
                interchanges.append(proc)
                roles.append(("interchange", proc))
            elif self.marker in proc.cmdline and proc.pid not in pool_pids:
                roles.append(("block script", proc))
        for children in spawned.values():
            children.sort(key=lambda p: (p.start, p.pid))
            roles.extend(("pool process", child) for child in children)
        with self._lock:
            for role, proc in roles:
                self.seen.setdefault((proc.pid, proc.start), (role, proc))
            for children in spawned.values():
                for worker in children[1:]:
                    key = (worker.pid, worker.start)
                    self.worker_cpu[key] = max(self.worker_cpu.get(key, 0.0), worker.cpu_s)
        return RunProcs(table, pools, spawned, interchanges)

    def members_cpu_s(self) -> float:
        with self._lock:
            return sum(self.worker_cpu.values())

    def living(self, extra: list[tuple[str, Proc]]) -> list[tuple[str, Proc]]:
        """Everything of the run seen so far (and ``extra``) that still lives."""
        self.look()
        with self._lock:
            known = dict(self.seen)
        for role, proc in extra:
            known.setdefault((proc.pid, proc.start), (role, proc))
        return [(role, proc) for role, proc in known.values() if alive(proc)]
