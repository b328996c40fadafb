"""What resilient-flows relies on inside Parsl's ``HighThroughputExecutor`` worker pool (see the package's docstring).

Warm workers (see :mod:`resilient_flows.sites._warmpool`) start Parsl's own worker pool with two
changes, both made from outside, in the pool's process only:

- its workers are forked from a fork server that imported torch, resilient-flows and the
  members' workloads once, instead of spawned as fresh interpreters that import them again;
- its watchdog, which restarts a dead worker and reports the task it held as ``WorkerLost``,
  wakes when a worker exits, instead of at its next ``heartbeat_period``;
- a worker found stopped (hung, see :mod:`resilient_flows.sites._hung`) is killed, and the task
  it held reported as ``WorkerHung``; the watchdog then starts another worker in its place.
- a standby pool whose go file names an environment (the token of the runner that took it over)
  sets it in each worker before Parsl's ``worker`` runs: its fork server started earlier, with
  the environment of the runner before.

Everything else (arguments, logging, the manager, task dispatch, the lost task's report) is
Parsl's own code. Tested with Parsl :data:`~resilient_flows.sites._parsl.TESTED_PARSL`. The
internals relied on, each checked where it is used so that a Parsl that changed one fails the
pool's start with a clear error instead of running it differently:

- ``parsl.executors.high_throughput.executor.DEFAULT_LAUNCH_CMD`` starts with the pool's script,
  ``process_worker_pool.py``, followed by its arguments: the warm launch command keeps the
  arguments and replaces the script.
- ``process_worker_pool`` (the module) names ``SpawnContext`` as a module global, and ``Manager``
  makes its queues, shared values and ``multiprocessing`` manager from it (``Queue``, ``Value``,
  ``Manager``, ``cpu_count``) and, in ``Manager._start_worker``, its workers
  (``SpawnContext.Process(target=worker, ...)``, the module-level ``worker``): the pool's global
  is replaced by a context that makes processes with the fork server and everything else as
  before.
- ``Manager.worker_watchdog`` loops on ``self._stop_event.wait(self.heartbeat_period)``, then
  checks every worker's ``is_alive()``; ``self._stop_event`` is a ``threading.Event`` made in
  ``Manager.__init__`` and also waited on without a timeout by ``Manager.start``. The pool's
  ``Manager`` becomes a subclass whose event's timed wait also returns when a worker exits.
- ``Manager.worker_watchdog(procs)`` is given the dict of worker id -> process that it keeps
  (replacing a dead worker's entry); ``Manager._tasks_in_progress`` maps a busy worker's id to
  its task (a dict with ``task_id``), the entry popped by whoever reports the task; a task's
  failure is reported by putting ``pickle.dumps({'type': 'result', 'task_id': ..., 'exception':
  serialize(RemoteExceptionWrapper(...))})`` on ``Manager.pending_result_queue``, as the
  watchdog does for a dead worker. A hung worker's entry is popped before it is killed, so that
  the watchdog, which finds it dead next, takes it for an idle worker and only replaces it.
- Tools that find a run's pools by ``process_worker_pool`` in a process's command line (the chaos
  benchmark, the watchdog's tests) find warm pools too: their command line names the module
  :data:`POOL_MODULE`, the first of :data:`DEFAULT_PRELOAD`.
  A warm pool's workers are the children of its fork server (``multiprocessing.forkserver`` in
  their command line), itself a child of the pool.
- The module's ``if __name__ == "__main__":`` block parses ``sys.argv``, sets the module global
  ``args`` (which ``_start_worker`` reads), configures logging and runs ``Manager(...).start()``:
  it is run unchanged, in the imported module's namespace.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import json
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import os
import pickle
import platform
import re
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from resilient_flows.errors import SiteConfigError
from resilient_flows.sites._hung import LOOK_S, HangWatch, WorkerHung
from resilient_flows.sites._parsl._version import TESTED_PARSL

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_PRELOAD",
    "POOL_MODULE",
    "POOL_PRELOAD",
    "POOL_SCRIPT",
    "STANDBY_FLAG",
    "TRAINING_PRELOAD",
    "WARM_MODULE",
    "go_file",
    "is_standby",
    "is_warm",
    "read_go",
    "run_pool",
    "set_preload",
    "split_argv",
    "tell_go",
    "warm_launch_cmd",
]

#: The script HTEX's default launch command starts.
POOL_SCRIPT = "process_worker_pool.py"
#: The module of Parsl's worker pool: its workers' code, and what names a pool on its command line.
POOL_MODULE = "parsl.executors.high_throughput.process_worker_pool"
#: The module a warm launch command runs instead.
WARM_MODULE = "resilient_flows.sites._warmpool"
_PRELOAD_FLAG = "--preload"
#: What makes a warm pool a standby: warm, it waits for its go file before it joins the interchange.
STANDBY_FLAG = "--standby"
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
#: What every warm pool imports once: the pool's own module (its workers' code) and what each
#: attempt imports in its worker before anything else (the apps and the member runtime). A command
#: member's or a multi-rank member's worker needs no more: it starts the processes that import
#: torch.
POOL_PRELOAD = (POOL_MODULE, "resilient_flows.apps", "resilient_flows.training")
#: What a pool whose workers train or evaluate in their own process imports too: torch, what torch
#: imports on first use (``torch._dynamo``: any optimizer's constructor, about 1.5 s on an idle
#: core), numpy's RNGs, the in-worker runtime and the built-in workloads. About 4 s of CPU per
#: pool, spent for nothing where no worker trains: the runner leaves it out there.
TRAINING_PRELOAD = (
    "torch",
    "torch._dynamo",
    "numpy.random",
    "resilient_flows.training._run",
    "resilient_flows.training._workloads",
)
#: What a site's warm pools import, where no runner says what its members need (a Parsl script).
DEFAULT_PRELOAD = (*POOL_PRELOAD, *TRAINING_PRELOAD)


def warm_launch_cmd(preload: Sequence[str], standby: bool = False) -> str:
    """HTEX's default ``launch_cmd`` with the pool started by :data:`WARM_MODULE`, which preloads
    ``preload`` (module names) in its fork server; with ``standby``, each pool then waits for its
    :func:`go_file` before it joins the interchange (see :mod:`resilient_flows.workflow._standby`).
    The interpreter is the ``python3`` on the block's ``PATH``, as the default's script is found
    there (``run`` puts its own first)."""
    from parsl.executors.high_throughput.executor import DEFAULT_LAUNCH_CMD

    if not DEFAULT_LAUNCH_CMD.startswith(POOL_SCRIPT + " "):
        raise SiteConfigError(
            f"warm_workers: this Parsl's HighThroughputExecutor launch command does not start with {POOL_SCRIPT} "
            f"(tested with Parsl {', '.join(TESTED_PARSL)}); set warm_workers: false"
        )
    modules = ",".join(dict.fromkeys(preload))
    flag = f" {STANDBY_FLAG}" if standby else ""
    return f"python3 -m {WARM_MODULE} {_PRELOAD_FLAG} {modules}{flag} -- " + DEFAULT_LAUNCH_CMD[len(POOL_SCRIPT) + 1 :]


def is_warm(executor: Any) -> bool:
    """Whether ``executor``'s blocks start warm worker pools."""
    return f" -m {WARM_MODULE} " in str(getattr(executor, "launch_cmd", None) or "")


def set_preload(executor: Any, modules: Sequence[str]) -> None:
    """Have ``executor``'s warm pools preload ``modules`` (after :data:`POOL_PRELOAD`, which every
    pool imports) instead of what the site gave them; nothing for an executor that is not warm.
    Call it before the executor starts: its launch command is composed then. Only dotted Python
    names are kept: the launch command goes through a shell, and anything else is no module a
    worker could import anyway."""
    if not is_warm(executor):
        return
    names = [m for m in modules if _MODULE_NAME.fullmatch(m)]
    before, flag, rest = executor.launch_cmd.partition(f" {_PRELOAD_FLAG} ")
    _, _, tail = rest.partition(" ")
    listed = ",".join(dict.fromkeys([*POOL_PRELOAD, *names]))
    executor.launch_cmd = f"{before}{flag}{listed} {tail}"


def is_standby(executor: Any) -> bool:
    """Whether ``executor``'s blocks start as warm standby pools, each waiting for its go file."""
    return is_warm(executor) and f" {STANDBY_FLAG} -- " in str(executor.launch_cmd)


def go_file(logdir: str | os.PathLike[str], block: str) -> str:
    """Where the runner tells the standby pool of ``block`` (whose ``--logdir`` is ``logdir``: one
    per Parsl instance and executor) to join the interchange."""
    return os.path.join(logdir, "standby", f"go-{block}")


def tell_go(path: str | os.PathLike[str], launch_cmd: str = "", environ: Mapping[str, str] | None = None) -> None:
    """Create the go file ``path``: its standby pool joins the interchange, with the arguments of
    ``launch_cmd`` where given (a pool that another Parsl instance adopted) and ``environ`` set in
    it and in its workers (the token of a runner that took the run over). The file is renamed into
    place whole: the pool reads it once it exists."""
    ready = f"{os.fspath(path)}.new"
    os.makedirs(os.path.dirname(ready), exist_ok=True)
    with open(ready, "w") as handle:
        if launch_cmd or environ:
            json.dump({"launch_cmd": launch_cmd, "environ": dict(environ or {})}, handle)
    os.replace(ready, path)


def read_go(path: str | os.PathLike[str], pool_argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The pool's arguments and the environment to add, from the go file ``path`` (see
    :func:`tell_go`): those of its launch command, else ``pool_argv``."""
    with open(path) as handle:
        text = handle.read()
    if not text.strip():
        return list(pool_argv), {}
    told = json.loads(text)
    launch_cmd, environ = told.get("launch_cmd") or "", told.get("environ") or {}
    argv = split_argv(shlex.split(launch_cmd)[3:])[2] if launch_cmd else list(pool_argv)
    return argv, {str(k): str(v) for k, v in environ.items()}


def split_argv(argv: Sequence[str]) -> tuple[list[str], bool, list[str]]:
    """The modules to preload, whether the pool is a standby, and the pool's own arguments, from a
    warm pool's command line."""
    argv = list(argv)
    standby = len(argv) > 2 and argv[2] == STANDBY_FLAG
    if standby:
        del argv[2]
    if len(argv) < 3 or argv[0] != _PRELOAD_FLAG or argv[2] != "--":
        raise SystemExit(
            f"usage: python -m {WARM_MODULE} {_PRELOAD_FLAG} MOD[,MOD...] [{STANDBY_FLAG}] -- POOL-ARGUMENTS"
        )
    return [m for m in argv[1].split(",") if m], standby, argv[3:]


def run_pool(
    argv: Sequence[str],
    forkserver: multiprocessing.context.ForkServerContext,
    ensure_server: Callable[[], None],
    environ: Mapping[str, str] | None = None,
) -> None:
    """Run Parsl's worker pool with ``argv`` (its own arguments), its workers made by
    ``forkserver`` (a ``forkserver`` context whose preload is set) and noticed when they exit.
    ``environ`` is set in each worker: the fork server, started before a standby's go file told
    it, passes its own environment on. ``ensure_server`` is called before each worker starts (a
    fork server that died is started again, preloading)."""
    from parsl.executors.high_throughput import process_worker_pool as pool

    main = _main_block(pool)
    for name in ("SpawnContext", "Manager", "worker"):
        if not hasattr(pool, name):
            raise RuntimeError(f"Parsl's process_worker_pool has no {name} (tested with Parsl {TESTED_PARSL})")
    # the pool module imports SpawnContext from parsl.multiprocessing: not an export to type checkers
    spawn = pool.SpawnContext  # pyright: ignore[reportPrivateImportUsage]
    workers = _WorkerContext(spawn, forkserver, ensure_server, dict(environ or {}))
    pool.SpawnContext = workers  # pyright: ignore[reportPrivateImportUsage]
    pool.Manager = _waking_manager(pool.Manager, workers)
    sys.argv = [POOL_SCRIPT, *argv]
    exec(main, pool.__dict__)


def _main_block(module: ModuleType) -> Any:
    """The compiled body of ``module``'s ``if __name__ == "__main__":`` block."""
    tree = ast.parse(inspect.getsource(module))
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) and "__name__" in ast.unparse(node.test):
            return compile(ast.Module(body=node.body, type_ignores=[]), module.__file__ or "<pool>", "exec")
    raise RuntimeError(f"Parsl's process_worker_pool has no __main__ block (tested with Parsl {TESTED_PARSL})")


class _WorkerContext:
    """The pool's ``SpawnContext``: processes from the fork server, everything else (queues,
    values, the ``multiprocessing`` manager, which workers reach by pickle) from ``spawn`` as
    before. It remembers the workers it started, for :class:`_WakingEvent` to wait on."""

    def __init__(
        self,
        spawn: Any,
        forkserver: multiprocessing.context.ForkServerContext,
        ensure_server: Callable[[], None],
        environ: dict[str, str],
    ) -> None:
        self._spawn = spawn
        self._forkserver = forkserver
        self._environ = environ
        self._ensure_server = ensure_server
        self._started: list[Any] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spawn, name)

    def Process(self, *args: Any, **kwargs: Any) -> Any:
        """A worker process from the fork server (started by the pool), remembered."""
        if self._environ and "target" in kwargs:
            kwargs["target"] = functools.partial(_in_environ, self._environ, kwargs["target"])
        with self._lock:
            self._ensure_server()
            process = self._forkserver.Process(*args, **kwargs)
            self._started.append(process)
        return process

    def sentinels(self) -> list[int]:
        """The sentinels of the started workers still running; those that ended or were closed
        are forgotten."""
        live, kept = [], []
        with self._lock:
            for process in self._started:
                try:
                    if process.exitcode is not None:
                        continue
                    kept.append(process)
                    if process.pid is not None:
                        live.append(process.sentinel)
                except ValueError:  # closed by the pool at its end
                    continue
            self._started = kept
        return live


def _in_environ(environ: dict[str, str], target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    os.environ.update(environ)
    return target(*args, **kwargs)


class _WakingEvent(threading.Event):
    """The manager's stop event: a timed wait (the watchdog's) also returns when a worker exits,
    so that its task is reported lost and the worker replaced at once."""

    def __init__(self, workers: _WorkerContext) -> None:
        super().__init__()
        self._workers = workers
        self._wake_r, self._wake_w = os.pipe()

    def set(self) -> None:
        super().set()
        os.write(self._wake_w, b"x")

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None or self.is_set():
            return super().wait(timeout)
        multiprocessing.connection.wait([self._wake_r, *self._workers.sentinels()], timeout)
        return self.is_set()


def _waking_manager(base: type, workers: _WorkerContext) -> type:
    """Parsl's ``Manager`` with a :class:`_WakingEvent` as its stop event."""

    class WarmManager(base):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if not isinstance(getattr(self, "_stop_event", None), threading.Event):
                raise RuntimeError(f"Parsl's Manager has no _stop_event (tested with Parsl {TESTED_PARSL})")
            self._stop_event = _WakingEvent(workers)

        def worker_watchdog(self, procs: dict[int, Any]) -> None:
            """Parsl's watchdog, with a thread beside it that kills hung workers (see :func:`_watch_hung`)."""
            watch = threading.Thread(target=_watch_hung, args=(self, procs), name="hung-workers", daemon=True)
            watch.start()
            super().worker_watchdog(procs)

    WarmManager.__name__ = WarmManager.__qualname__ = base.__name__
    return WarmManager


def _watch_hung(manager: Any, procs: dict[int, Any]) -> None:
    """Until the pool stops: every :data:`LOOK_S`, kill the workers among ``procs`` (worker id ->
    process, kept by Parsl's watchdog) that :class:`HangWatch` finds hung, and report their tasks."""
    watch = HangWatch()
    # threading.Event's own wait: the stop event's would poll the workers (see _WakingEvent), and a
    # forkserver process polled from two threads at its exit can block one of them for good
    while not threading.Event.wait(manager._stop_event, LOOK_S):
        try:
            workers = {p.pid: worker_id for worker_id, p in list(procs.items()) if p.pid is not None}
        except RuntimeError:  # the watchdog replaced a worker meanwhile: look again next time
            continue
        for pid, stopped_s in watch.look(workers).items():
            _kill_hung(manager, workers[pid], pid, stopped_s)


def _kill_hung(manager: Any, worker_id: int, pid: int, stopped_s: float) -> None:
    """Kill the hung worker ``pid`` and report the task it held as :class:`WorkerHung`. The task is
    taken from the pool's books first (a stopped worker cannot report it meanwhile), so that
    Parsl's watchdog, which finds the worker dead, only starts another."""
    from parsl.app.errors import RemoteExceptionWrapper
    from parsl.serialize import serialize

    task = manager._tasks_in_progress.pop(worker_id, None)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    logger.error("Worker %s (pid %s) was stopped for %.1f s: killed", worker_id, pid, stopped_s)
    if task is None:
        return
    try:
        raise WorkerHung(worker_id, platform.node(), round(stopped_s, 1))
    except WorkerHung as hung:
        package = {
            "type": "result",
            "task_id": task["task_id"],
            "exception": serialize(RemoteExceptionWrapper(type(hung), hung, hung.__traceback__)),
        }
    manager.pending_result_queue.put(pickle.dumps(package))
