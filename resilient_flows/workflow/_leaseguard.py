"""The runner's guard: once a dead runner's lease expired, cancel its blocks and its interchange.

Members stop by themselves when the runner's lease expires (:mod:`resilient_flows.rundir._lease`),
but the runner's interchange lives on its host and its worker pools wait for that interchange: a
pilot job would hold its nodes until its walltime. The runner therefore starts this guard in a
session of its own (the SIGKILL or hang-up that ends the runner does not reach it), on its own
host, where the interchange is. The guard watches the runner's process and lease and, once the
runner is dead and its lease older than its orphan timeout:

1. says so in the run's event log (a ``warning``);
2. waits up to :data:`STOP_WAIT_S` for the running members to commit a checkpoint and stop (their
   heartbeat files go away);
3. cancels the runner's blocks through the site's providers (``scancel``, ``qdel``, a local pool's
   process group) and kills its interchange, as ``resume`` does for an earlier runner's.

It exits without doing anything when the runner ends normally (the runner stops it), or when
another runner takes the run over (a ``resume``: the lease names another process). A whole login
node lost takes the guard with it; the members still stop, and the pools end when they lose
their interchange (Parsl's ``heartbeat_threshold``).

Run as ``python -m resilient_flows.cli.leaseguard RUN_DIR --runner PID --started TICKS``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from resilient_flows.rundir import BEAT_S, EventLog, RunnerLease, process_start_time, read_lease, run_layout

if TYPE_CHECKING:
    from resilient_flows.training import MemberSpec

#: Seconds between two looks at the runner.
POLL_S = 2.0
#: Seconds the members have, once the lease expired, to commit a checkpoint and stop before their
#: blocks are cancelled: a step and a checkpoint's commit, with room; longer where a command
#: member's stop grace is (their launchers kill them only once it passed).
STOP_WAIT_S = 40.0


def guard(run_dir: Path, runner: int, started: int | None, poll_s: float = POLL_S) -> list[str]:
    """Watch runner ``runner`` (which started at ``started`` clock ticks) until it ends or is
    replaced (nothing to do: an empty list), or dies and its lease expires: then stop the run's
    members and cancel its blocks; what was cancelled, in words."""
    while True:
        lease = read_lease(run_dir)
        if lease is None and not os.path.lexists(run_layout(run_dir).lease):
            return []  # the run directory is gone (a damaged record is waited out, as an unreadable one)
        if lease is not None and (lease.pid != runner or lease.ended):
            return []  # another runner holds the run now, or this one let go of it
        if lease is not None and lease.expired and process_start_time(runner) != started:
            return _retire(run_dir, runner, lease)
        time.sleep(poll_s)  # also when the record cannot be read for now (a file system's hiccup)


def _retire(run_dir: Path, runner: int, lease: RunnerLease) -> list[str]:
    from resilient_flows.sites import SiteFile
    from resilient_flows.workflow._blocks import BlockLedger
    from resilient_flows.workflow._recorded_plan import read_plan

    events = EventLog(run_dir)
    events.emit(
        "warning",
        None,
        reason=f"runner {runner} on {lease.host} gone for {lease.age_s:.0f} s (orphan timeout "
        f"{lease.orphan_timeout_s:g} s): its members stop at their next step, then its blocks are cancelled",
    )
    plan = read_plan(run_dir)
    _wait_for_members(run_dir, stop_wait_s(plan.members))
    site = SiteFile.open(plan.site, plan.workflow.site)
    executors = site.config(run_dir=str(run_layout(run_dir).parsl)).executors
    done = BlockLedger(run_dir).cancel_runner(runner, executors)
    events.emit("warning", None, reason=f"runner {runner}'s leftovers cancelled: {'; '.join(done) or 'none'}")
    return done


def stop_wait_s(members: Iterable[MemberSpec]) -> float:
    """Seconds the running members among ``members`` may take to commit a checkpoint and stop:
    :data:`STOP_WAIT_S`, or a command member's stop grace, and a look, where that is longer."""
    from resilient_flows.training import DEFAULT_GRACE_S

    graces = [DEFAULT_GRACE_S if m.grace_s is None else m.grace_s for m in members if m.command]
    return max([STOP_WAIT_S, *(g + POLL_S for g in graces)])


def _wait_for_members(run_dir: Path, wait_s: float = STOP_WAIT_S) -> None:
    """Until no attempt beats any more (each removes its heartbeat file when it stops; one on a
    lost node leaves a stale file), or ``wait_s`` passed."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        now = time.time()
        beating = [p for p in _heartbeats(run_dir) if now - _mtime(p) < 3 * BEAT_S]
        if not beating:
            return
        time.sleep(POLL_S / 2)


def _heartbeats(run_dir: Path) -> list[Path]:
    try:
        return list(run_layout(run_dir).heartbeats.iterdir())
    except OSError:
        return []


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
