"""What the preemption agent needs from a batch system, and nothing more: one small interface.

An adapter (:class:`~resilient_flows.cosched._slurm.SlurmBatch`,
:class:`~resilient_flows.cosched._pbspro.PBSProBatch`) turns the scheduler's own commands into
:class:`BatchJob` records and carries the agent's decisions out with those commands. The agent
never shells out itself, so a new scheduler is one adapter, and the adapters are tested against
the commands' real output formats.

Sizes are in the agent's *unit*: nodes on a machine that allocates whole nodes, CPUs where
several jobs share a node (and on a one-node test cluster, where CPUs stand in for nodes).
"""

from __future__ import annotations

import functools
import pwd
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from resilient_flows.errors import ResilientFlowsError

UNITS = ("nodes", "cpus")
Unit = Literal["nodes", "cpus"]
#: The most characters of one user-controlled value that reach the agent's log.
SHOWN = 300


class BatchCommandError(ResilientFlowsError):
    """A scheduler command failed, timed out or printed what its adapter cannot read; the message
    names the command and quotes what it said."""


@dataclass(frozen=True)
class BatchJob:
    """One job as the scheduler reports it, in the scheduler's terms but the agent's units.

    ``state`` is ``"running"``, ``"pending"`` or ``"other"`` (finishing, finished, suspended:
    none the agent acts on). ``start`` and ``submitted`` are Unix times; ``time_limit`` is in
    seconds (None: unlimited). ``held`` is a pending job that will not start until released.
    ``priority`` is the scheduler's: of two pending jobs that fit, the higher starts first (None
    where the scheduler does not say).
    """

    id: str
    name: str
    user: str
    queue: str
    state: str
    nodes: int
    cpus: int
    submitted: float
    start: float | None
    time_limit: float | None
    comment: str
    held: bool = False
    priority: float | None = None
    heartbeat: str = ""
    uid: int | None = None

    def size(self, unit: Unit) -> int:
        return self.nodes if unit == "nodes" else self.cpus

    @property
    def expected_end(self) -> float | None:
        """When its time limit runs out, if it is running and has one."""
        if self.start is None or self.time_limit is None:
            return None
        return self.start + self.time_limit


class BatchSystem(Protocol):
    """The agent's view of a scheduler. Every method raises :class:`BatchCommandError` on failure."""

    name: str
    #: Whether :meth:`requeue` takes a job that has exited (Slurm). Where it does not (PBS Pro's
    #: ``qrerun`` takes running jobs only), the agent does not signal a victim but requeues it
    #: while it runs, and the scheduler's requeue is the signal: PBS sends SIGTERM, then SIGKILL
    #: after the queue's ``kill_delay``, and a member checkpoints on SIGTERM as on SIGUSR1.
    requeues_exited: bool
    #: Whether :meth:`prioritize` can put a pending job ahead of the others (Slurm, for its
    #: administrator). Where it cannot, the freed nodes reach the request only if the scheduler
    #: ranks on-demand jobs first by itself (a higher partition or queue priority).
    can_prioritize: bool

    def jobs(self) -> list[BatchJob]:
        """Running and pending jobs (one query: both lists must describe the same moment)."""
        ...

    def free(self, unit: Unit) -> int:
        """Nodes (or CPUs) that a pending job could start on now."""
        ...

    def signal(self, job_id: str, signal: str) -> None:
        """Send ``signal`` (a name such as ``"USR1"``) to every process of the job, batch script included."""
        ...

    def requeue(self, job_id: str, *, hold: bool) -> None:
        """Put the job back in the queue; ``hold`` keeps it there until :meth:`release`."""
        ...

    def release(self, job_id: str) -> None:
        """Let a held job start again, as soon as the scheduler would start it."""
        ...

    def prioritize(self, job_id: str, *, above: float) -> None:
        """Give a pending job a priority higher than ``above``, so that it starts before every job
        ranked at or below that."""
        ...


def uid_of(job: BatchJob) -> int | None:
    """The numeric id of the job's owner: the scheduler's, else its user name looked up; None where
    neither establishes it (then nothing the job's files say is believed)."""
    if job.uid is not None:
        return job.uid
    try:
        return _uid(job.user) if job.user else None
    except KeyError:
        return None


@functools.lru_cache(maxsize=4096)
def _uid(user: str) -> int:
    """Cached: a poll looks up the same few hundred users; an unknown one raises, and is not cached."""
    return pwd.getpwnam(user).pw_uid


def clean(value: object, limit: int = SHOWN) -> str:
    """``value`` as text fit for a log line: control, format and separator characters escaped (no
    forged lines, no terminal escapes, no reordered text), at most ``limit`` characters of that kept."""
    text = str(value)
    if len(text) <= limit and text.isprintable():  # the usual case, and Python's own rule for the rest
        return text
    shown = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text[:limit])
    return shown if len(text) <= limit and len(shown) <= limit else f"{shown[:limit]}...[{len(text)} characters]"


def run_command(argv: Sequence[str], *, timeout: float) -> str:
    """Run a scheduler command and return its standard output.

    A missing program, a non-zero exit or a timeout raises :class:`BatchCommandError` with the
    command and its last line of error output, so that the agent's log says what went wrong.
    """
    began = time.monotonic()
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise BatchCommandError(f"{argv[0]}: not found on PATH ({exc.strerror})") from exc
    except subprocess.TimeoutExpired as exc:
        raise BatchCommandError(f"{' '.join(argv)}: no answer within {timeout:g} s") from exc
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        took = time.monotonic() - began
        raise BatchCommandError(f"{' '.join(argv)}: exit status {done.returncode} after {took:.1f} s: {said}")
    return done.stdout
