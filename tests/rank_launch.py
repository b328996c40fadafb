"""A test's ranks forked, ``torchrun``-style, from a server that imported torch once.

A fresh rank pays seconds of CPU importing torch, its distributed packages and FSDP before its
first line of work; the checkpoint tests launch a few hundred ranks, and on two cores those
imports were most of their time. Multiprocessing's fork server imports them once
(:mod:`rank_preload`), single-threaded, and forks each rank from there: a rank still is a process
of its own, with its own gloo group, its launcher's variables and a ``__main__`` of its own (the
worker script, run as ``python WORKER ARGS`` would run it, exit hooks included).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import runpy
import sys
import traceback
from pathlib import Path

#: Seconds the ranks of one launch may take together.
LAUNCH_TIMEOUT_S = 240.0

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(["rank_preload"])


def run_ranks(worker: Path, argv: list[str], environs: list[dict[str, str]], logs: list[Path]) -> list[int]:
    """Run ``worker ARGV`` once per environment (a rank's), each rank's stdout and stderr into its
    log; their exit statuses, as ``subprocess`` gives them (negative: killed by that signal)."""
    ranks = [
        _context.Process(target=_rank, args=(str(worker), argv, env, str(log), os.getcwd()), daemon=True)
        for env, log in zip(environs, logs, strict=True)
    ]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(LAUNCH_TIMEOUT_S)
    for rank in ranks:
        if rank.is_alive():  # a rank that hangs (its peer failed) ends with the launch
            rank.kill()
            rank.join()
    return [rank.exitcode if rank.exitcode is not None else -9 for rank in ranks]


def _rank(worker: str, argv: list[str], env: dict[str, str], log: str, cwd: str) -> None:
    """The rank: its environment, directory and output as a launched process would have them,
    then the worker as ``__main__``; never returns."""
    status = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        sys.argv = [worker, *argv]
        sys.path.insert(0, str(Path(worker).parent))
        runpy.run_path(worker, run_name="__main__")
        status = 0
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # a rank's failure is its exit status and its traceback, as for a process
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()  # what the interpreter's exit would run: a worker's checkpointer closes
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)
