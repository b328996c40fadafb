"""The preemption agent's PBS Pro adapter: ``qstat``/``pbsnodes`` to look, ``qsig``, ``qhold``, ``qrerun``
and ``qrls`` to act.

The queue is read with ``qstat -f -F json`` (PBS Pro 19 and later, OpenPBS): every job's attributes
in one document. Free capacity comes from ``pbsnodes -a -F json``: hosts in state ``free`` with
nothing assigned, or the unassigned CPUs of ``free`` hosts (PBS calls a partly used host free).

Markers: a PBS user cannot set a job's ``comment`` (Operators, Managers and the scheduler do), so a
job names its heartbeat in its environment at submission, ``qsub -v
RESILIENT_FLOWS_HEARTBEAT=rf-heartbeat:<path>``, which PBS keeps in the job's ``Variable_List``:
that is :attr:`BatchJob.heartbeat`, believed only from a file the job's owner (``Job_Owner``'s
user, looked up on the agent's host) owns. The environment is the user's, so it makes no job on
demand: :attr:`BatchJob.comment` is PBS's ``comment`` attribute alone, where an operator may put
the ``rf-ondemand`` marker (PBS's own notes, "Not Running: ...", hold no such word); on-demand
jobs are best told by their queue.

Acting:

- ``qsig -s SIGUSR1`` reaches every process of the job, batch script included.
- Requeueing takes a running job: unlike Slurm, PBS cannot requeue a job that has exited, so the
  agent requeues a victim while it runs instead of signalling it first (``requeues_exited``):
  ``qrerun`` sends SIGTERM, then SIGKILL after the queue's ``kill_delay``, and a member
  checkpoints on SIGTERM. ``qsig`` remains for sites whose agent is configured to signal only.
- ``requeue(hold=True)`` is ``qhold`` then ``qrerun``. PBS Pro's ``qrerun`` has no hold option
  (only ``-W force``), and ``qrerun`` then ``qhold`` leaves the job queued and free to start
  again in between. On a running job ``qhold`` only sets ``Hold_Types=u`` while it keeps running,
  and the ``qrerun`` that follows kills it and PBS requeues it straight into state H. Where MoM
  can checkpoint jobs (a site checkpoint script), ``qhold`` itself checkpoints, kills and requeues
  the job held, and ``qrerun`` is then refused: a job found held counts as requeued, which also
  makes a repeated requeue harmless. Any other failure takes the hold off again, so that a job
  that keeps running is not left to be held at some later requeue.
- ``qrls`` releases our (user) hold and no other.

Privileges: ``qrerun`` needs PBS Operator or Manager privilege (a job's owner cannot requeue it),
so the agent runs as an operator (``qmgr -c "set server operators += agent@host"``), and ``qstat``
must show it other users' jobs (the server's ``query_other_jobs``, true by default).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from resilient_flows.checkpoint import COMMENT_PREFIX
from resilient_flows.cosched._batch import BatchCommandError, BatchJob, Unit, run_command

#: The ``Variable_List`` entry that names a job's heartbeat (``qsub -v``).
HEARTBEAT_VARIABLE = "RESILIENT_FLOWS_HEARTBEAT"
_STATES = {"R": "running", "Q": "pending", "H": "pending"}
#: ``<sequence>[.<server>]`` or an array's ``<sequence>[]`` / ``<sequence>[<index>]``.
_JOB_ID = re.compile(r"\d+(?:\[\d*\])?(?:\.[A-Za-z0-9_-]+)*")
_QSTAT = ("qstat", "-f", "-F", "json")
_PBSNODES = ("pbsnodes", "-a", "-F", "json")
#: A line ``"key":value`` whose value is bare (neither a string, an object nor a list).
_BARE = re.compile(r'^(\s*"(?:[^"\\]|\\.)*":\s*)([^"\s{\[,][^,\n]*)(,?)$', re.MULTILINE)
_JSON_SCALAR = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")


class PBSProBatch:
    """A PBS Pro (or OpenPBS) server, reached through the commands on ``PATH`` (and ``PBS_SERVER``).

    ``timeout`` bounds every command: a server that does not answer in time is a failed poll,
    which the agent backs off from, not a hung agent. ``run`` is how commands are run (tests and
    the benchmark replace it to serve recorded output).
    """

    name = "pbspro"
    requeues_exited = False
    #: PBS Pro ranks pending jobs by its scheduler's ``job_sort_key`` and queue priorities, which a
    #: job attribute does not override: sites give the on-demand queue a higher ``priority``.
    can_prioritize = False

    def __init__(self, *, timeout: float = 30.0, run: Callable[[Sequence[str]], str] | None = None) -> None:
        self.timeout = timeout
        self._run = run or (lambda argv: run_command(argv, timeout=self.timeout))

    def jobs(self) -> list[BatchJob]:
        return parse_qstat_json(self._run(list(_QSTAT)))

    def free(self, unit: Unit) -> int:
        return parse_pbsnodes_json(self._run(list(_PBSNODES)), unit)

    def signal(self, job_id: str, signal: str) -> None:
        self._run(["qsig", "-s", _signal(signal), _job(job_id)])

    def requeue(self, job_id: str, *, hold: bool) -> None:
        job = _job(job_id)
        if not hold:
            self._run(["qrerun", job])
            return
        self._run(["qhold", job])
        try:
            self._run(["qrerun", job])
        except BatchCommandError:
            if self._held(job):
                return
            with contextlib.suppress(BatchCommandError):
                self._run(["qrls", job])
            raise

    def release(self, job_id: str) -> None:
        self._run(["qrls", _job(job_id)])

    def prioritize(self, job_id: str, *, above: float) -> None:
        raise BatchCommandError(
            f"PBS Pro: {job_id} cannot be put ahead of other jobs by the agent; give the on-demand queue a "
            "higher priority (can_prioritize is False)"
        )

    def _held(self, job_id: str) -> bool:
        """Whether the job waits in the queue under a hold (PBS may have requeued it itself)."""
        try:
            return any(job.held for job in parse_qstat_json(self._run([*_QSTAT, job_id])))
        except BatchCommandError:
            return False


def _job(job_id: str) -> str:
    """A job id, checked: it goes on a command line."""
    if not _JOB_ID.fullmatch(job_id):
        raise BatchCommandError(f"not a PBS job id: {job_id!r}")
    return job_id


def _signal(name: str) -> str:
    """PBS's spelling: ``SIG`` and the name in capitals (MoM's table is case-sensitive), or a number."""
    name = name.strip().upper()
    if not re.fullmatch(r"[A-Z0-9]+", name):
        raise BatchCommandError(f"not a signal name: {name!r}")
    return name if name.isdigit() or name.startswith("SIG") else f"SIG{name}"


def _load(text: str, command: str) -> dict[str, Any]:
    """The JSON document ``command`` printed.

    PBS releases before the switch to cJSON (2023) print any attribute value that C's ``strtod``
    accepts as a bare number, so one job submitted with ``-v N=007`` (or ``0x1f``, ``nan``) makes
    the whole document invalid (openpbs/openpbs#1255). Such values are quoted and the document read
    again before giving up.
    """
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = json.loads(_BARE.sub(_quote, text))
        except ValueError as exc:
            raise BatchCommandError(f"{command} printed no JSON the agent can read ({exc}): {text[:200]!r}") from exc
    if not isinstance(data, dict):
        raise BatchCommandError(f"{command} printed JSON that is not an object: {text[:200]!r}")
    return data


def _quote(match: re.Match[str]) -> str:
    head, value, tail = match.groups()
    return match.group(0) if _JSON_SCALAR.fullmatch(value.strip()) else f'{head}"{value.strip()}"{tail}'


def parse_qstat_json(text: str) -> list[BatchJob]:
    """The jobs of ``qstat -f -F json`` output; those neither running, queued nor held as state ``"other"``."""
    command = " ".join(_QSTAT)
    records = _load(text, command).get("Jobs", {})  # PBS leaves "Jobs" out when there are none
    if not isinstance(records, dict):
        raise BatchCommandError(f"{command} printed no job table: {text[:200]!r}")
    out = []
    for job_id, record in records.items():
        try:
            out.append(_from_json(job_id, record))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BatchCommandError(f"{command}: job {job_id} has a record the agent cannot read ({exc!r})") from exc
    return out


def _from_json(job_id: str, r: dict[str, Any]) -> BatchJob:
    letter = str(r["job_state"])
    state = _STATES.get(letter, "other")
    resources = r.get("Resource_List", {})
    return BatchJob(
        id=job_id,
        name=str(r.get("Job_Name", "")),
        user=str(r.get("Job_Owner", "")).partition("@")[0],
        queue=str(r.get("queue", "")),
        state=state,
        nodes=int(resources.get("nodect", 1)),
        cpus=int(resources.get("ncpus", 1)),
        submitted=_time(r.get("ctime")) or 0.0,
        start=_time(r.get("stime")) if state == "running" else None,
        time_limit=_duration(resources.get("walltime")),
        comment=str(r.get("comment", "")),
        held=letter == "H",
        heartbeat=_heartbeat(r),
    )


def _time(value: Any) -> float | None:
    """A time as ``qstat -f`` prints it, like ``ctime(3)``: ``Fri Dec  4 15:00:17 2026``, local time."""
    if value is None:
        return None
    return time.mktime(time.strptime(str(value), "%a %b %d %H:%M:%S %Y"))


def _duration(value: Any) -> float | None:
    """``[[hours:]minutes:]seconds`` (hours may pass 99); None for no limit."""
    if value is None:
        return None
    total = 0.0
    for part in str(value).split(":"):
        total = total * 60 + float(part)
    return total


def _heartbeat(r: dict[str, Any]) -> str:
    """The path the job's environment names for its heartbeat, "" for none."""
    value = r.get("Variable_List", {}).get(HEARTBEAT_VARIABLE)
    if isinstance(value, str) and value.startswith(COMMENT_PREFIX):
        return value[len(COMMENT_PREFIX) :].strip()
    return ""


def parse_pbsnodes_json(text: str, unit: Unit) -> int:
    """Free capacity from ``pbsnodes -a -F json``: idle hosts, or the unassigned CPUs of ``free`` hosts.

    Only state ``free`` counts (``job-busy``, ``job-exclusive``, ``resv-exclusive``, ``down``,
    ``offline`` and their combinations do not); a host with no CPUs runs no job. A server without
    nodes makes ``pbsnodes`` print nothing on standard output and exit 0.
    """
    if not text.strip():
        return 0
    command = " ".join(_PBSNODES)
    nodes = _load(text, command).get("nodes")
    if not isinstance(nodes, dict):
        raise BatchCommandError(f"{command} printed no node table: {text[:200]!r}")
    total = 0
    for name, node in nodes.items():
        try:
            if node["state"] != "free":
                continue
            available = int(node.get("resources_available", {}).get("ncpus", 0))
            assigned = int(node.get("resources_assigned", {}).get("ncpus", 0))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BatchCommandError(f"{command}: node {name} has a record the agent cannot read ({exc!r})") from exc
        if unit == "nodes":
            total += 1 if available > 0 and assigned == 0 else 0
        else:
            total += max(available - assigned, 0)
    return total
