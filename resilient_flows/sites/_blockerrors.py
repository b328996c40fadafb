"""When a Parsl executor should give up on its blocks.

Parsl's default handler fails every task once all blocks of a one-block site have failed, which a
single cancelled or preempted pilot job does, sometimes before its replacement is even submitted.
Its windowed handler waits for three failed blocks in a row, but a passing condition (a shared
file system full for a few seconds, so that no submit script can be written; a scheduler briefly
refusing submissions) fails three block starts within one strategy pass. Either way every member
of a workflow fails together for a fault that was over seconds later.

:class:`PatientBlockErrorHandler` gives up only on failures that last: the newest ``threshold``
blocks all failed (Parsl's windowed rule), and blocks have kept failing for ``patience_s`` with
none running in between. A block counts as running once two status polls in a row saw it run, so
that pilots which die right after starting (a broken worker environment) do not keep the executor
alive forever. A misconfigured site (a wrong account, a queue that does not exist) is still
reported, a minute late instead of at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from parsl.executors.status_handling import BlockProviderExecutor
from parsl.jobs.errors import TooManyJobFailuresError
from parsl.jobs.states import JobState, JobStatus

_FAILED = (JobState.FAILED, JobState.MISSING)


class PatientBlockErrorHandler:
    """A ``block_error_handler`` for one executor: it remembers the failures since a block last
    ran, so each executor needs its own instance."""

    def __init__(
        self, threshold: int = 3, patience_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if threshold < 1:
            raise ValueError(f"threshold must be at least 1 block, got {threshold}")
        if patience_s < 0:
            raise ValueError(f"patience_s must be non-negative, got {patience_s}")
        if not callable(clock):
            raise ValueError(f"clock must be a function returning seconds, got {clock!r}")
        self.threshold = threshold
        self.patience_s = patience_s
        self._clock = clock
        self._seen_failed: set[str] = set()
        self._failed_since_run: dict[str, float] = {}  # block -> when its failure was first seen
        self._running: set[str] = set()

    def __call__(self, executor: BlockProviderExecutor, status: dict[str, JobStatus]) -> None:
        now = self._clock()
        running = {block for block, job in status.items() if job.state is JobState.RUNNING}
        if running & self._running:
            self._failed_since_run.clear()
        self._running = running
        for block, job in status.items():
            if job.state in _FAILED and block not in self._seen_failed:
                self._seen_failed.add(block)
                self._failed_since_run[block] = now
        newest = [status[block] for block in sorted(status, key=int)[-self.threshold :]]
        if len(newest) < self.threshold or any(job.state not in _FAILED for job in newest):
            return
        if not self._failed_since_run:
            return
        lasted_s = now - min(self._failed_since_run.values())
        if lasted_s >= self.patience_s and not executor.bad_state_is_set:
            executor.set_bad_state_and_fail_all(self._error(newest, lasted_s))

    def _error(self, newest: list[JobStatus], lasted_s: float) -> TooManyJobFailuresError:
        reasons = []
        for job in newest:
            reason = job.message or job.state.name.lower()
            if job.exit_code is not None:
                reason += f" (exit code {job.exit_code})"
            if job.stderr_summary:
                reason += f"; stderr: {job.stderr_summary.strip()}"
            reasons.append(reason)
        listed = "\n".join(f"  {reason}" for reason in reasons)
        return TooManyJobFailuresError(
            f"the last {self.threshold} blocks all failed, and blocks have failed for {lasted_s:.0f} s "
            f"with none running (patience {self.patience_s:g} s):\n{listed}"
        )
