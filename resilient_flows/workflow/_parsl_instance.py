"""Start and stop the runner's Parsl instance through the faults that hit it.

A runner may start Parsl many times in one run: again after an interchange exited or hung, and
again while a full file system refuses its first files; a second Ctrl-C stops it at once.
Parsl's own ``load`` and ``cleanup`` assume a healthy interchange: ``load`` waits two minutes
for one that already exited, and ``cleanup`` joins a status poller that may wait for good on one
that hung. These wrap them so that each of those faults costs seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import parsl
from parsl.config import Config
from rich.console import Console
from rich.markup import escape

from resilient_flows.errors import WorkflowError, is_storage_full
from resilient_flows.rundir import FULL_WAIT_S, ROOM_LOOK_S, wait_for_room
from resilient_flows.sites._parsl import (
    close_parsl_logs,
    disconnect,
    interchange_answers,
    interchange_exit,
    kill_interchange,
    parsl_file_logs,
    quiet_when_full,
    shutdown_started,
    start_initial_blocks,
    watch_interchange_starts,
)
from resilient_flows.workflow._blocks import BlockLedger
from resilient_flows.workflow._interrupt import shielded
from resilient_flows.workflow._watchdog import interchange_gone

#: Seconds Parsl has to shut down an instance whose interchange was lost: its own work (the dead
#: interchange reaped, blocks cancelled) takes well under a second; what takes longer is a thread
#: stuck in a request to the lost interchange, which never returns, while members wait to resume.
ABANDON_S = 5.0
#: The same where the interchange exited: nothing can answer, so any wait past its own work (under
#: a millisecond before it joins the status poller) is lost; the blocks are then cancelled here.
ABANDON_EXITED_S = 0.2

#: Bytes a try to start Parsl on a full file system waits for: its keys, scripts and first log
#: lines. The next try comes once they fit, so that a Parsl instance lost while the disk is full
#: starts again as soon as space returns, without a numbered run directory per blind try.
PARSL_START_BYTES = 64 << 10
#: Starts of Parsl in a row whose interchange exited as it started, before the runner gives up:
#: one is a fault (a killed process); every one, an interchange that cannot run here.
INTERCHANGE_START_TRIES = 3


def load_parsl(config: Config, fresh: Callable[[], Config], console: Console) -> tuple[Any, Config]:
    """``parsl.load(config)``, waiting out a full file system under the run directory (Parsl
    writes its keys and scripts there first: a runner resumed while the shared tier is full would
    die of it), and starting again where an interchange exited as it started (a fault, up to
    :data:`INTERCHANGE_START_TRIES` in a row), with a ``fresh`` config for each new try; the DFK
    and the config it runs."""
    deadline = time.monotonic() + FULL_WAIT_S
    exits = 0
    while True:
        try:
            with shielded(), watch_interchange_starts(config.executors):  # shielded: see _interrupt
                dfk = parsl.load(config)
        except Exception as exc:  # HTEX raises a bare Exception for an interchange that never answered
            gone = [(e, why) for e in config.executors if (why := interchange_gone(e)) is not None]
            exited = gone[0][1] if gone else None
            if exited is not None:
                exits += 1
                if exits >= INTERCHANGE_START_TRIES:
                    message = f"{exited} as Parsl started, {exits} times in a row: see its log in {config.run_dir}"
                    raise WorkflowError(message) from exc
                console.print(f"[yellow]{escape(exited)} as Parsl started: starting it again[/]")
                for executor, _ in gone:
                    disconnect(executor)
            elif is_storage_full(exc) and time.monotonic() < deadline:
                console.print(f"[yellow]cannot start Parsl ({escape(str(exc))}): waiting for space[/]")
            else:
                raise
            close_parsl_logs(parsl_file_logs(config.run_dir))
            parsl.clear()
            if exited is None:
                wait_for_room(config.run_dir, PARSL_START_BYTES, deadline)
                time.sleep(ROOM_LOOK_S)  # at least this between tries, should the look see room that is not there
            config = fresh()
            continue
        quiet_when_full(parsl_file_logs(config.run_dir), is_storage_full)
        start_initial_blocks(dfk)
        return dfk, config


def abandon_parsl(dfk: Any, executors: Sequence[Any]) -> None:
    """Shut a Parsl instance whose interchange exited or hung: its blocks are cancelled through
    their providers, and nothing waits for the lost interchange's answers.

    Parsl's shutdown joins its status poller, which may be stuck for good in a request to a hung
    interchange; it runs in a thread of its own, and past :data:`ABANDON_S` the blocks are
    cancelled here instead. An interchange that exited answers nothing: a poll that asked it
    before it died waits for good, so its shutdown gets :data:`ABANDON_EXITED_S` only.
    """
    wait_s = ABANDON_S
    for executor in executors:
        exited = interchange_exit(executor) is not None
        if exited or not interchange_answers(executor):
            if exited:
                wait_s = ABANDON_EXITED_S
            if kill_interchange(executor):
                disconnect(executor)  # the interchange would never answer
    if shutdown_started(dfk):  # a second Ctrl-C in the middle of its shutdown: Parsl refuses another
        return
    shutdown = threading.Thread(target=dfk.cleanup, name="abandon-parsl", daemon=True)
    shutdown.start()
    shutdown.join(wait_s)
    if shutdown.is_alive():
        for executor in executors:
            jobs = list(getattr(executor, "blocks_to_job_id", {}).values())
            if jobs and executor.provider is not None:
                executor.provider.cancel(jobs)


def kill_parsl(dfk: Any, executors: Sequence[Any], ledger: BlockLedger) -> None:
    """Stop a Parsl instance at once (a second Ctrl-C): its blocks and interchange killed, with
    every process of theirs, then what is left of Parsl shut down as for a lost interchange."""
    ledger.cancel_own(executors)
    for executor in executors:
        kill_interchange(executor, wait_s=ABANDON_S)
    abandon_parsl(dfk, executors)
