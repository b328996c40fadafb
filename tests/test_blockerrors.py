"""When an executor gives up on its blocks: not for a burst of failed starts, yes for failures that last."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from parsl.executors import HighThroughputExecutor
from parsl.jobs.errors import TooManyJobFailuresError
from parsl.jobs.states import JobState, JobStatus
from parsl.providers import LocalProvider

from resilient_flows.sites._blockerrors import PatientBlockErrorHandler

ENOSPC = "Failed to start block {}: Unable to write submit script: [Errno 28] No space left on device"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def failed(block: int) -> JobStatus:
    return JobStatus(JobState.FAILED, ENOSPC.format(block))


@pytest.fixture
def executor() -> HighThroughputExecutor:
    return HighThroughputExecutor(provider=LocalProvider())


def test_a_burst_of_failed_starts_then_a_running_block_keeps_the_executor(executor: HighThroughputExecutor) -> None:
    clock = Clock()
    handler = PatientBlockErrorHandler(threshold=3, patience_s=60, clock=clock)
    status = {str(b): failed(b) for b in range(6)}  # a full file system for one strategy pass
    handler(executor, status)
    assert not executor.bad_state_is_set
    status["6"] = JobStatus(JobState.RUNNING)
    for _ in range(2):
        clock.now += 5
        handler(executor, status)
    # The replacement ran; later failures start a new count, however old the first burst is.
    clock.now += 600
    status.update({str(b): failed(b) for b in (6, 7, 8)})
    handler(executor, status)
    clock.now += 59
    handler(executor, status)
    assert not executor.bad_state_is_set
    clock.now += 1
    handler(executor, status)
    assert executor.bad_state_is_set
    assert isinstance(executor.executor_exception, TooManyJobFailuresError)
    message = str(executor.executor_exception)
    assert "the last 3 blocks all failed, and blocks have failed for 60 s" in message
    assert ENOSPC.format(8) in message and ENOSPC.format(5) not in message


def test_blocks_that_never_start_fail_the_executor_after_the_patience(executor: HighThroughputExecutor) -> None:
    clock = Clock()
    handler = PatientBlockErrorHandler(threshold=3, patience_s=60, clock=clock)
    status: dict[str, JobStatus] = {}
    for block in range(13):  # one failed start per 5 s strategy pass, as with a wrong account
        status[str(block)] = failed(block)
        handler(executor, status)
        assert executor.bad_state_is_set == (clock.now >= 60), clock.now
        clock.now += 5


def test_pilots_that_die_at_start_are_not_counted_as_running(executor: HighThroughputExecutor, tmp_path: Path) -> None:
    """Seen running by one poll only, then failed: a broken worker environment, not a working block."""
    stderr = tmp_path / "block.err"
    stderr.write_text("ModuleNotFoundError: No module named 'parsl'\n")
    clock = Clock()
    handler = PatientBlockErrorHandler(threshold=3, patience_s=30, clock=clock)
    status: dict[str, JobStatus] = {}
    for block in range(8):
        status[str(block)] = JobStatus(JobState.RUNNING)
        handler(executor, status)
        clock.now += 5
        status[str(block)] = JobStatus(JobState.FAILED, exit_code=1, stderr_path=str(stderr))
        handler(executor, status)
        clock.now += 5
    assert executor.bad_state_is_set
    assert "(exit code 1); stderr: ModuleNotFoundError: No module named 'parsl'" in str(executor.executor_exception)


def test_a_pending_replacement_keeps_the_executor(executor: HighThroughputExecutor) -> None:
    clock = Clock()
    handler = PatientBlockErrorHandler(threshold=3, patience_s=10, clock=clock)
    status = {str(b): failed(b) for b in range(3)}
    handler(executor, status)
    status["3"] = JobStatus(JobState.PENDING)  # queued behind other users' jobs for minutes
    for _ in range(20):
        clock.now += 5
        handler(executor, status)
    assert not executor.bad_state_is_set


@pytest.mark.parametrize(
    ("threshold", "patience_s", "named"),
    [(0, 60.0, "threshold must be at least 1 block, got 0"), (3, -1.0, "patience_s must be non-negative, got -1.0")],
)
def test_bad_settings_are_refused(threshold: int, patience_s: float, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        PatientBlockErrorHandler(threshold=threshold, patience_s=patience_s)
