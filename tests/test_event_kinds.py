"""Every kind of event the project writes reads back whole: nothing a runner, watchdog, retry
handler or member writes is ever reported as a damaged line by ``status`` (a null ``attempt``,
unknown, included)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from parsl.app.errors import BashExitFailure
from parsl.executors.high_throughput.errors import ManagerLost
from rich.console import Console
from test_permanent_failures import record_of

from resilient_flows.apps import ResumingRetryHandler
from resilient_flows.errors import WorkloadError
from resilient_flows.rundir import DamageLog, EventLog, read_events
from resilient_flows.rundir._events import EVENT_KINDS, event_problem
from resilient_flows.training import MemberSpec
from resilient_flows.training._command import run_command
from resilient_flows.workflow._runner import _handle_lost
from resilient_flows.workflow._watchdog import Lost, Watchdog

#: The fields of each kind that only a live run writes (Parsl blocks, PBT, clones, members
#: training), as their writers pass them to ``EventLog.emit``, nulls where they write nulls.
AS_WRITTEN: dict[str, list[dict[str, Any]]] = {
    "submitted": [{"member": "m", "ranks": 1, "parent": None, "task": 0}, {"member": "s", "stage": True, "task": 1}],
    "declined": [{"member": "m", "attempt": 2, "step": -1, "block": "0", "drain_in_s": 3.5}],
    "resumed": [{"member": "m", "attempt": 2, "step": 7, "read_from": {"shared": ["a"]}, "bytes_from": {"shared": 1}}],
    "checkpointed": [{"member": "m", "step": 3, "stall_ms": 1.25}],
    "tuned": [{"member": "m", "step": 5, "interval_s": 30.0, "shared_every": 2}],
    "preempted": [{"member": "m", "attempt": 1, "step": 12, "reason": "SIGTERM"}],
    "analytics_started": [{"member": None, "request": "r", "pid": 1}],
    "analytics": [{"member": None, "request": "r", "members": {"m": {"loss": 0.5}}}],
    "ondemand": [{"member": None, "request": "r", "slots": 1, "policy": "dp", "free": 0, "preempt": [], "delay": None}],
    "clone_requested": [{"member": "m", "request": "c1", "clones": ["m-c1-0"], "overrides": [{}]}],
    "forked": [{"member": "m", "step": 9, "clones": ["m-c1-0"], "stall_ms": 2.0}],
    "cloned": [{"member": "m-c1-0", "parent": "m", "step": 9, "transport": "shared", "fallback": None}],
    "retired": [{"member": "m", "step": 9, "reason": "exploited"}],
    "exploited": [{"member": "m", "clone": "m-c1-0", "donor": "n", "step": 9}],
    "stage_started": [{"member": "s", "attempt": 1, "pid": 1, "iteration": None}],
    "stage_finished": [{"member": "s", "attempt": 1}],
    "block_started": [{"member": None, "executor": "x", "block": "0", "job_id": "1", "start": 1.0, "end": 2.0}],
    "draining": [{"member": None, "executor": "x", "block": "0", "end_in_s": 20.0}],
    "drained": [{"member": None, "executor": "x", "block": "0", "job_id": "1"}],
}


def write_the_handlers(run_dir: Path) -> None:
    """``failed`` (a permanent one with ``cost: null``, one with ``checkpoint: null``), ``retried``
    (``from_step: null``) and ``warning``, as the retry handler writes them."""
    handler = ResumingRetryHandler(retries=2, on_block_lost=lambda *a: None)
    spec = MemberSpec(name="m", workload="mlp-digits", params={}, steps=4, ranks=2, nodes=2)
    handler(ManagerLost(b"x", "n1"), record_of(spec, run_dir, "mpi_train_app"))
    handler(BashExitFailure("mpi_train_app", 1), record_of(spec, run_dir, "mpi_train_app", 1))
    handler(WorkloadError("no module named nope"), record_of(spec, run_dir, "train_app", 2))
    (run_dir / "members" / "done").mkdir(parents=True)
    (run_dir / "members" / "done" / "result.json").write_text('{"member": "done"}')
    done = MemberSpec(name="done", workload="mlp-digits", params={}, steps=4)
    handler(ManagerLost(b"x", "n1"), record_of(done, run_dir, "train_app"))


def write_the_watchdogs(run_dir: Path) -> None:
    """``lost`` as the runner writes what the watchdog found: a silent block (``attempt: null``,
    no task), a pool that an attempt saw gone (no task, no executor), a silent attempt, and a
    silent retry waiting out its backoff (``attempt: null``)."""
    found = [
        Lost("block 0 holds 1 task(s) but none has beaten", block="0", executor="x"),
        Lost("the worker pool of block 1 is gone, as m saw", block="1", seen_by="m"),
        Lost("no heartbeat for 31 s", task="m", attempt=2, block="0", silent_s=31.0),
        Lost("no heartbeat for 31 s", task="w", attempt=None, block="0", silent_s=31.0),
    ]
    watchdog = Watchdog(run_dir, 30.0, {})
    _handle_lost(found, [], _Submitter(run_dir), watchdog, Console(quiet=True))


class _Submitter:
    """What :func:`_handle_lost` uses of the runner's submitter: its event log, its futures."""

    def __init__(self, run_dir: Path) -> None:
        self.events = EventLog(run_dir)
        self.futures: dict[str, Any] = {}
        self.stages: dict[str, Any] = {}


def test_every_event_kind_the_project_writes_reads_back_without_damage(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_the_handlers(run_dir)
    write_the_watchdogs(run_dir)
    command = MemberSpec(name="c", workload="", params={}, steps=1, command=["sh", "-c", "true"])
    run_command(command.to_dict(), str(run_dir))  # started, finished
    log = EventLog(run_dir)
    for kind, events in AS_WRITTEN.items():
        for fields in events:
            log.emit(kind, **fields)
    damage = DamageLog()
    events = list(read_events(run_dir, damage))
    assert not damage, damage.found()
    assert {e["kind"] for e in events} == set(EVENT_KINDS)
    lost = [e for e in events if e["kind"] == "lost"]
    assert [e["attempt"] for e in lost] == [None, None, 2, None]
    failed = [(e["failure_kind"], e["cost"]) for e in events if e["kind"] == "failed"]
    assert failed == [("infrastructure", 0.0), ("error", 1.0), ("permanent", None)]
    assert all(math.isfinite(e["time"]) for e in events)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"attempt": "2"}, "its attempt is not a number"),
        ({"attempt": math.inf}, "its attempt is not a number"),
        ({"step": None}, "its step is not a number"),
    ],
)
def test_an_attempt_may_be_unknown_but_never_anything_else(tmp_path: Path, fields: dict, problem: str) -> None:
    assert event_problem({"kind": "lost", "member": None, "time": 1.0, "attempt": None}) is None
    assert event_problem({"kind": "lost", "member": None, "time": 1.0, **fields}) == problem
    assert event_problem({"kind": "stage_started", "member": "s", "time": 1.0, "attempt": None}) == (
        "its attempt is not a number"
    )
