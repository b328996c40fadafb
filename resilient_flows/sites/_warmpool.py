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
A go file that holds a launch command (a standby adopted by the Parsl instance that replaced a
lost interchange, or by the runner that resumed a killed one) gives the pool's arguments to run
with instead of its own, and the environment to add (the resuming runner's token).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import sys
import time
from collections.abc import Sequence

from resilient_flows.sites._parsl import POOL_MODULE, go_file, read_go, run_pool, split_argv
from resilient_flows.sites._preload import PRELOAD_VARIABLE

#: Seconds between two looks of a standby pool for its go file.
GO_LOOK_S = 0.05


def main(argv: list[str]) -> None:
    modules, standby, pool_argv = split_argv(argv)
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(["resilient_flows.sites._preload"])
    preloaded = functools.partial(start_fork_server, modules)
    preloaded()  # started now, its imports under way while the pool connects
    environ: dict[str, str] = {}
    if standby:
        pool_argv, environ = wait_for_go(pool_argv)
        os.environ.update(environ)
    run_pool(pool_argv, forkserver, preloaded, environ)


def start_fork_server(modules: Sequence[str]) -> None:
    """Start the fork server, preloading ``modules``, unless it runs. Called again before each
    worker starts: a fork server that died (multiprocessing starts another at the next worker)
    is replaced by one that preloads too, not by one whose workers import everything again. Only
    the fork server sees the variable: the pool's other children (its multiprocessing manager,
    spawned, imports this module) must not preload."""
    os.environ[PRELOAD_VARIABLE] = ",".join(modules)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        del os.environ[PRELOAD_VARIABLE]


def wait_for_go(pool_argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Import the pool's module, then wait for this block's go file: a standby costs a few idle
    processes and no CPU until it is needed. A cancelled block ends here by its SIGTERM. The
    pool's arguments and the environment to add, as the file says (see
    :func:`~resilient_flows.sites._parsl.read_go`)."""
    importlib.import_module(POOL_MODULE)
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--block_id", required=True)
    known, _ = parser.parse_known_args(list(pool_argv))
    go = go_file(known.logdir, known.block_id)
    while not os.path.exists(go):
        time.sleep(GO_LOOK_S)
    return read_go(go, pool_argv)


if __name__ == "__main__":
    main(sys.argv[1:])
