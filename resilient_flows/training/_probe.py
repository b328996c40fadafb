"""Importing a workflow's functions in a process like a worker's, before anything is queued.

A worker imports a member's ``package.module:function`` in a process that Parsl started from the
runner's environment: the same interpreter, ``PYTHONPATH`` and current directory, without the
current directory on ``sys.path`` (an HTEX worker is a spawned child of
``process_worker_pool.py``); a member puts its workflow file's directory first before it imports
its workload and evaluate function (a stage does not, for its loop). :func:`probe_functions` starts
such a process, which imports each function once through
:func:`~resilient_flows.training._functions.import_function` and checks the params of the members
that run it against its declaration (:mod:`resilient_flows.training._params`): the same code, and
so the same lines, as a member refusing to start. A module that prints while it is imported cannot
garble the answer, and one that hangs is stopped after :data:`PROBE_TIMEOUT_S`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from resilient_flows.errors import WorkloadError

#: Seconds the probe may take to import every function of a workflow.
PROBE_TIMEOUT_S = 60.0

#: The probe's command line: ``-c`` puts the current directory first on ``sys.path``, where a
#: worker has none of it, so it is taken off before anything else is imported.
_BOOT = (
    "import sys\n"
    "if not getattr(sys.flags, 'safe_path', False): del sys.path[0]\n"
    "from resilient_flows.training._probe import main\n"
    "main()\n"
)


#: What a stage's loop is called: its params are checked against its signature, not an attribute.
LOOP = "loop function"


@dataclass(frozen=True)
class FunctionCheck:
    """Import ``ref`` (``what`` it is: a workload, an evaluate or a :data:`LOOP` function);
    check each ``(member, params)`` of ``members`` (stages, for a loop) against what it
    declares (see :mod:`resilient_flows.training._params`)."""

    ref: str
    what: str = "workload"
    members: tuple[tuple[str, dict[str, Any]], ...] = ()
    directory: str | None = None  # put first on sys.path before the import, as the member does


@dataclass(frozen=True)
class Problem:
    """Why ``ref`` cannot run: it does not import (``member`` None), or the params of ``member``
    are refused (``param`` names the first refused one)."""

    ref: str
    message: str
    member: str | None = None
    param: str | None = None


@dataclass
class _Answer:
    problems: list[Problem] = field(default_factory=list)
    importing: str | None = None  # the function being imported last
    done: bool = False


def probe_functions(checks: Sequence[FunctionCheck], timeout_s: float = PROBE_TIMEOUT_S) -> list[Problem]:
    """What stops each of ``checks`` from running on a worker, in order; empty when nothing does.

    A module that outlasts ``timeout_s`` (it works or waits while it is imported), or ends the
    process (``os._exit``, a crash), is the last problem: the functions after it are not
    imported. Raises :class:`WorkloadError` when the process fails before it imports anything.
    """
    if not checks:
        return []
    request = json.dumps([asdict(check) for check in checks])
    timed_out = False
    with subprocess.Popen(
        [sys.executable, "-c", _BOOT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # what an imported module starts is stopped with it
    ) as process:
        try:
            out, err = process.communicate(request, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            timed_out = True
    answer = _read(out)
    if answer.done:
        return answer.problems
    if timed_out:
        reason = f"took longer than {timeout_s:g} s; a module should not train or wait while it is imported"
    else:
        reason = f"ended the process: {(err.strip().splitlines() or [f'exit status {process.returncode}'])[-1]}"
    if answer.importing is None:  # the probe itself did not start
        raise WorkloadError(f"importing the workflow's functions in a new process failed: {reason}")
    what = next(check.what for check in checks if check.ref == answer.importing)
    return [*answer.problems, Problem(answer.importing, f"{what} {answer.importing!r}: importing it {reason}")]


def _read(out: str) -> _Answer:
    """The probe's lines: ``{"importing": ref}`` before each import, ``{"problem": ...}`` for
    each problem found, ``{"done": true}`` at the end."""
    answer = _Answer()
    for line in out.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "importing" in record:
            answer.importing = record["importing"]
        elif "problem" in record:
            answer.problems.append(Problem(**record["problem"]))
        elif record.get("done"):
            answer.done = True
    return answer


def main() -> None:
    """The probe's process: the checks as JSON on stdin, the answer as JSON lines on stdout."""
    from resilient_flows.training._functions import import_function
    from resilient_flows.training._params import declared_params, params_problem, signature_params
    from resilient_flows.training._stage import STAGE_ARGUMENTS

    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the imported modules print goes to stderr, not into the answer

    def say(**record: Any) -> None:
        answer.write(json.dumps(record) + "\n")
        answer.flush()

    for raw in json.load(sys.stdin):
        check = FunctionCheck(raw["ref"], raw["what"], tuple((m, p) for m, p in raw["members"]), raw["directory"])
        say(importing=check.ref)
        if check.directory is not None and check.directory not in sys.path:
            sys.path.insert(0, check.directory)
        try:
            function = import_function(check.ref, check.what)
            if check.what == LOOP:
                declared = signature_params(function, STAGE_ARGUMENTS)
            else:
                declared = declared_params(function, check.ref) if check.members else None
        except WorkloadError as exc:
            say(problem=asdict(Problem(check.ref, str(exc))))
            continue
        if declared is None:
            continue
        for member, params in check.members:
            refused = params_problem(check.ref, declared, params, what=check.what)
            if refused is not None:
                say(problem=asdict(Problem(check.ref, refused[1], member, refused[0])))
    say(done=True)
    sys.stderr.flush()
    os._exit(0)  # not waiting for threads an imported module started, nor its exit handlers
