"""A trainer that checkpoints every step, to be killed with SIGKILL by tests/test_faults.py.

It appends to a log what it restored and what it saved (with digests of the state), and which
step was committed when, so the test can check every restart against what was really committed.

usage: python kill_worker.py DIR TOTAL_STEPS LOG
       python kill_worker.py --serve   (a fork server: reads ``run DIR TOTAL LOG`` and ``wait PID``
                                        lines, answers ``pid N`` and ``status S``)

The fork server imports torch once and forks a trainer per ``run``, so that a test killing 20
trainers in a row pays a fork per restart instead of a Python start-up and a torch import. Each
trainer is still a process of its own, killed with a real SIGKILL mid-write.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import torch
from trainkit import Problem, replicated_digest

from resilient_flows.checkpoint import Checkpointer, TierSpec


def debris(tier: Path) -> int:
    """Leftovers of interrupted writes: temporary files and step directories without a manifest."""
    if not tier.is_dir():
        return 0
    partial = sum(1 for d in tier.glob("step-*") if not (d / "manifest.json").exists())
    return partial + len(list(tier.glob("**/*.tmp")))


def main(directory: Path, total: int, log_path: Path) -> None:
    torch.set_num_threads(1)
    shared, local = directory / "shared", directory / "local"
    with open(log_path, "a", buffering=1) as log:
        log.write(f"debris {debris(local)} {debris(shared)}\n")
        problem = Problem(seed=0, width=512, depth=4)
        ck = Checkpointer([local, TierSpec(shared, persist_every=2)], keep=2)
        restored = ck.restore(problem.state)
        log.write(f"restored {restored} {replicated_digest(problem.state)}\n")
        start = 0 if restored is None else restored + 1
        for step in range(start, total):
            problem.step(step)
            ck.save(step, problem.state)
            log.write(f"saved {step} {replicated_digest(problem.state)}\n")
            log.write(f"committed {ck.latest_step()}\n")
        ck.close()
        log.write(f"done {replicated_digest(problem.state)}\n")


def serve() -> None:
    for line in sys.stdin:
        command, *args = line.split()
        if command == "run":
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    main(Path(args[0]), int(args[1]), Path(args[2]))
                    code = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            print(f"pid {pid}", flush=True)
        elif command == "wait":
            _, status = os.waitpid(int(args[0]), 0)
            print(f"status {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve()
    else:
        main(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
