"""Heartbeats: how the runner tells a running attempt from a dead, frozen or orphaned one.

A task that dies loudly (an exception, a worker Parsl sees exit) is handled by Parsl's retries. The
worst failures are silent: a worker stopped by a hung node, a worker pool whose main thread died
while its heartbeat thread still answers the interchange, a pilot job whose tasks never start.
Each running attempt therefore rewrites one small file in the run's heartbeat folder, named after its task, from a
background thread (a long step, a slow collective or a checkpoint flush still beats); the runner's
watchdog (:mod:`resilient_flows.workflow._watchdog`) declares the attempt lost when the file stops
changing for longer than its stall timeout.

Each beat is one ``pwrite`` of a fixed-size record at offset 0: no rename, no extra metadata
operation on the shared file system, and the record says who beats (attempt, pid, host, Parsl
block), how fast the task progresses (its step, seconds per step and per checkpoint commit), from
which the runner derives the stall timeout and its block's drain margin, and the newest checkpoint
this attempt committed in any tier: the retry handler counts a lost attempt that committed one as
progress even when that checkpoint was node-local and went with its node. A reader may rarely see a
record being rewritten; it keeps the last one it could parse.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from resilient_flows.capped import CONTROL_CAP
from resilient_flows.errors import Superseded
from resilient_flows.rundir._block import current_block
from resilient_flows.rundir._files import read_json
from resilient_flows.rundir._layout import run_layout
from resilient_flows.rundir._lease import orphaned, superseded

logger = logging.getLogger(__name__)

#: Seconds between beats. A stall timeout must be several of these.
BEAT_S = 2.0

#: Seconds between two looks at the attempt's worker pool (:class:`PoolLook`): a lost pool is
#: written into the next beat at once, for the runner to see within its next look.
POOL_LOOK_S = 0.5

#: Least size of every record: space-padded JSON, so that a rewrite never leaves a longer old tail.
RECORD_BYTES = 512


class PoolLook(Protocol):
    """What a heartbeat asks of the worker pool that runs its attempt (the member's side finds the
    pool: :class:`~resilient_flows.training._pool.PoolWatch`)."""

    def lost(self) -> str | None:
        """Why the pool can no longer run this attempt; None while it can."""
        ...

    def process(self) -> dict[str, int] | None:
        """The pool process's ``pid`` and ``started`` (clock ticks after boot), written into every
        beat so that a runner on the same host looks at it too: the attempts of a killed pool may
        die before their next look. None when there is none to name."""
        ...


def analytics_task(request: str) -> str:
    """The heartbeat name of an analytics request's task: ``@`` keeps it apart from member names."""
    return f"analytics@{request}"


def attempt_heartbeat_path(run_dir: str | os.PathLike, task: str) -> Path:
    return run_layout(run_dir).heartbeat(task)


def read_attempt_heartbeat(path: Path) -> dict[str, Any] | None:
    """The record in a heartbeat file, or None when it is absent, being rewritten or oversized."""
    try:
        record = read_json(path, CONTROL_CAP, "heartbeat")
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


class Heartbeat:
    """Beats for one attempt of one task while it runs; a context manager.

    A retry beats from the moment its worker takes it, while it waits out its backoff too
    (``waiting_s``: how long; ``attempt`` None, as the attempt is counted when it starts): its
    block holds the task, and a block that holds tasks none of which beats is declared lost.

    :meth:`progress` is called by the task at each step (an attribute store, nothing else); the
    beating thread turns it into a step rate. On a clean exit, any exception included, the file
    is removed, so that a finished or failed attempt is never mistaken for a silent one; a killed
    process leaves its file to go stale, which is the point, and so does an attempt whose pool
    was lost (see below).

    Each beat also looks at the runner's lease (:mod:`~resilient_flows.rundir._lease`): once the
    runner has been gone longer than its orphan timeout, ``on_orphaned(reason)`` is called, once,
    from the beating thread; the attempt then commits a checkpoint and stops.

    A task whose runner was superseded (a ``resume`` took the run over) never beats on: once its
    file exists, :meth:`start` looks at the lease once more and raises :class:`Superseded`,
    removing the file (see :func:`~resilient_flows.rundir._lease.superseded`).

    Given ``pool``, every :data:`POOL_LOOK_S` seconds the thread also looks at the Parsl worker pool
    that runs the attempt (:class:`PoolLook`; None: nothing is watched). Once it is gone, the attempt beats
    at once with ``pool_lost`` (why) in its record, which the runner's watchdog takes for its
    block's loss at its next look, and ``on_pool_lost(reason)`` is called, once: the attempt
    records the machine's fault and stops as for an orphaned runner.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        task: str,
        attempt: int | None,
        beat_s: float = BEAT_S,
        on_orphaned: Callable[[str], None] | None = None,
        waiting_s: float | None = None,
        on_pool_lost: Callable[[str], None] | None = None,
        pool: PoolLook | None = None,
    ) -> None:
        self.path = attempt_heartbeat_path(run_dir, task)
        self.run_dir = Path(run_dir)
        self.beat_s = beat_s
        self.on_orphaned = on_orphaned
        self.on_pool_lost = on_pool_lost
        self.pool = pool
        self._pool_lost: str | None = None
        self._fixed = {
            "task": task,
            "attempt": attempt,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "block": current_block(),
            "started": round(time.time(), 3),
            **({} if waiting_s is None else {"waiting_s": waiting_s}),
            **({} if pool is None or (process := pool.process()) is None else {"pool": process}),
        }
        self._step: int | None = None
        self._committed: int | None = None
        self._commit_s: float | None = None
        self._first: tuple[int, float] | None = None  # (step, time) of the first progress seen
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        self._size = RECORD_BYTES

    def progress(self, step: int) -> None:
        self._step = step

    def committed(self, step: int, seconds: float | None = None) -> None:
        """This attempt committed a checkpoint of ``step`` in some tier (from the writer's thread),
        ``seconds`` after it was saved: the runner drains the member's block that long before its end."""
        self._committed = step if self._committed is None else max(self._committed, step)
        if seconds is not None:
            self._commit_s = seconds

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Heartbeat:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._beat()
        refused = superseded(self.run_dir)
        if refused is not None:
            self._withdraw()
            raise Superseded(f"task {self._fixed['task']}: {refused}")
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self._fixed['task']}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating and remove the file (kept once the pool was found lost: the runner learns
        it there, and the retry handler removes it). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._pool_lost is None:
            self.path.unlink(missing_ok=True)

    def _withdraw(self) -> None:
        """Close and remove the file this attempt created, unless another process has replaced it since."""
        assert self._fd is not None
        mine = os.fstat(self._fd).st_ino
        os.close(self._fd)
        self._fd = None
        with contextlib.suppress(OSError):
            if self.path.stat().st_ino == mine:
                self.path.unlink()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(min(self.beat_s, POOL_LOOK_S)):
            lost = self._look_at_pool()
            if not lost and time.monotonic() - last < self.beat_s:
                continue
            last = time.monotonic()
            with contextlib.suppress(OSError):  # a full or stalled file system: the runner will see the silence
                self._beat()
            if lost:
                self._tell("on_pool_lost", self._pool_lost)
            if self.on_orphaned is not None:
                reason = orphaned(self.run_dir)
                if reason is not None:
                    self._tell("on_orphaned", reason)

    def _look_at_pool(self) -> bool:
        """Whether the pool was found lost at this look (and not before)."""
        if self._pool_lost is not None or self.pool is None:
            return False
        self._pool_lost = self.pool.lost()
        return self._pool_lost is not None

    def _tell(self, which: str, reason: str | None) -> None:
        """Call the callback ``which`` once, with ``reason``; never raises: the beats must go on,
        or a silent attempt would be declared lost."""
        tell = getattr(self, which)
        if tell is None or reason is None:
            return
        setattr(self, which, None)
        try:
            tell(reason)
        except Exception:
            logger.exception("task %s: could not stop (%s)", self._fixed["task"], reason)

    def _beat(self) -> None:
        now = time.monotonic()
        step = self._step
        step_s = None
        if step is not None:
            if self._first is None:
                self._first = (step, now)
            elif step > self._first[0]:
                step_s = round((now - self._first[1]) / (step - self._first[0]), 6)
        record = {
            **self._fixed,
            "time": round(time.time(), 3),
            "step": step,
            "step_s": step_s,
            "committed": self._committed,
            "commit_s": None if self._commit_s is None else round(self._commit_s, 6),
            **({} if self._pool_lost is None else {"pool_lost": self._pool_lost}),
        }
        data = json.dumps(record, separators=(",", ":")).encode()
        self._size = max(self._size, len(data))
        assert self._fd is not None
        os.pwrite(self._fd, data.ljust(self._size), 0)
