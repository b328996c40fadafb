"""A warm worker pool: ``python3 -m resilient_flows.sites._warmpool --preload MOD,... -- ARGS``.

Parsl's worker pool (``process_worker_pool.py ARGS``) spawns each worker as a new interpreter,
which imports Parsl, torch and the member's workload again before it trains: about two seconds
per restarted member on an idle core, many more on a busy node or a parallel file system. Here
the pool's workers are forked from a fork server that imported them once, at the pool's start
(:mod:`resilient_flows.sites._preload`): a worker that replaces a killed one, and every idle
worker a retry is sent to, starts with them imported. See
:mod:`resilient_flows.sites._parsl` for how Parsl's pool is changed.

Why a fork server, not ``fork`` from the pool's manager: the manager runs threads (ZeroMQ,
Parsl's own) and forking a threaded process copies locks held by threads that do not exist in
the child. The fork server only imports, never runs a torch operation, so it starts no threads
(no OpenMP or intra-op pool, no gloo, and CUDA is never initialised: importing torch does not
initialise it). Each worker then makes its own threads and, on a GPU, its own CUDA context, after
the fork, with the ``CUDA_VISIBLE_DEVICES`` the pool gives it. (numpy's OpenBLAS starts its
threads at import, and is fork-safe: it stops and restarts them around a fork.) A workload
module that starts threads or touches a device at import time breaks this: :mod:`resilient_flows.sites._preload`
says so on the pool's stderr.

A standby pool (``--standby``, a site's ``standby_pool: true``) does all of that, imports the pool's
own module too, and then waits, unknown to the interchange, until the runner creates its go file
(:func:`~resilient_flows.sites._parsl.go_file`): a block whose pool is lost is replaced
by one that is already started and preloaded (see :mod:`resilient_flows.workflow._standby`).
Its fork server imports at the lowest CPU priority (:mod:`resilient_flows.sites._preload`): on the
machine it shares with the members, the standby takes no core they use, and it costs nothing in
a run that ends before the cores were idle long enough. Should the go file come before it is
done, it is replaced by one that imports at the usual priority, as a block started cold would.
A go file that holds a launch command (a standby adopted by the Parsl instance that replaced a
lost interchange, or by the runner that resumed a killed one) gives the pool's arguments to run
with instead of its own, and the environment to add (the resuming runner's token).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import time
from collections.abc import Sequence

from resilient_flows.sites._preload import IDLE_VARIABLE, PRELOAD_VARIABLE, READY
from resilient_flows.sites._typechecks import skip_type_checks

#: Seconds between two looks of a standby pool for its go file.
GO_LOOK_S = 0.05
#: Seconds a standby told to go waits for its fork server to say its process id (see :func:`_hurry`).
SAID_WAIT_S = 10.0


def main(argv: list[str]) -> None:
    # Parsl is imported here, not at the top: every process the pool spawns (its multiprocessing
    # manager) imports this module again, as multiprocessing's spawn does the main module, and
    # needs none of Parsl (0.6 s of CPU each).
    skip_type_checks()
    from resilient_flows.sites._parsl import go_file, run_pool, split_argv

    modules, standby, pool_argv = split_argv(argv)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its children are waited for: an ignored SIGCHLD hides their end
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(["resilient_flows.sites._preload"])
    idle = None
    if standby:
        logdir, block = _block(pool_argv)
        if not os.path.exists(go_file(logdir, block)):  # it stands by: its fork server imports at the lowest priority
            idle = _preload_file(logdir, block)
    start_fork_server(modules, idle)  # started now, its imports under way while the pool connects
    environ: dict[str, str] = {}
    if standby:
        pool_argv, environ = wait_for_go(pool_argv)
        os.environ.update(environ)
        if idle is not None:
            _hurry(idle, modules)
    run_pool(pool_argv, forkserver, functools.partial(start_fork_server, modules), environ)


def start_fork_server(modules: Sequence[str], idle: str | None = None) -> None:
    """Start the fork server, preloading ``modules``, unless it runs; with ``idle`` (a standby
    that waits for its go file), at the lowest priority, saying in that file how far it got (see
    :mod:`resilient_flows.sites._preload`). Called again before each worker starts: a fork
    server that died (multiprocessing starts another at the next worker) is replaced by one that
    preloads too, not by one whose workers import everything again. Only the fork server sees the
    variables: the pool's other children (its multiprocessing manager, spawned, imports this
    module) must not preload."""
    os.environ[PRELOAD_VARIABLE] = ",".join(modules)
    if idle is not None:
        os.environ[IDLE_VARIABLE] = idle
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        del os.environ[PRELOAD_VARIABLE]
        os.environ.pop(IDLE_VARIABLE, None)


def _hurry(idle: str, modules: Sequence[str]) -> None:
    """The go file came: a fork server still importing at the lowest priority would hold the
    members' workers back as long as the cores stay busy. It is replaced by one that imports at
    the usual priority, as a block started cold would (nothing was forked from it yet)."""
    said = _read_said(idle)
    deadline = time.monotonic() + SAID_WAIT_S
    while said is None and time.monotonic() < deadline:  # its first line comes at the usual priority
        time.sleep(GO_LOOK_S)
        said = _read_said(idle)
    if said is None or said[1:] == [READY]:
        return
    server = int(said[0])
    with contextlib.suppress(ProcessLookupError):
        os.kill(server, signal.SIGKILL)
    while _unended(server):  # each of its threads, the niced one too, must end before it is replaced
        time.sleep(0.01)
    start_fork_server(modules)


def _unended(child: int) -> bool:
    """Whether this process's child ``child`` has not ended yet; it is left for multiprocessing to
    wait for (which starts another fork server only once it did)."""
    try:
        return os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


def _read_said(path: str) -> list[str] | None:
    """The lines of a fork server's preload file (its own, from this pool's block directory), or
    None before it wrote one."""
    try:
        with open(path) as said:
            lines = said.read().split()
    except OSError:
        return None
    return lines if lines and lines[0].isdigit() else None


def _block(pool_argv: Sequence[str]) -> tuple[str, str]:
    """The pool's log directory and block id, from its arguments."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--block_id", required=True)
    known, _ = parser.parse_known_args(list(pool_argv))
    return known.logdir, known.block_id


def _preload_file(logdir: str, block: str) -> str:
    """Where a standby's fork server says how far its imports got: in the block's own log
    directory, beside the pool's logs."""
    directory = os.path.join(logdir, f"block-{block}")
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, "preload")


def wait_for_go(pool_argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Import the pool's module, then wait for this block's go file: a standby costs a few idle
    processes and no CPU until it is needed. A cancelled block ends here by its SIGTERM. The
    pool's arguments and the environment to add, as the file says (see
    :func:`~resilient_flows.sites._parsl.read_go`)."""
    from resilient_flows.sites._parsl import POOL_MODULE, go_file, read_go

    importlib.import_module(POOL_MODULE)
    go = go_file(*_block(pool_argv))
    while not os.path.exists(go):
        time.sleep(GO_LOOK_S)
    return read_go(go, pool_argv)


if __name__ == "__main__":
    main(sys.argv[1:])
