"""Whether the Parsl worker pool that runs this attempt is still whole, as the attempt sees it.

Parsl notices a lost worker pool only once the interchange has missed its heartbeats for
``heartbeat_threshold`` seconds, and never notices a pool whose multiprocessing manager died: its
heartbeat thread answers on while its workers can neither report nor take work. The attempt sees
both at once, from its own node, without waiting for any threshold:

- the pool process (the ``process_worker_pool`` among its ancestors) is gone: its result has
  nowhere to go, and the pool's block is lost;
- the pool's multiprocessing manager (the pool's oldest spawned child, which holds the pool's
  books of tasks in progress) is gone: the worker dies once this task ends, and the pool takes
  work that it never starts.

Both are read from ``/proc`` (a process's parent, start time and state): where there is none
(not Linux), or outside a Parsl worker, nothing is watched and :meth:`PoolWatch.lost` says None.
A process is told from a recycled process id by its start time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from resilient_flows.rundir._lease import stat_fields

#: What names the pool process on its command line.
POOL_COMMAND = "process_worker_pool"

#: What names a process started by ``multiprocessing``'s spawn method on its command line.
SPAWNED = "--multiprocessing-fork"

#: How many ancestors are searched for the pool (a worker, ``mpiexec`` and a shell lie between).
MAX_DEPTH = 8


@dataclass(frozen=True)
class _Proc:
    pid: int
    started: int  # clock ticks after boot, from /proc/PID/stat


class PoolWatch:
    """The pool and its manager as found when the attempt started; :meth:`lost` looks again."""

    def __init__(self, pool: _Proc | None, manager: _Proc | None) -> None:
        self.pool = pool
        self.manager = manager

    @classmethod
    def find(cls) -> PoolWatch:
        """The pool this process runs under (None outside a Parsl worker pool) and its manager."""
        pool = _pool_ancestor(os.getpid())
        return cls(pool, None if pool is None else _oldest_spawned_child(pool))

    def lost(self) -> str | None:
        """Why the pool can no longer run this attempt; None while it can (or nothing is watched)."""
        if self.pool is not None and not _alive(self.pool):
            return pool_exited(self.pool.pid)
        if self.manager is not None and not _alive(self.manager):
            return f"its worker pool's multiprocessing manager (pid {self.manager.pid}) exited"
        return None

    def process(self) -> dict[str, int] | None:
        return None if self.pool is None else {"pid": self.pool.pid, "started": self.pool.started}


def pool_exited(pid: int) -> str:
    """Why an attempt lost its pool, when the pool process is gone: the attempt and the runner
    (which looks at a pool on its own host too) say it alike."""
    return f"its worker pool (pid {pid}) exited"


def pool_process_gone(pid: int, started: int) -> bool:
    """Whether the pool process a heartbeat names (:meth:`PoolWatch.process`) is gone from this host."""
    return not _alive(_Proc(pid, started))


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent, start time) of ``pid``; None when it is gone or /proc cannot say."""
    try:
        fields = stat_fields(pid)
    except OSError:
        return None
    try:
        return fields[0], int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(proc: _Proc) -> bool:
    found = _stat(proc.pid)
    return found is not None and found[2] == proc.started and found[0] not in ("Z", "X")


def _pool_ancestor(pid: int) -> _Proc | None:
    current = _stat(pid)
    for _ in range(MAX_DEPTH):
        if current is None or current[1] < 1:
            return None
        parent = current[1]
        current = _stat(parent)
        if current is not None and POOL_COMMAND in _command(parent):
            return _Proc(parent, current[2])
        if parent == 1:  # init, or a container's first process: no further
            return None
    return None


def _oldest_spawned_child(pool: _Proc) -> _Proc | None:
    """The pool's multiprocessing manager: it is spawned before any worker."""
    children = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        found = _stat(int(name))
        if found is not None and found[1] == pool.pid and SPAWNED in _command(int(name)):
            children.append(_Proc(int(name), found[2]))
    return min(children, key=lambda p: (p.started, p.pid)) if children else None
