"""What a warm pool's fork server imports once, so that its workers start with it imported.

The fork server imports this module as it starts (its only preload): this module imports each
module named in ``$RESILIENT_FLOWS_WARM_PRELOAD`` (comma-separated), and takes the variable out
of the environment, so that nothing the workers start preloads again. One that cannot be imported
is left to the worker that needs it, which imports it then and fails the member with that error
if it must: a broken workload module must not take the pool's fork server, and every worker with
it, down. Anything that starts a thread at import would be copied half-alive into every forked
worker (see :mod:`resilient_flows.sites._warmpool`): this is checked around the imports, and said
on stderr, which the pool's block log keeps. Each forked worker dies with the fork server.

A standby pool's fork server imports at the lowest CPU priority, in a thread of its own niced to 19
(a Linux nice value is a thread's): its imports take the cores only while the members beside it
leave them idle. ``$RESILIENT_FLOWS_WARM_IDLE`` names the file in which it says so: its process
id as it starts, ``ready`` once done. The thread has ended before the first fork, and each worker
is forked from the main thread, at the priority it always had.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import signal
import sys
import threading
from pathlib import Path

from resilient_flows.sites._typechecks import skip_type_checks

#: The variable naming the modules to import.
PRELOAD_VARIABLE = "RESILIENT_FLOWS_WARM_PRELOAD"
#: The variable naming the file of a fork server that imports at the lowest priority (see above).
IDLE_VARIABLE = "RESILIENT_FLOWS_WARM_IDLE"
#: What that file holds once the imports are done, after the process id.
READY = "ready"
#: Imported first, their threads not counted: see :func:`preload`.
_FORK_SAFE = ("numpy", "scipy.linalg")
#: Threads not counted, by name: jemalloc's background thread (the allocator of pyarrow, which
#: pandas imports where it is installed, and scikit-learn imports pandas), which jemalloc's own
#: fork handlers make safe.
_FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})


def preload(modules: list[str]) -> tuple[list[str], int]:
    """Import ``modules``: the ones that failed, each with why, and how many threads they started.

    numpy and SciPy's linear algebra (where installed: scikit-learn imports it, and so may any
    workload module) are imported first and their threads are not counted: each one's OpenBLAS
    starts its pool at import, and stops and restarts it around a fork (``pthread_atfork``), so it
    is fork-safe."""
    for fork_safe in _FORK_SAFE:
        with contextlib.suppress(ImportError):
            importlib.import_module(fork_safe)
    before = _threads()
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # a workload's import may raise anything, SystemExit too
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    return failed, _threads() - before


def _die_with_the_server() -> None:
    """In each forked worker: be killed when the fork server ends. The pool would take a worker
    whose server was killed for a dead one (its exit status comes through the server) and send
    its task again, while the orphan trained on: two attempts of one member at once."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: no such guard
        return


def _threads() -> int:
    """The threads of this process, the interpreter's and any native ones, but for those known to
    be fork-safe by name (:data:`_FORK_SAFE_THREADS`)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return threading.active_count()
    return sum(_thread_name(task) not in _FORK_SAFE_THREADS for task in tasks)


def _thread_name(task: str) -> str:
    try:
        return Path(f"/proc/self/task/{task}/comm").read_text().strip()
    except OSError:  # it ended meanwhile
        return ""


def _report(failed: list[str], started: int) -> None:
    """Say on stderr (the block's log) what was not preloaded, and any threads started. Never
    raises: on a full disk the write fails, and an error here would end the fork server, whose
    replacement would fork workers that import everything again."""
    lines = [f"resilient-flows warm pool: not preloaded, imported by each worker instead: {line}" for line in failed]
    if started > 0:
        lines.append(
            f"resilient-flows warm pool: the preloaded modules started {started} thread(s) in the fork server; "
            "workers forked from it may hang on a lock one of them held"
        )
    with contextlib.suppress(OSError):
        for line in lines:
            print(line, file=sys.stderr, flush=True)


def _preload_idle(modules: list[str], path: str) -> None:
    """:func:`preload` and :func:`_report` in a thread niced to 19, ``path`` saying how far it got.
    A module that needs the main thread to import (one that sets a signal handler) fails here
    and is left to the workers, as any other that fails."""

    def imports() -> None:
        if sys.platform.startswith("linux"):  # elsewhere a thread's id is no process id to renice
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        _report(*preload(modules))

    with contextlib.suppress(OSError), open(path, "w") as said:
        said.write(f"{os.getpid()}\n")
    thread = threading.Thread(target=imports, name="resilient-flows-preload")
    thread.start()
    thread.join()
    with contextlib.suppress(OSError), open(path, "a") as said:
        said.write(f"{READY}\n")


_NAMED = os.environ.pop(PRELOAD_VARIABLE, "")  # read once, by the fork server: its workers do not see it
_IDLE = os.environ.pop(IDLE_VARIABLE, "")
if _NAMED:  # the pool's module imports Parsl
    skip_type_checks()
if _NAMED and _IDLE:
    _preload_idle([m for m in _NAMED.split(",") if m], _IDLE)
elif _NAMED:
    _report(*preload([m for m in _NAMED.split(",") if m]))
if _NAMED:
    os.register_at_fork(after_in_child=_die_with_the_server)
