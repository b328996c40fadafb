"""Who holds a run now, as a view sees it: the runner's lease and the members' heartbeats.

``status`` shows the states the members last recorded. They are true only while a runner holds
the run; without one, a member shown running is not, or is finishing on its own: a runner killed
with SIGKILL (a detached one, an ssh session gone) leaves its members training until its orphan
timeout passes, then they commit a checkpoint and stop. A view must say which of these it is,
in words that never contradict what the user can see (steps that keep rising), and what to type
to continue the run. The lease says whether a runner holds the run; heartbeat files that changed
in the last :data:`FRESH_S` seconds say which members still train.
"""

from __future__ import annotations

import os
import shlex
import stat
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilient_flows.rundir import BEAT_S, DamageLog, holding_runner, read_lease, run_layout

#: A heartbeat rewritten within this many seconds belongs to an attempt that still trains: a few
#: beats, so that a beat delayed by a busy node or a slow shared file system is not taken for silence.
FRESH_S = 5 * BEAT_S

#: What :attr:`Liveness.runner` may be.
HOLDING, ENDED, GONE, NEVER = "holding", "ended", "gone", "never"


@dataclass(frozen=True)
class Liveness:
    """``runner``: :data:`HOLDING` (a runner holds the run), :data:`ENDED` (its last runner let go
    of it), :data:`GONE` (its runner died without letting go) or :data:`NEVER` (no runner took it);
    the lease's ``pid``, ``host``, seconds since its renewal and orphan timeout where there is one;
    ``beating``: the members whose heartbeat is fresh, sorted."""

    runner: str
    pid: int | None = None
    host: str | None = None
    renewed_s: float | None = None
    orphan_timeout_s: float | None = None
    beating: tuple[str, ...] = ()

    def document(self) -> dict[str, Any]:
        """For ``status --json``."""
        return {
            "state": self.runner,
            "pid": self.pid,
            "host": self.host,
            "renewed_s": None if self.renewed_s is None else round(self.renewed_s, 1),
            "orphan_timeout_s": self.orphan_timeout_s,
            "beating": list(self.beating),
        }

    def advice(self, run_dir: str | os.PathLike, active: bool = True) -> str | None:
        """What to tell the user of a run that is not done; None while a runner holds it.
        ``active``: some member is shown queued, running or retrying, which it then is not."""
        if self.runner == HOLDING:
            return None
        resume = shlex.join(["resilient-flows", "resume", str(run_dir)])
        if self.runner == GONE:
            gone = f"the run's runner (process {self.pid} on {self.host}) is gone"
        elif self.runner == ENDED:
            gone = "no runner holds this run (its runner ended)"
        else:
            gone = "no runner holds this run"
        if not self.beating:
            unheld = ": members shown queued, running or retrying are not" if active else ""
            return f"{gone}{unheld}; {resume} continues it"
        left = None
        if self.runner == GONE and self.orphan_timeout_s is not None and self.renewed_s is not None:
            left = self.orphan_timeout_s - self.renewed_s
        if left is not None and left > 0:
            stop = f"will commit a checkpoint and stop within about {left:.0f} s (its orphan timeout)"
        else:
            stop = "are committing a checkpoint and stopping"
        return (
            f"{gone}; {_listed(self.beating)} still train and {stop}; {resume} takes them over now where it can,"
            " or continues the run once they stopped"
        )


def liveness(run_dir: str | os.PathLike, members: Collection[str], damage: DamageLog | None = None) -> Liveness:
    """The run's runner and the heartbeats of its ``members``, now; a damaged lease is recorded in
    ``damage`` and counts as none."""
    beating = tuple(name for name in fresh_heartbeats(run_dir) if name in members)
    held = holding_runner(run_dir)
    lease = held if held is not None else read_lease(run_dir, damage)
    if lease is None:
        return Liveness(NEVER, beating=beating)
    state = HOLDING if held is not None else ENDED if lease.ended else GONE
    return Liveness(state, lease.pid, lease.host, lease.age_s, lease.orphan_timeout_s, beating)


def fresh_heartbeats(run_dir: str | os.PathLike, now: float | None = None) -> tuple[str, ...]:
    """The tasks whose heartbeat file changed in the last :data:`FRESH_S` seconds, sorted. Only
    regular files count, and no link is followed: the run directory is input, not trusted state."""
    now = time.time() if now is None else now
    directory = Path(run_layout(run_dir).heartbeats)
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):  # a link to a directory elsewhere is none
            return ()
        entries = list(os.scandir(directory))
    except OSError:  # none yet
        return ()
    fresh = []
    for entry in entries:
        try:
            found = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(found.st_mode) and now - found.st_mtime <= FRESH_S:
            fresh.append(entry.name)
    return tuple(sorted(fresh))


def _listed(names: tuple[str, ...], shown: int = 5) -> str:
    """``a, b and 3 more`` members."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    plural = "s" if len(names) > 1 else ""
    return f"member{plural} {', '.join(names[:shown])}{more}"
