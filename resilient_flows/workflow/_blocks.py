"""The batch jobs (Parsl blocks) of a run, recorded so that no runner leaves a pilot job behind.

A runner that dies (a login node reboots, an ssh session drops, SIGKILL) leaves its blocks running:
worker pools that hold nodes until their walltime, an orphaned pool on a laptop. Every runner
therefore appends each block it starts, and its interchange, to the run's block ledger, and
``resume`` cancels those of earlier runners before starting its own, through the same provider
(``scancel``, ``qdel``, the LocalProvider's process group).

A process on this machine (a local pool, an interchange) is recorded with its start time as the
kernel reports it, so that a recycled process id is never mistaken for it: nothing but the
recorded process is ever signalled. What a block leaves behind is searched for by the token of the
runner that started it, recorded with the block (see :mod:`resilient_flows.workflow._stragglers`):
never by a job or group number alone, which another run (on another cluster) may share.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parsl.executors import HighThroughputExecutor
from parsl.executors.status_handling import BlockProviderExecutor
from parsl.providers import LocalProvider

from resilient_flows.errors import WorkflowError, is_storage_full
from resilient_flows.procgroup import kill_group
from resilient_flows.rundir import (
    DEFAULT_ORPHAN_TIMEOUT_S,
    FULL_WAIT_S,
    RENEW_S,
    append_record,
    process_start_time,
    read_lease,
    read_records,
    run_layout,
)
from resilient_flows.sites._parsl import (
    foreign_job,
    go_file,
    hold_block,
    interchange_pid,
    is_standby,
    job_record,
    local_job_pid,
    local_job_script,
    mark_scaled_in,
    set_job_record,
)
from resilient_flows.workflow._stragglers import kill_stragglers, new_token

logger = logging.getLogger(__name__)


#: Seconds a cancelled local block has to stop on SIGTERM (a member commits a checkpoint and
#: stops) before its process group is killed.
KILL_GRACE_S = 5.0


def _same_process(pid: int | None, started: int | None) -> bool:
    return pid is not None and started is not None and process_start_time(pid) == started


@dataclass
class BlockLedger:
    """Appends the blocks and interchanges of this runner to the run's block ledger; ``token`` is
    what this runner's blocks carry (:func:`~resilient_flows.workflow._stragglers.carry_token`)."""

    run_dir: Path
    runner: int = field(default_factory=os.getpid)
    token: str = field(default_factory=new_token)
    _seen: set[tuple[str, str]] = field(default_factory=set)
    _leftovers: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # executor -> block -> its processes
    _taken: set[tuple[int, int]] = field(default_factory=set)  # (pid, start) of earlier runners' pools this one runs

    def record(self, executors: Iterable[Any]) -> None:
        """Record what is new among the executors' blocks (and interchanges) since the last call."""
        for executor in executors:
            if not isinstance(executor, BlockProviderExecutor):
                continue
            pid = interchange_pid(executor)
            if pid is not None and (executor.label, f"interchange {pid}") not in self._seen:
                self._seen.add((executor.label, f"interchange {pid}"))  # a new one per Parsl instance
                self._append({"executor": executor.label, "interchange": pid, "started": process_start_time(pid)})
            for block, job_id in list(executor.blocks_to_job_id.items()):
                if (executor.label, block) in self._seen:
                    continue
                self._seen.add((executor.label, block))
                resource = job_record(executor.provider, job_id)
                carried = resource.get("token") if resource is not None else None
                record = {**_job_record(executor.provider, job_id), "token": carried or self.token}
                # a resume takes over a pool left waiting for its go file (a HighThroughputExecutor's)
                if is_standby(executor) and isinstance(executor, HighThroughputExecutor):
                    record["go"] = (resource or {}).get("go") or go_file(executor.worker_logdir, block)
                found = _stragglers_of(record)
                if found:
                    self._leftovers.setdefault(executor.label, {})[block] = found
                self._append({"executor": executor.label, "block": block, **record})

    def reap(self, executors: Iterable[Any], everything: bool = False) -> None:
        """Kill what is left of this runner's local blocks once Parsl sees them ended (or, with
        ``everything``, of all of them: the Parsl instance is shut down, and the next one's blocks
        and interchange, numbered afresh, are recorded anew).

        A pool killed with SIGKILL leaves its multiprocessing manager and resource tracker behind,
        orphaned in the block's process group; nothing else would ever stop them.
        """
        for executor in executors:
            if not isinstance(executor, BlockProviderExecutor):
                continue
            status = executor.status_facade
            for block, found in list(self._leftovers.get(executor.label, {}).items()):
                state = status.get(block)
                if everything or (state is not None and state.terminal):
                    kill_stragglers(**found)
                    del self._leftovers[executor.label][block]
        if everything:
            self._seen.clear()

    def spare(self, label: str, block: str) -> None:
        """Leave what block ``block`` of executor ``label`` runs alone when its Parsl instance is
        reaped: a standby pool handed on to the next instance (see
        :mod:`resilient_flows.workflow._standby`), which records it anew."""
        self._leftovers.get(label, {}).pop(block, None)

    def take(self, pools: Iterable[tuple[int, int]]) -> None:
        """Leave the recorded processes ``pools`` (pid, start time) of earlier runners alone when
        their blocks are cancelled: waiting standby pools this runner took over (see
        :func:`~resilient_flows.workflow._standby.left_waiting`), which it records anew."""
        self._taken.update(pools)

    def previous(self) -> list[dict[str, Any]]:
        """The records of the runners before this one, but for the pools this one took over."""
        return [
            r
            for r in read_records(run_layout(self.run_dir))
            if r.get("runner") != self.runner and (r.get("pid"), r.get("started")) not in self._taken
        ]

    def cancel_previous(self, executors: Iterable[Any]) -> list[str]:
        """Cancel the blocks and interchanges earlier runners left; what was cancelled, in words.

        ``executors`` are this runner's, not started yet: their providers cancel the recorded
        jobs of the executor with the same label.
        """
        return _cancel(self.previous(), executors)

    def cancel_runner(self, runner: int, executors: Iterable[Any]) -> list[str]:
        """Cancel what runner ``runner`` recorded (its guard does, once it is gone); in words."""
        return _cancel([r for r in self.previous() if r.get("runner") == runner], executors)

    def cancel_own(self, executors: Iterable[Any]) -> list[str]:
        """Kill what this runner recorded, at once (a second Ctrl-C): local blocks' process groups
        and interchanges with SIGKILL, batch jobs with their provider's cancel; in words."""
        self.record(executors)  # a block started since the last look
        mine = [r for r in read_records(run_layout(self.run_dir)) if r.get("runner") == self.runner]
        return _cancel(mine, executors)

    def _append(self, record: dict[str, Any]) -> None:
        append_record(run_layout(self.run_dir), {"time": round(time.time(), 3), "runner": self.runner, **record})


def _cancel(records: list[dict[str, Any]], executors: Iterable[Any]) -> list[str]:
    """Cancel recorded blocks through the providers of the executors of the same labels, and kill
    recorded interchanges; what was cancelled, in words."""
    providers = {e.label: e.provider for e in executors if isinstance(e, BlockProviderExecutor)}
    done = []
    for record in records:
        if "interchange" in record:
            if _kill_recorded(record["interchange"], record.get("started"), signal.SIGKILL, group=False):
                done.append(f"interchange (pid {record['interchange']}) of executor {record['executor']}")
            continue
        label = record.get("executor")
        provider = providers.get(label) if isinstance(label, str) else None
        if provider is not None and cancel_block(provider, record):
            done.append(f"block {record['block']} (job {record['job_id']}) of executor {record['executor']}")
    return done


def _job_record(provider: Any, job_id: str) -> dict[str, Any]:
    record: dict[str, Any] = {"job_id": job_id, "provider": type(provider).__name__}
    if isinstance(provider, LocalProvider):
        pid = local_job_pid(provider, job_id)
        started = None if pid is None else process_start_time(pid)
        group = _local_group(provider, job_id)
        script = local_job_script(provider, job_id)
        record.update(pid=pid, host=socket.gethostname(), started=started, pgid=group, script_path=script)
    return record


def _stragglers_of(record: dict[str, Any]) -> dict[str, Any]:
    """How to find a recorded block's processes on this host once it ended: its runner's token and
    its process group (LocalProvider) or its Slurm job id; nothing without a token."""
    token = record.get("token")
    if not isinstance(token, str) or not token:
        return {}
    if isinstance(record.get("pgid"), int):
        return {"token": token, "group": record["pgid"]}
    if record.get("provider") == "SlurmProvider":
        return {"token": token, "slurm_job": str(record["job_id"])}
    return {}


def retire_block(executor: BlockProviderExecutor, block: str | None) -> bool:
    """Cancel one block of a running executor, as Parsl's own scale-in does; False if it has none such.

    Its managers are put on hold first, so that the interchange sends them nothing more; the block
    is then marked scaled in, which Parsl's block error handler does not count as a failure and
    its strategy replaces while tasks wait.
    """
    job_id = executor.blocks_to_job_id.get(str(block))
    if job_id is None or executor.provider is None:
        return False
    status = executor.status_facade.get(str(block))
    if status is not None and status.terminal:
        return False
    hold_block(executor, str(block))
    group = _local_group(executor.provider, job_id)
    executor.provider.cancel([job_id])
    if group is not None:  # LocalProvider sends SIGTERM, which a stopped (hung) worker never acts on
        timer = threading.Timer(KILL_GRACE_S, kill_group, (group,))
        timer.daemon = True
        timer.start()
    mark_scaled_in(executor, str(block))
    return True


def _local_group(provider: Any, job_id: str) -> int | None:
    """The process group of a LocalProvider block, while it runs."""
    if not isinstance(provider, LocalProvider):
        return None
    pid = local_job_pid(provider, job_id)
    try:
        return None if pid is None else os.getpgid(pid)
    except ProcessLookupError:
        return None


def cancel_block(provider: Any, record: dict[str, Any]) -> bool:
    """Cancel one recorded block through ``provider``; False when there was nothing to cancel.

    A LocalProvider's block is its process group, signalled as a whole while the recorded process
    still lives on this host; once it is gone (its pool died first), what is left of the group that
    runs this Python and carries the block's token (orphaned workers still training, the
    multiprocessing manager) is killed. A batch provider's job is cancelled with its own command
    (``scancel``, ``qdel``), whether or not it still runs: cancelling a finished job is harmless.
    """
    if isinstance(provider, LocalProvider):
        if record.get("host") != socket.gethostname():
            return False
        if _kill_recorded(record.get("pid"), record.get("started"), signal.SIGKILL, group=True):
            return True
        found = _stragglers_of(record)
        return bool(found) and kill_stragglers(**found) > 0
    job_id = str(record["job_id"])
    if job_record(provider, job_id) is None:  # a job another runner submitted: its provider knows it not
        set_job_record(provider, job_id, foreign_job(job_id))
    try:
        cancelled = bool(provider.cancel([job_id])[0])
    except Exception as exc:  # a provider's command failing must not stop the resume
        logger.warning("could not cancel job %s through %s: %s", job_id, type(provider).__name__, exc)
        return False
    found = _stragglers_of(record)
    if found:
        kill_stragglers(**found)
    return cancelled


def _kill_recorded(pid: int | None, started: int | None, sig: signal.Signals, group: bool) -> bool:
    if not _same_process(pid, started):
        return False
    assert pid is not None
    try:
        if group:
            os.killpg(os.getpgid(pid), sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


@dataclass(frozen=True)
class RunnerLock:
    """The run's lease file: which process runs the run now, so that a second runner is refused, and
    how long it may be gone before its members stop (the lease, see
    :mod:`resilient_flows.rundir._lease`)."""

    run_dir: Path
    orphan_timeout_s: float = DEFAULT_ORPHAN_TIMEOUT_S
    token: str | None = None  # what this runner's blocks carry: tasks of earlier runners' blocks then refuse to start

    def acquire(self) -> None:
        """Claim the run for this process; an error naming the runner that still holds it."""
        layout = run_layout(self.run_dir)
        try:
            holder = layout.read_lease()
        except (OSError, ValueError):
            holder = None
        if (
            isinstance(holder, dict)
            and holder.get("host") == socket.gethostname()
            and holder.get("pid") != os.getpid()
            and _same_process(holder.get("pid"), holder.get("started"))
        ):
            raise WorkflowError(
                f"{self.run_dir} is being run by process {holder['pid']} on {holder['host']}; "
                "wait for it to end, or stop it, before resuming"
            )
        lease = read_lease(self.run_dir)  # a runner on another host is seen by its lease only
        if lease is not None and lease.host != socket.gethostname() and not lease.ended and lease.age_s < 2 * RENEW_S:
            raise WorkflowError(
                f"{self.run_dir} is being run by process {lease.pid} on {lease.host} (its lease was renewed "
                f"{lease.age_s:.0f} s ago); stop it there, or resume once its lease is {2 * RENEW_S:g} s old"
            )
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": process_start_time(os.getpid()),
            "orphan_timeout_s": self.orphan_timeout_s,
            **({} if self.token is None else {"token": self.token}),
        }
        deadline = time.monotonic() + FULL_WAIT_S
        while True:
            try:
                layout.write_lease(me)
                break
            except OSError as exc:  # a full file system is waited out, as for events
                if not is_storage_full(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
