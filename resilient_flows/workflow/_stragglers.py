"""What a run's blocks leave behind on this host, found by the runner's token and never by less.

A pool killed with SIGKILL leaves its multiprocessing manager and resource tracker behind, and
where Slurm tracks a job's processes by parentage (``proctrack/linuxproc``) a job's orphans
outlive its end; only a search of this host's processes finds them. A job number or a process
group number does not say whose a process is: two Slurm clusters (or two accounts on one) number
their jobs alike, and a group's number is reused once its processes are gone. So every runner
draws a random token, :func:`carry_token` has every block of the run carry it in its environment,
and the block ledger records it beside each block; a search kills only processes whose
environment holds the token, and of those only the block's (its process group, or its Slurm job).
A process whose environment cannot be read (another user's) is never ours.

The token goes first into each provider's ``worker_init``, which every Parsl provider runs in the
block's job script before it starts the pool (the local site, Slurm, PBS, Cobalt alike): the pool,
its workers and whatever they start inherit it, however the batch system forwards (or does not
forward) the submitting shell's environment.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resilient_flows.rundir import TOKEN_ENV, stat_fields
from resilient_flows.training import ENV_NAMES

__all__ = ["TOKEN_ENV", "carry_token", "is_straggler", "kill_commands", "kill_stragglers", "new_token"]

#: The variable of a command member's run contract that names its run directory.
RUN_DIR_ENV = ENV_NAMES["run_dir"]


def new_token() -> str:
    """A token no other runner draws: 128 random bits."""
    return secrets.token_hex(16)


def carry_token(config: Any, token: str) -> None:
    """Make every block of ``config``'s executors carry ``token`` (see the module's docstring)."""
    for executor in config.executors:
        provider = getattr(executor, "provider", None)
        if provider is not None and hasattr(provider, "worker_init"):
            provider.worker_init = f"export {TOKEN_ENV}={token}\n{provider.worker_init or ''}"


def is_straggler(pid: int, token: str, group: int | None = None, slurm_job: str | None = None) -> bool:
    """Whether process ``pid`` runs this Python, carries ``token``, and belongs to process group
    ``group`` or to Slurm job ``slurm_job``."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        if os.path.realpath(command) != os.path.realpath(sys.executable):
            return False
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"{TOKEN_ENV}={token}".encode() not in environ:
            return False
        if group is not None and int(stat_fields(pid)[2]) == group:
            return True
        return slurm_job is not None and f"SLURM_JOB_ID={slurm_job}".encode() in environ
    except (OSError, ValueError):  # gone, not readable (not ours), or not a command line at all
        return False


def kill_stragglers(token: str | None, group: int | None = None, slurm_job: str | None = None) -> int:
    """SIGKILL the processes on this host that :func:`is_straggler` finds; how many. Without a
    token (a block recorded before runners had one) nothing is searched for."""
    if not token or (group is None and slurm_job is None):
        return 0
    killed = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            killed += _kill_if(int(entry), token, group, slurm_job)
    return killed


def kill_commands(token: str, run_dir: Path) -> int:
    """SIGKILL the processes on this host that carry ``token`` and whose run contract names
    ``run_dir``: command members and whatever they started, once the run's workers are gone; how
    many. A command member's launcher kills it when it dies, but not the processes the command
    started, which would train on, orphaned (they run other programs than this Python)."""
    names = {f"{RUN_DIR_ENV}={path}".encode() for path in (run_dir, run_dir.resolve())}
    mine = f"{TOKEN_ENV}={token}".encode()

    def ours(pid: int) -> bool:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not readable (not ours)
            return False
        return mine in environ and not names.isdisjoint(environ)

    return sum(_kill_checked(int(e), ours) for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid())


def _kill_if(pid: int, token: str, group: int | None, slurm_job: str | None) -> bool:
    return _kill_checked(pid, lambda p: is_straggler(p, token, group, slurm_job))


def _kill_checked(pid: int, check: Callable[[int], bool]) -> bool:
    """Kill ``pid`` if ``check`` finds it ours, through a handle taken before the check where Linux
    has one (a pidfd), so that a process that took the number meanwhile is never the one signalled."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfd (an old kernel): the check and the kill race
        handle = None
    try:
        if not check(pid):
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if handle is None:
                os.kill(pid, signal.SIGKILL)
            else:
                signal.pidfd_send_signal(handle, signal.SIGKILL)
            return True
        return False
    finally:
        if handle is not None:
            os.close(handle)
