"""The runner's lease: how a member, and the runner's guard, tell that the runner is gone.

A runner that dies (SIGKILL, a login node going away) leaves its members training, its
interchange and worker pools running, and its pilot jobs holding nodes until their walltime,
unless someone resumes the run. So the runner holds a lease on the run: it touches
its lease file in the run directory every :data:`RENEW_S` seconds, and the record there says how long it
may stay silent (``orphan_timeout_s``, a site fact). Past that, the run is orphaned:

- every running member commits a checkpoint at its next step boundary and stops (its heartbeat
  thread checks the lease at each beat, on whatever node it runs: the run directory is shared);
- the runner's guard, a small process it started in a session of its own on the runner's host,
  then cancels the runner's blocks and kills its interchange
  (:mod:`resilient_flows.workflow._leaseguard`).

The lease is the file's modification time, so a member's check is one ``stat``; the record is
read only once the file looks stale. A ``resume`` takes the lease over by writing its own record.

The record also names the runner's token, which every process of its blocks carries in its
environment (:data:`TOKEN_ENV`). A task that an earlier runner's interchange hands one of its
workers after a ``resume`` took the run over (the interchange outlives its runner, and still holds
the tasks it had queued) carries another token than the lease's: it refuses to start
(:func:`superseded`), since the new runner runs that member itself, or adopted the attempt that
runs it (:mod:`resilient_flows.workflow._adopt`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from resilient_flows.errors import DamagedFileError, FileTooLargeError
from resilient_flows.rundir._damage import DamageLog
from resilient_flows.rundir._layout import run_layout

logger = logging.getLogger(__name__)

#: Seconds between two renewals of the lease.
RENEW_S = 5.0
#: How long a runner may be gone before its members stop and its blocks are cancelled, unless
#: the site says (``facts: orphan_timeout``): minutes, so that a pilot job is not held for hours,
#: yet longer than a login node's hiccup.
DEFAULT_ORPHAN_TIMEOUT_S = 300.0
#: The least orphan timeout: two renewals, so that one late renewal never stops a run.
MIN_ORPHAN_TIMEOUT_S = 2 * RENEW_S
#: The environment variable that holds the runner's token in every process of its blocks.
TOKEN_ENV = "RESILIENT_FLOWS_RUNNER_TOKEN"


@dataclass(frozen=True)
class RunnerLease:
    """Who holds the run (``pid`` on ``host``, started at ``started`` clock ticks) and for how long
    it may be silent; ``age_s`` is the time since its last renewal; ``ended``: the runner let go of
    it when it ended, so that nothing takes the run for orphaned."""

    pid: int
    host: str
    started: int | None
    orphan_timeout_s: float
    age_s: float
    ended: bool = False
    token: str | None = None

    @property
    def expired(self) -> bool:
        return not self.ended and self.age_s > self.orphan_timeout_s


def stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first); raises OSError. The
    name is any bytes its process chose, spaces, parentheses and invalid UTF-8 included."""
    stat = Path(f"/proc/{pid}/stat").read_bytes().decode(errors="replace")
    return stat[stat.rfind(")") + 2 :].split()


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot: with the pid, what names one process
    for good (a pid is recycled); None if it is gone."""
    try:
        return int(stat_fields(pid)[19])
    except OSError:
        return None


def read_lease(run_dir: str | os.PathLike, damage: DamageLog | None = None) -> RunnerLease | None:
    """The run's lease, or None when no runner ever held it or its record is unreadable: a record
    that is damaged (not JSON, oversized, not a regular file) is recorded in ``damage`` when given."""
    layout = run_layout(run_dir)
    try:
        age = time.time() - layout.lease.lstat().st_mtime
        record = layout.read_lease()
    except (DamagedFileError, FileTooLargeError) as exc:
        if damage is not None:
            damage.file(layout.lease, exc.problem if isinstance(exc, DamagedFileError) else str(exc))
        return None
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    try:
        timeout = float(record.get("orphan_timeout_s", DEFAULT_ORPHAN_TIMEOUT_S))
        started = record.get("started")
        return RunnerLease(
            pid=int(record["pid"]),
            host=str(record["host"]),
            started=None if started is None else int(started),
            orphan_timeout_s=timeout,
            age_s=age,
            ended=record.get("ended") is not None,
            token=record["token"] if isinstance(record.get("token"), str) else None,
        )
    except (KeyError, TypeError, ValueError):
        return None


def holding_runner(run_dir: str | os.PathLike) -> RunnerLease | None:
    """The lease of the runner that holds the run now, None when none does: a lease not let go of
    whose process is alive (a runner on this host) or that was renewed within two periods (one on
    another host, whose process cannot be looked at; as a ``resume`` judges when it may take over)."""
    lease = read_lease(run_dir)
    if lease is None or lease.ended:
        return None
    if lease.host == socket.gethostname() and lease.started is not None:
        alive = process_start_time(lease.pid) == lease.started and not _zombie(lease.pid)
    else:
        alive = lease.age_s < 2 * RENEW_S
    return lease if alive else None


def _zombie(pid: int) -> bool:
    """A process that exited but was not reaped yet (a detached runner's parent is whatever adopted it)."""
    try:
        return stat_fields(pid)[0] == "Z"
    except OSError:
        return False


def orphaned(run_dir: str | os.PathLike) -> str | None:
    """Why the run's members must stop, when its runner has been gone longer than its orphan
    timeout; None while the lease is held (or there is none: a member run outside a workflow).

    Costs one ``stat`` while the lease is fresh.
    """
    try:
        age = time.time() - (run_layout(run_dir).lease).stat().st_mtime
    except OSError:
        return None
    if age <= 2 * RENEW_S:
        return None
    lease = read_lease(run_dir)
    if lease is None or not lease.expired:
        return None
    return (
        f"the runner (process {lease.pid} on {lease.host}) has been gone for {lease.age_s:.0f} s, "
        f"longer than its orphan timeout of {lease.orphan_timeout_s:g} s"
    )


def superseded(run_dir: str | os.PathLike, token: str | None = None) -> str | None:
    """Why a task of this process's runner must not start: the run's lease names another runner's
    token (a ``resume`` took the run over); None otherwise, and always for a process that carries
    no token (``token``, else :data:`TOKEN_ENV`: a member run outside a workflow) or a lease that
    names none (a runner of an older version, or a test's).

    A task checks once before it starts and once more after its heartbeat file exists: a new runner
    writes its lease before it looks for live attempts to adopt, so it either sees that file or the
    task sees its lease."""
    mine = token if token is not None else os.environ.get(TOKEN_ENV)
    if not mine:
        return None
    lease = read_lease(run_dir)
    if lease is None or lease.token is None or lease.token == mine:
        return None
    return f"runner {lease.pid} on {lease.host} took the run over; this task's runner is gone"


def end_lease(run_dir: str | os.PathLike) -> None:
    """Let go of the run (this runner ends): its record stays, marked ``ended``, for the views.
    A record another runner wrote since (a resume took the run over) is left as it is."""
    lease = read_lease(run_dir)
    if lease is None or (lease.pid, lease.host) != (os.getpid(), socket.gethostname()):
        return
    record = {
        "pid": lease.pid,
        "host": lease.host,
        "started": lease.started,
        "orphan_timeout_s": lease.orphan_timeout_s,
        "ended": round(time.time(), 3),
        **({} if lease.token is None else {"token": lease.token}),
    }
    with contextlib.suppress(OSError):  # a full file system: the lease then merely expires
        run_layout(run_dir).write_lease(record)


class LeaseRenewer:
    """Renews the lease from a thread of its own, so that a runner busy starting Parsl or
    rendering still holds it. A context manager; renewal failures (a full or hung file system)
    are retried at the next period: the lease then ages, which is the truth. Once another runner
    took the run over (its record replaced this one's), it renews nothing more."""

    def __init__(self, run_dir: str | os.PathLike, period_s: float = RENEW_S) -> None:
        self.path = run_layout(run_dir).lease
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runner-lease", daemon=True)
        self._inode: int | None = None

    def __enter__(self) -> LeaseRenewer:
        with contextlib.suppress(OSError):
            self._inode = self.path.stat().st_ino  # the record this runner wrote (by rename)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            with contextlib.suppress(OSError):
                if self._inode is not None and self.path.stat().st_ino != self._inode:
                    logger.warning("%s was taken over by another runner: this one no longer renews it", self.path)
                    return
                os.utime(self.path)
