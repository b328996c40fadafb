"""A warm worker pool: ``python3 -m resilient_flows.sites._warmpool --preload MOD,... -- ARGS``.

Parsl's worker pool (``process_worker_pool.py ARGS``) spawns each worker as a new interpreter,
which imports Parsl, torch and the member's workload again before it trains: about two seconds
per restarted member on an idle core, many more on a busy node or a parallel file system. Here
the pool's workers are forked from a fork server that imported them once, at the pool's start
(:mod:`resilient_flows.sites._preload`): a worker that replaces a killed one, and every idle
worker a retry is sent to, starts with them imported. See
:mod:`resilient_flows.sites._parsl_adapter` for how Parsl's pool is changed.

Why a fork server, not ``fork`` from the pool's manager: the manager runs threads (ZeroMQ,
Parsl's own) and forking a threaded process copies locks held by threads that do not exist in
the child. The fork server only imports, never runs a torch operation, so it starts no threads
(no OpenMP or intra-op pool, no gloo, and CUDA is never initialised: importing torch does not
initialise it). Each worker then makes its own threads and, on a GPU, its own CUDA context, after
the fork, with the ``CUDA_VISIBLE_DEVICES`` the pool gives it. (numpy's OpenBLAS starts its
threads at import, and is fork-safe: it stops and restarts them around a fork.) A workload
module that starts threads or touches a device at import time breaks this: :mod:`resilient_flows.sites._preload`
says so on the pool's stderr.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import sys

from resilient_flows.sites._parsl_adapter import run_pool, split_argv
from resilient_flows.sites._preload import PRELOAD_VARIABLE


def main(argv: list[str]) -> None:
    modules, pool_argv = split_argv(argv)
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(["resilient_flows.sites._preload"])
    os.environ[PRELOAD_VARIABLE] = ",".join(modules)
    try:  # started now, its imports under way while the pool connects; only it sees the variable
        multiprocessing.forkserver.ensure_running()
    finally:
        del os.environ[PRELOAD_VARIABLE]
    run_pool(pool_argv, forkserver)


if __name__ == "__main__":
    main(sys.argv[1:])
