"""The preemption agent's Slurm adapter: ``squeue``/``sinfo`` to look, ``scancel``/``scontrol`` to act.

The queue is read with ``squeue --json`` (Slurm 21.08 and later). Where that is unavailable (a
Slurm built without its JSON serializer), ``squeue -o`` with a fixed, ``|``-separated format
gives the same fields. Free capacity comes from ``sinfo``: idle nodes, or the idle CPUs of nodes
that are up. A job's comment is its owner's to set: it may name the job's heartbeat
(``rf-heartbeat:<path>``), believed only from a file that owner (``user_id``, ``%U``) owns.

Acting uses only what a user may do to their own jobs (and an operator to anyone's):
``scancel --signal=SIG --full`` (the batch script too, so that a member's launcher sees the
signal), ``scontrol requeuehold``/``requeue``, and ``scontrol release`` followed by
``scontrol update StartTime=now``, because a requeued job is otherwise kept ineligible for a
couple of minutes. Putting an on-demand job ahead of the other pending jobs, so that the nodes a
preemption frees go to it, is ``scontrol update Priority=``, which only Slurm's administrator
(or root) may raise.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from resilient_flows.checkpoint import COMMENT_PREFIX
from resilient_flows.cosched._batch import BatchCommandError, BatchJob, Unit, run_command

#: ``squeue -o`` fields, in order, for Slurms without ``--json``. A user writes two of them, the job's
#: name and comment, and either may hold ``|``: the comment comes last, and the name not at all
#: (the agent needs none), so that no job can forge the user, partition or state of its line.
TEXT_FORMAT = "%i|%u|%U|%P|%T|%D|%C|%V|%S|%l|%r|%Q|%k"
_TEXT_FIELDS = TEXT_FORMAT.count("|") + 1
_RUNNING = {"RUNNING"}
_PENDING = {"PENDING"}


class SlurmBatch:
    """A Slurm cluster, reached through the commands on ``PATH`` (and ``SLURM_CONF``).

    ``timeout`` bounds every command: a controller that does not answer in time is a failed poll,
    which the agent backs off from, not a hung agent. ``run`` is how commands are run (tests and
    the benchmark replace it to serve recorded output).
    """

    name = "slurm"
    requeues_exited = True
    can_prioritize = True

    def __init__(
        self,
        *,
        timeout: float = 30.0,
        json_output: bool | None = None,
        run: Callable[[Sequence[str]], str] | None = None,
    ) -> None:
        self.timeout = timeout
        self.json_output = json_output  # None: try JSON first, fall back once for good
        self._run = run or (lambda argv: run_command(argv, timeout=self.timeout))

    def jobs(self) -> list[BatchJob]:
        if self.json_output is not False:
            try:
                text = self._run(["squeue", "--json"])
            except BatchCommandError as exc:
                if self.json_output or "json" not in str(exc).lower():
                    raise
                self.json_output = False
            else:
                self.json_output = True
                return parse_squeue_json(text)
        return parse_squeue_text(self._run(["squeue", "-h", "-t", "all", "-o", TEXT_FORMAT]))

    def free(self, unit: Unit) -> int:
        return parse_sinfo_json(self._run(["sinfo", "--json"]), unit)

    def signal(self, job_id: str, signal: str) -> None:
        self._run(["scancel", f"--signal={signal}", "--full", _job(job_id)])

    def requeue(self, job_id: str, *, hold: bool) -> None:
        self._run(["scontrol", "requeuehold" if hold else "requeue", _job(job_id)])

    def release(self, job_id: str) -> None:
        self._run(["scontrol", "release", _job(job_id)])
        self._run(["scontrol", "update", f"JobId={_job(job_id)}", "StartTime=now"])

    def prioritize(self, job_id: str, *, above: float) -> None:
        self._run(["scontrol", "update", f"JobId={_job(job_id)}", f"Priority={math.floor(above) + 1}"])


def _job(job_id: str) -> str:
    """A job id, checked: it goes on a command line."""
    if not job_id.replace("_", "").isdigit():
        raise BatchCommandError(f"not a Slurm job id: {job_id!r}")
    return job_id


def parse_squeue_json(text: str) -> list[BatchJob]:
    """The jobs of ``squeue --json`` output (its ``jobs`` list), finished ones as state ``"other"``."""
    try:
        data = json.loads(text)
        records = data["jobs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise BatchCommandError(f"squeue --json printed no job list: {text[:200]!r}") from exc
    out = []
    for record in records:
        try:
            job = _from_json(record)
        except (KeyError, TypeError, ValueError) as exc:
            raise BatchCommandError(f"squeue --json: a job record the agent cannot read ({exc!r})") from exc
        out.append(job)
    return out


def _from_json(r: dict[str, Any]) -> BatchJob:
    state = _state(_scalar(r["job_state"]))
    limit = _number(r.get("time_limit"))  # minutes; None or a missing number: unlimited
    start = _number(r.get("start_time"))
    priority = _number(r.get("priority"))
    return BatchJob(
        id=str(r["job_id"]),
        name=str(r.get("name", "")),
        user=str(r.get("user_name", "")),
        uid=_uid(r.get("user_id")),
        queue=str(r.get("partition", "")),
        state=state,
        nodes=int(_number(r.get("node_count")) or 1),
        cpus=int(_number(r.get("cpus")) or 1),
        submitted=float(_number(r.get("submit_time")) or 0.0),
        start=start if state == "running" and start else None,
        time_limit=None if limit is None else 60.0 * limit,
        comment=str(r.get("comment") or ""),
        held=state == "pending" and _held(str(r.get("state_reason", "")), priority),
        priority=priority,
        heartbeat=_heartbeat(str(r.get("comment") or "")),
    )


def _uid(value: Any) -> int | None:
    """``user_id``, where squeue gives one (a user name alone is looked up by the agent)."""
    number = _number(value)
    return None if number is None or number < 0 or number != int(number) else int(number)


def _heartbeat(comment: str) -> str:
    """The path a job's comment names for its heartbeat, "" for none."""
    return comment[len(COMMENT_PREFIX) :].strip() if comment.startswith(COMMENT_PREFIX) else ""


def _scalar(value: Any) -> str:
    """Newer Slurms give the state as a list of flags."""
    if isinstance(value, list):
        return str(value[0]) if value else ""
    return str(value)


def _number(value: Any) -> float | None:
    """Slurm's JSON numbers: plain, or ``{"set": bool, "infinite": bool, "number": n}`` in newer releases."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    return float(value)


def _state(state: str) -> str:
    if state in _RUNNING:
        return "running"
    if state in _PENDING:
        return "pending"
    return "other"


def _held(reason: str, priority: float | None) -> bool:
    return "held" in reason.lower() or priority == 0  # JobHeldUser, JobHeldAdmin, "job requeued in held state"


def parse_squeue_text(text: str) -> list[BatchJob]:
    """The jobs of ``squeue -h -o TEXT_FORMAT`` output, for Slurms without ``--json``."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(_from_text(line))
        except ValueError as exc:
            raise BatchCommandError(f"squeue -o: a line the agent cannot read ({exc}): {line!r}") from exc
    return out


def _from_text(line: str) -> BatchJob:
    fields = line.split("|", _TEXT_FIELDS - 1)
    if len(fields) != _TEXT_FIELDS:
        raise ValueError(f"{len(fields)} fields instead of {_TEXT_FIELDS}")
    job_id, user, uid, queue, state, nodes, cpus, submitted, start, limit, reason, rank, comment = fields
    kind = _state(state)
    priority = float(rank)
    comment = "" if comment == "(null)" else comment
    return BatchJob(
        id=job_id,
        name="",
        user=user,
        uid=int(uid) if uid.isdigit() else None,
        queue=queue,
        state=kind,
        nodes=int(nodes),
        cpus=int(cpus),
        submitted=_timestamp(submitted) or 0.0,
        start=_timestamp(start) if kind == "running" else None,
        time_limit=_limit(limit),
        comment=comment,
        held=kind == "pending" and _held(reason, priority),
        priority=priority,
        heartbeat=_heartbeat(comment),
    )


def _timestamp(text: str) -> float | None:
    if text in {"N/A", "Unknown", "None", ""}:
        return None
    return time.mktime(datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timetuple())


def _limit(text: str) -> float | None:
    """``[days-]hours:minutes:seconds`` (or fewer fields), as ``squeue %l`` prints it; None for no limit."""
    if text in {"UNLIMITED", "NOT_SET", "INVALID", ""}:
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(x) for x in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60.0 + seconds


def parse_sinfo_json(text: str, unit: Unit) -> int:
    """Free capacity from ``sinfo --json``: idle nodes, or idle CPUs of the nodes that can run jobs."""
    try:
        nodes = json.loads(text)["nodes"]
    except (ValueError, KeyError, TypeError) as exc:
        raise BatchCommandError(f"sinfo --json printed no node list: {text[:200]!r}") from exc
    total = 0
    for node in nodes:
        states = {str(s).lower() for s in ([node["state"]] if isinstance(node["state"], str) else node["state"])}
        states |= {str(s).lower() for s in node.get("state_flags", [])}
        if states & {"down", "drain", "draining", "drained", "fail", "failing", "future", "maint", "reserved"}:
            continue
        if unit == "nodes":
            total += 1 if "idle" in states else 0
        else:
            total += int(_number(node.get("idle_cpus")) or 0)
    return total
