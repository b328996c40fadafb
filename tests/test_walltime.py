"""Walltime awareness without a cluster: the margins, a member's decision to start, and the
runner's drain of a block (timed, held, its members asked to stop, then cancelled)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from parsl.jobs.states import JobState, JobStatus

from resilient_flows.checkpoint import CheckpointConfig, CheckpointStats
from resilient_flows.rundir import member_layout, request_preemption, run_layout
from resilient_flows.rundir._block import BLOCK_ENV
from resilient_flows.rundir._control import read_stop_request
from resilient_flows.training import FaultSpec, MemberSpec, Preempted, read_events, run_member
from resilient_flows.training import _autotune as autotune
from resilient_flows.training._walltime import (
    DEFAULT_COMMIT_S,
    MIN_DRAIN_S,
    MIN_WORK_STEPS,
    REACTION_S,
    BlockTimes,
    Pace,
    drain_margin_s,
    read_block_times,
    read_pace,
    start_refusal,
    time_to_checkpoint_s,
)
from resilient_flows.workflow._walltime import FORCE_S, BlockClock, drain_at, may_retire, to_stop


def test_the_drain_margin_holds_the_slowest_member_s_step_and_commit_with_a_floor() -> None:
    assert drain_margin_s([Pace(0.1, 0.2)]) == MIN_DRAIN_S + REACTION_S
    assert drain_margin_s([Pace(0.1, 0.2), Pace(4.0, 6.0)]) == 30.0 + REACTION_S
    unknown = drain_margin_s([])
    assert unknown == drain_margin_s([Pace()]) > MIN_DRAIN_S + REACTION_S  # conservative before any is observed


def test_a_pace_record_keeps_what_it_can_read() -> None:
    assert Pace.from_record({"step_s": 0.5, "commit_s": "x"}) == Pace(0.5, None)
    assert Pace.from_record({"step_s": -1, "commit_s": float("nan")}) == Pace()
    assert Pace.from_record(None) == Pace()


def test_the_time_to_a_checkpoint_is_the_next_interval_or_a_few_steps_and_the_commit() -> None:
    pace = Pace(0.5, 2.0)
    assert time_to_checkpoint_s(pace, 4, None) == 4 * 0.5 + 2.0  # the interval's checkpoint comes first
    assert time_to_checkpoint_s(pace, 500, None) == MIN_WORK_STEPS * 0.5 + 2.0  # the drain checkpoints sooner
    assert time_to_checkpoint_s(pace, None, 1.0) == 1.0 + 2.0
    assert time_to_checkpoint_s(Pace(), None, None) > DEFAULT_COMMIT_S


def test_a_member_may_not_start_when_its_block_is_drained_before_it_reaches_a_checkpoint() -> None:
    times = BlockTimes("3", start=1000.0, end=1180.0, drain_at=1160.0)
    assert start_refusal(None, 10.0, 1159.0) is None  # times unknown: the drain still stops it in time
    assert start_refusal(times, 10.0, 1150.0) is None
    reason = start_refusal(times, 10.0, 1151.0)
    assert reason is not None and "block 3 is drained in 9 s" in reason
    assert start_refusal(times, 10.0, 1170.0) is not None  # past the drain
    assert start_refusal(times, 500.0, 1079.0) is None  # a block too short for it: it starts in the first half
    assert start_refusal(times, 500.0, 1081.0) is not None


def test_a_member_reads_its_block_s_times_and_the_earliest_drain_of_its_number(tmp_path: Path) -> None:
    run_layout(tmp_path).write_block_times(
        {
            "blocks": [
                {"block": "0", "start": 1, "end": 61, "drain_at": 40, "executor": "a"},
                {"block": "0", "start": 1, "end": 61, "drain_at": 35, "executor": "b"},
                {"block": "1", "start": "junk"},
                "junk",
            ]
        }
    )
    assert read_block_times(tmp_path, "0") == BlockTimes("0", 1.0, 61.0, 35.0)
    assert read_block_times(tmp_path, "1") is None
    assert read_block_times(tmp_path, None) is None
    assert read_block_times(tmp_path / "nowhere", "0") is None


def test_a_drain_request_reaches_only_the_attempt_on_its_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    request_preemption(tmp_path, "m", "block 2 ends in 20 s (walltime)", block="2")
    directory = member_layout(tmp_path, "m").root
    monkeypatch.setenv(BLOCK_ENV, "3")
    assert read_stop_request(directory) is None  # a later attempt, on a fresh block
    monkeypatch.setenv(BLOCK_ENV, "2")
    assert read_stop_request(directory) == ("preempt", "block 2 ends in 20 s (walltime)")
    request_preemption(tmp_path, "m", "analytics")  # not aimed at a block: any attempt
    monkeypatch.setenv(BLOCK_ENV, "3")
    assert read_stop_request(directory) == ("preempt", "analytics")


def _spec(steps: int = 40) -> MemberSpec:
    return MemberSpec(
        name="m",
        workload="userworkload:train",
        params={},
        seed=1,
        steps=steps,
        checkpoint=CheckpointConfig(interval_steps=10),
    )


def _block_times(run_dir: Path, drain_in_s: float) -> None:
    import time

    now = time.time()
    entry = {"block": "7", "start": now - 100, "end": now + drain_in_s + 20, "drain_at": now + drain_in_s}
    run_layout(run_dir).write_block_times({"blocks": [entry]})


def test_a_member_declines_to_start_on_a_block_about_to_be_drained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BLOCK_ENV, "7")
    _block_times(tmp_path, drain_in_s=2.0)  # less than 10 steps and a commit at the default pace
    with pytest.raises(Preempted, match="block 7 is drained in"):
        run_member(_spec().to_dict(), str(tmp_path))
    events = list(read_events(tmp_path))
    assert [e["kind"] for e in events] == ["started", "declined"]
    assert events[0]["block"] == "7"
    assert not member_layout(tmp_path, "m").metrics.exists() or not member_layout(tmp_path, "m").metrics.read_text()

    _block_times(tmp_path, drain_in_s=600.0)
    result = run_member(_spec().to_dict(), str(tmp_path))
    assert result["step"] == 39


def test_a_script_member_declines_to_start_with_status_75_and_trains_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command member's script (``from_env``) is held to the same start rule as a workload."""
    import torch

    from resilient_flows.checkpoint import TierSpec
    from resilient_flows.training import from_env
    from resilient_flows.training._contract import RunContract

    monkeypatch.setenv(BLOCK_ENV, "7")
    _block_times(tmp_path, drain_in_s=2.0)
    checkpoints = member_layout(tmp_path, "m").checkpoints
    config = CheckpointConfig(tiers=(TierSpec(str(checkpoints), name="shared"),), interval_steps=10)
    env = RunContract(tmp_path, "m", checkpoints, params={"steps": 40, "seed": 1}, checkpoint=config).to_env()
    model = torch.nn.Linear(2, 2)
    run = from_env(env)
    with pytest.raises(SystemExit) as stopped:
        run.restore(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert stopped.value.code == 75
    assert [e["kind"] for e in read_events(tmp_path)][-1] == "declined"
    assert not list(checkpoints.glob("step-*"))


def test_a_stopped_member_keeps_its_pace_for_its_next_start(tmp_path: Path) -> None:
    spec = replace(_spec(steps=400), faults=(FaultSpec("preempt", 15),))  # SIGTERM at step 15
    with pytest.raises(Preempted):
        run_member(spec.to_dict(), str(tmp_path))
    pace = read_pace(member_layout(tmp_path, "m").root)
    assert pace.step_s is not None and pace.commit_s is not None
    assert 0 < pace.commit_s < DEFAULT_COMMIT_S


# ---------------------------------------------------------------- the runner's side


def test_a_block_is_drained_its_members_margin_before_its_end_at_most_half_its_walltime() -> None:
    assert drain_at(1180.5, [Pace(0.1, 0.2)], 180.0) == 1180.5 - MIN_DRAIN_S - REACTION_S - 0.5
    assert drain_at(1180.0, [Pace(60.0, 60.0)], 180.0) == 1090.0


def test_members_beating_on_the_block_are_asked_once_and_stages_not_at_all() -> None:
    beats = {
        "a": {"block": "0", "attempt": 2},
        "b": {"block": "1", "attempt": 1},
        "stage": {"block": "0", "attempt": 1},
    }
    assert to_stop(beats, "0", {"a", "b"}, set()) == [("a", 2)]
    assert to_stop(beats, "0", {"a", "b"}, {("a", 2)}) == []
    assert to_stop(beats, "1", {"a", "b"}, set()) == [("b", 1)]


def test_a_drained_block_is_cancelled_once_empty_or_just_before_its_end() -> None:
    assert not may_retire(False, 0, 100.0, 50.0)
    assert may_retire(True, 0, 100.0, 50.0)
    assert not may_retire(True, 1, 100.0, 50.0)
    assert not may_retire(True, None, 100.0, 50.0)  # the interchange did not answer
    assert may_retire(True, 1, 100.0, 100.0 - FORCE_S)


@dataclass
class _Provider:
    cancelled: list[str] = field(default_factory=list)

    def cancel(self, job_ids: list[str]) -> list[bool]:
        self.cancelled.extend(job_ids)
        return [True for _ in job_ids]


@dataclass
class _Executor:
    """What the block clock and ``retire_block`` use of a Parsl executor."""

    label: str = "htex"
    provider: _Provider = field(default_factory=_Provider)
    blocks_to_job_id: dict[str, str] = field(default_factory=dict)
    _status: dict[str, JobStatus] = field(default_factory=dict)
    _simulated_status: dict[str, JobStatus] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)

    @property
    def status_facade(self) -> dict[str, JobStatus]:
        return self._status

    def _hold_block(self, block: str) -> None:
        self.held.append(block)


def test_the_runner_times_a_block_drains_it_before_its_walltime_and_cancels_it(tmp_path: Path) -> None:
    now = [100.0]
    tasks: list[int | None] = [1]
    executor = _Executor(blocks_to_job_id={"0": "42"}, _status={"0": JobStatus(JobState.PENDING)})
    clock = BlockClock(
        tmp_path,
        walltime_s=60.0,
        managers=lambda e: [{"block_id": "0", "tasks": tasks[0]}],
        clock=lambda: now[0],
        start_of=lambda provider, job: None,  # the provider cannot tell: the last look that saw it pending
    )

    def look(at: float, beats: dict[str, Any] | None = None) -> list[tuple[str, str]]:
        now[0] = at
        return clock.update([executor], beats or {}, {"a"})

    assert look(100.0) == [] and read_block_times(tmp_path, "0") is None
    executor._status["0"] = JobStatus(JobState.RUNNING)
    beats = {"a": {"block": "0", "attempt": 1, "step_s": 0.2, "commit_s": 0.1}, "s": {"block": "0", "attempt": 1}}
    look(103.0, beats)
    assert read_block_times(tmp_path, "0") == BlockTimes("0", 100.0, 160.0, 160.0 - MIN_DRAIN_S - REACTION_S)

    look(139.0, beats)  # before the drain: nothing asked
    assert executor.held == [] and not member_layout(tmp_path, "a").control.exists()
    look(140.0, beats)
    assert executor.held == ["0"]
    assert member_layout(tmp_path, "a").read_control() == {
        "action": "preempt",
        "reason": "block 0 ends in 20 s (walltime)",
        "block": "0",
    }
    assert not member_layout(tmp_path, "s").root.exists()  # a stage has no such request
    assert executor.provider.cancelled == []  # its member still runs

    tasks[0] = 0
    assert look(141.5, {}) == [("htex", "0")]
    assert executor.provider.cancelled == ["42"]
    assert executor.status_facade["0"].state == JobState.SCALED_IN
    assert read_block_times(tmp_path, "0") is None
    kinds = [e["kind"] for e in read_events(tmp_path)]
    assert kinds == ["block_started", "draining", "drained"]


def test_the_provider_s_start_time_wins_and_a_new_parsl_instance_forgets_the_old_blocks(tmp_path: Path) -> None:
    executor = _Executor(blocks_to_job_id={"0": "42"}, _status={"0": JobStatus(JobState.RUNNING)})
    clock = BlockClock(tmp_path, 60.0, lambda e: None, clock=lambda: 500.0, start_of=lambda provider, job: 450.0)
    clock.update([executor], {}, set())
    times = read_block_times(tmp_path, "0")
    assert times is not None and (times.start, times.end) == (450.0, 510.0)
    BlockClock(tmp_path, 60.0, lambda e: None)
    assert read_block_times(tmp_path, "0") is None


def test_interval_auto_plans_for_the_run_up_to_its_block_s_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint at the block's drain is taken anyway: the tuner's solve time ends there."""
    clock = [0.0]
    monkeypatch.setattr(autotune.time, "monotonic", lambda: clock[0])
    tuner = autotune.AutoTuner(600.0, 7200.0, steps=10_000)
    for step in range(20):
        clock[0] += 0.1
        tuner.stepped(step, 0.0)
        if step % 5 == 4:
            tuner.saved(CheckpointStats(last_stall=0.05))
    stats = CheckpointStats(last_stall=0.05, last_commit_latency=0.5, committed=4)
    unbounded, _ = tuner.recommend(19, stats, two_tiers=False)
    bounded, _ = tuner.recommend(19, stats, two_tiers=False, time_left_s=90.0)
    assert unbounded.solve_time > 900.0  # the steps left at its pace
    assert bounded.solve_time == 90.0
