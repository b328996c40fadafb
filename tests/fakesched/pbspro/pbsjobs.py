"""What the fake PBS Pro job commands (``qsig``, ``qrerun``, ``qhold``, ``qrls``) share: PBS's
messages and exit statuses, and the walk over job-id operands.

A PBS client prints ``<command>: <server's message> <job id>`` for each operand that failed and exits
with the last failure's ``pbs_errno`` (15000 + n), which the shell sees modulo 256: Unknown Job Id
(15001) exits 153, as the fake ``qdel`` and ``qstat`` already do.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import engine

Error = tuple[int, str]
UNKNOWN_JOB: Error = (15001 % 256, "Unknown Job Id")
UNKNOWN_SIGNAL: Error = (15013 % 256, "Unknown/illegal signal name")
BAD_STATE: Error = (15016 % 256, "Request invalid for state of job")
NOT_RERUNNABLE: Error = (15038 % 256, "job is not rerunnable")
FINISHED: Error = (15139 % 256, "Job has finished")


def each_job(prog: str, operands: list[str], act: Callable[[Path, int, dict[str, Any]], Error | None]) -> NoReturn:
    """Apply ``act(root, number, record)`` to every job named (unknown and finished jobs are refused
    first, as the server does); print PBS's message for each failure, exit like the real command."""
    root = engine.root_dir(prog)
    status = 0
    for operand in operands:
        number = operand.split(".")[0]
        job = engine.record(root, int(number)) if number.isdigit() else None
        if job is None or job.get("scheduler") != "pbspro":
            error = UNKNOWN_JOB
        elif engine.phase(root, int(number)) == "done":
            error = FINISHED
        else:
            error = act(root, int(number), job)
        if error:
            print(f"{prog}: {error[1]} {operand}", file=sys.stderr)
            status = error[0]
    raise SystemExit(status)


def usage(text: str) -> NoReturn:
    print(text, file=sys.stderr)
    raise SystemExit(2)
