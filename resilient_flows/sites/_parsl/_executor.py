"""What the runner relies on inside Parsl's executors, interchange and providers (see the package's docstring).

The runner watches and steers a running ``HighThroughputExecutor`` in ways Parsl has no public
interface for: it asks the interchange for its managers and holds them with a timeout, marks a
block it cancelled as scaled in, moves a waiting block from one executor to another, and cancels
jobs of earlier runners through a provider that never submitted them. Each such use is one
function here; the callers (:mod:`resilient_flows.workflow._blocks`, ``_watchdog``,
``_walltime``, ``_standby``, ``_interrupt``, ``_runner``) keep their own policy and touch no
internal attribute.
"""

from __future__ import annotations

import contextlib
import logging
import runpy
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from parsl.executors.high_throughput.errors import CommandClientTimeoutError
from parsl.jobs.states import JobState, JobStatus

logger = logging.getLogger(__name__)

__all__ = [
    "ANSWER_S",
    "HOLD_ANSWER_S",
    "HOLD_LOOK_S",
    "add_block",
    "block_launch_command",
    "disconnect",
    "foreign_job",
    "hold_block",
    "hold_managers",
    "interchange_answers",
    "interchange_exit",
    "interchange_launch_cmd",
    "interchange_managers",
    "interchange_pid",
    "job_record",
    "kill_interchange",
    "local_job_pid",
    "local_job_script",
    "mark_scaled_in",
    "record_pid",
    "run_interchange",
    "set_job_record",
    "take_block",
    "watch_interchange_starts",
]

#: Seconds the interchange has to answer a command (the watchdog's list of managers, a hold).
ANSWER_S = 10.0
#: Seconds the interchange has to answer a hold before the block is cancelled without it.
HOLD_ANSWER_S = 5.0
#: Seconds between two looks at the interchange process while its answer to a hold is awaited.
HOLD_LOOK_S = 0.1
#: Seconds between two looks at the interchanges of executors being started.
START_LOOK_S = 0.2
#: The module that HTEX's interchange script (``interchange.py``, its default launch command) is:
#: run as a program, it reads its configuration on stdin.
INTERCHANGE_MODULE = "parsl.executors.high_throughput.interchange"
#: What starts it without Parsl's run-time type checks (see :mod:`resilient_flows.sites._interchange`).
LEAN_INTERCHANGE = "resilient_flows.sites._interchange"


def interchange_launch_cmd() -> list[str] | None:
    """An HTEX ``interchange_launch_cmd`` that starts its interchange by :data:`LEAN_INTERCHANGE`,
    with this interpreter; None where this Parsl's default is not the script of
    :data:`INTERCHANGE_MODULE` (it is then kept)."""
    from parsl.executors.high_throughput.executor import DEFAULT_INTERCHANGE_LAUNCH_CMD

    if list(DEFAULT_INTERCHANGE_LAUNCH_CMD) != ["interchange.py"]:
        return None
    return [sys.executable, "-m", LEAN_INTERCHANGE]


def run_interchange() -> None:
    """Run Parsl's interchange as its script runs (``__main__``), in this process."""
    runpy.run_module(INTERCHANGE_MODULE, run_name="__main__", alter_sys=True)


def interchange_pid(executor: Any) -> int | None:
    """The process id of the executor's interchange (``interchange_proc``, a child of this
    process for an HTEX); None for an executor that has none, or before it started."""
    proc = getattr(executor, "interchange_proc", None)
    return None if proc is None else int(proc.pid)


def interchange_exit(executor: Any) -> int | None:
    """The exit status of the executor's interchange once it exited; None while it runs (or for
    an executor that has none). Parsl itself never looks: an executor whose interchange died
    waits for it for good."""
    proc = getattr(executor, "interchange_proc", None)
    return None if proc is None else proc.poll()


@contextlib.contextmanager
def watch_interchange_starts(executors: Sequence[Any]) -> Iterator[None]:
    """Within, a start of ``executors`` (``parsl.load``) does not wait for an interchange that
    exited: HTEX waits up to 120 s for its first answer, then raises.

    A thread looks for such an exit and terminates the ZeroMQ context of that executor's command
    channel: a termination makes a call blocked on one of its sockets, in any thread, raise
    ``zmq.ContextTerminated`` at once. It then waits for the socket to be closed, which happens
    here once the start raised. An exit after the start ended is left to the runner's poll, and
    the socket to its executor: a poll of Parsl's may be blocked on it, and closing a socket
    under a blocked call aborts the process.
    """
    ended, lock = threading.Event(), threading.Lock()
    terminated: list[Any] = []

    def watch() -> None:
        while not ended.wait(START_LOOK_S):
            for executor in executors:
                client = getattr(executor, "command_client", None)
                if client is None or interchange_exit(executor) is None:
                    continue
                with lock:
                    if ended.is_set():
                        return
                    terminated.append(client)
                threading.Thread(target=client.zmq_context.term, name="interchange-gone", daemon=True).start()
                return

    watcher = threading.Thread(target=watch, name="interchange-start", daemon=True)
    watcher.start()
    try:
        yield
    except BaseException:
        with lock:
            ended.set()
        for client in terminated:  # nothing waits on it any more: the start raised
            client.zmq_socket.close()
        raise
    finally:
        with lock:
            ended.set()
        watcher.join()


def interchange_answers(executor: Any) -> bool:
    """Whether the executor's command channel to its interchange still works (``command_client.ok``
    turns false once a command timed out: the channel is then unusable)."""
    client = getattr(executor, "command_client", None)
    return client is None or bool(client.ok)


def kill_interchange(executor: Any, wait_s: float | None = None) -> bool:
    """SIGKILL the executor's interchange and, with ``wait_s``, reap it within that; False when it
    has none."""
    proc = getattr(executor, "interchange_proc", None)
    if proc is None:
        return False
    proc.kill()
    if wait_s is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)
    return True


def disconnect(executor: Any) -> None:
    """Make the executor's ``connected_managers`` and ``connected_blocks`` answer an empty list
    without asking its interchange, which would never answer (it exited or hung): Parsl's
    shutdown and status poll call them, and would wait for good.

    Its shutdown then leaves the task and command sockets open: a thread may be blocked for good
    sending on one (a retry launched as the interchange died: a socket with no peer blocks its
    sender), and closing a socket under a blocked sender aborts the process (a libzmq
    assertion). The two sockets of each lost interchange are left to the process's end, and kept
    referenced: a ZeroMQ context that is garbage-collected terminates itself, which waits for its
    open sockets for good.
    """
    executor.connected_managers = list
    executor.connected_blocks = list
    for name in ("outgoing_q", "command_client"):
        pipe = getattr(executor, name, None)
        if pipe is not None:
            pipe.close = _left_open
            _LEFT_OPEN.append(pipe)


#: The pipes of lost interchanges, left open (see :func:`disconnect`).
_LEFT_OPEN: list[Any] = []


def _left_open() -> None:
    """What closing a lost interchange's socket does: nothing (see :func:`disconnect`)."""


def interchange_managers(executor: Any, timeout_s: float = ANSWER_S) -> list[dict[str, Any]] | None:
    """The interchange's list of managers (each a dict with ``manager``, ``block_id``, ``tasks``,
    ``active``); None when it does not answer within ``timeout_s``, [] when its channel is closing.

    Asked from a thread of its own: Parsl's command channel has one lock, which Parsl's own status
    poller may hold forever while it waits for a hung interchange, and no timeout on taking it.
    """
    answer: list[Any] = []

    def ask() -> None:
        try:
            answer.append(executor.command_client.run("MANAGERS", timeout_s=timeout_s))
        except CommandClientTimeoutError:
            pass
        except Exception as exc:  # a closing channel: no news
            logger.warning("cannot list the managers of %s: %s", executor.label, exc)
            answer.append([])

    thread = threading.Thread(target=ask, name="interchange-managers", daemon=True)
    thread.start()
    thread.join(timeout_s + 1)
    return answer[0] if answer else None


def hold_managers(executor: Any, timeout_s: float = ANSWER_S) -> None:
    """Hold every manager of the executor (what Parsl's ``_hold_block`` does for one block's), each
    command with a timeout, the whole within about twice ``timeout_s``: Parsl's own waits for
    good on an interchange that does not answer."""

    def hold() -> None:
        for manager in interchange_managers(executor, timeout_s) or []:
            try:
                executor.command_client.run(["HOLD_MANAGER", manager["manager"]], timeout_s=timeout_s)
            except Exception:  # a closing channel, a timeout: the caller goes on
                continue

    thread = threading.Thread(target=hold, name="hold-managers", daemon=True)
    thread.start()
    thread.join(2 * timeout_s + 1)


def hold_block(executor: Any, block: str) -> None:
    """Put the block's managers on hold: the interchange sends them no more tasks, while the ones
    they run go on (Parsl's own ``_hold_block``, where the executor has one).

    Asked from a thread of its own and waited for at most :data:`HOLD_ANSWER_S`, and not at all
    once the interchange process exited: Parsl's command channel waits forever for an interchange
    that died (a fault may take the block's pool and the interchange at once), and the runner must
    go on to notice that and start Parsl again."""
    hold = getattr(executor, "_hold_block", None)
    if hold is None or interchange_exit(executor) is not None:
        return
    asking = threading.Thread(target=hold, args=(str(block),), name=f"hold-block-{block}", daemon=True)
    asking.start()
    deadline = time.monotonic() + HOLD_ANSWER_S
    while asking.is_alive() and time.monotonic() < deadline:
        asking.join(HOLD_LOOK_S)
        if asking.is_alive() and interchange_exit(executor) is not None:
            logger.warning("the interchange exited before it answered the hold of block %s", block)
            return
    if asking.is_alive():
        logger.warning("the interchange did not answer the hold of block %s within %.0f s", block, HOLD_ANSWER_S)


def mark_scaled_in(executor: Any, block: str) -> None:
    """Record ``block`` as scaled in, as Parsl's ``scale_in_facade`` does for the blocks it scales
    in (``_status`` and ``_simulated_status``): its block error handler then counts no failure,
    and its strategy replaces the block while tasks wait."""
    scaled_in = JobStatus(JobState.SCALED_IN)
    executor._status[str(block)] = scaled_in
    executor._simulated_status[str(block)] = scaled_in


def take_block(executor: Any, block: str) -> tuple[str, dict[str, Any]] | None:
    """Take ``block`` out of the executor (its job id and its provider's record of the job), so
    that the executor's shutdown leaves it running; None when it has no such block or record."""
    job_id = executor.blocks_to_job_id.get(block)
    resource = None if job_id is None else executor.provider.resources.get(job_id)
    if job_id is None or not isinstance(resource, dict):
        return None
    for table in (executor.blocks_to_job_id, executor._status, executor._simulated_status):
        table.pop(block, None)
    executor.job_ids_to_block.pop(job_id, None)
    del executor.provider.resources[job_id]
    return job_id, resource


def add_block(executor: Any, job_id: str, resource: dict[str, Any]) -> str:
    """Make the running job ``job_id`` (its provider's record ``resource``) a block of the
    executor, under the next block id the executor would have given (``_block_id_counter``): its
    strategy counts it, its status poll asks the provider about it, its shutdown cancels it."""
    block = str(executor._block_id_counter.get_id())
    executor.provider.resources[job_id] = resource
    executor.blocks_to_job_id[block] = job_id
    executor.job_ids_to_block[job_id] = block
    executor._status[block] = JobStatus(JobState.RUNNING)
    return block


def block_launch_command(executor: Any, block: str) -> str:
    """The command the executor launches ``block``'s worker pool with (``_get_launch_command``):
    its interchange's ports, its certificates, the block id and its log directory."""
    return str(executor._get_launch_command(block))


def job_record(provider: Any, job_id: str) -> dict[str, Any] | None:
    """The provider's record of job ``job_id`` (``resources[job_id]``, where the provider keeps
    one); None when it has none."""
    resources = getattr(provider, "resources", None)
    record = resources.get(job_id) if isinstance(resources, dict) else None
    return record if isinstance(record, dict) else None


def set_job_record(provider: Any, job_id: str, record: dict[str, Any]) -> bool:
    """Give the provider ``record`` for job ``job_id``: a provider's ``cancel`` and ``status``
    only know the jobs in its ``resources``. False for a provider that keeps none."""
    resources = getattr(provider, "resources", None)
    if not isinstance(resources, dict):
        return False
    resources[job_id] = record
    return True


def record_pid(record: dict[str, Any] | None) -> int | None:
    """The process id a LocalProvider's job record names (``remote_pid``); None if it names none."""
    pid = (record or {}).get("remote_pid")
    return pid if isinstance(pid, int) else None


def local_job_pid(provider: Any, job_id: str) -> int | None:
    """The process id a LocalProvider's job started as; None if unknown."""
    return record_pid(job_record(provider, job_id))


def local_job_script(provider: Any, job_id: str) -> str | None:
    """The submit script a LocalProvider's job runs (its record's ``script_path``); None if unknown."""
    script = (job_record(provider, job_id) or {}).get("script_path")
    return script if isinstance(script, str) else None


def foreign_job(job_id: str, pid: int | None = None, script_path: str | None = None, **extra: Any) -> dict[str, Any]:
    """A provider's record of a running job that another Parsl instance submitted, as the
    providers' ``cancel`` (and a LocalProvider's ``status``) read it: ``pid`` and ``script_path``
    for a LocalProvider's job, ``extra`` kept beside them (what the runner records of a block)."""
    record: dict[str, Any] = {
        "job_id": job_id,
        "status": JobStatus(JobState.RUNNING),
        "job_stdout_path": None,
        "job_stderr_path": None,
        **extra,
    }
    if pid is not None:
        record.update(remote_pid=pid, script_path=script_path)
    return record
