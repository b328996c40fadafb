"""Training that is never checkpointed: said once, while it can still be fixed.

A loop that logs its steps but never reaches a step boundary that saves (its own ``for`` instead
of ``ctx.steps()``, a script that never calls ``run.step()``) trains as well as any other and
finishes without a word, until its first failure: the retry then starts from step 0, or from
the last checkpoint long ago, and the hours since are lost. A member that has trained
:data:`UNSAVED_INTERVALS` of its checkpoint intervals without a save says so in a ``warning``
event (``warning: "no_checkpoint"``), which ``status`` shows beside the member.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from resilient_flows.rundir import NO_CHECKPOINT
from resilient_flows.training.boundary._cadence import Cadence

#: How many checkpoint intervals a member may train without a save before it is warned about.
UNSAVED_INTERVALS = 3


class UnsavedWatch:
    """Counts the steps and seconds a member has trained since its last save (or its start), and
    emits the warning once per attempt when they pass :data:`UNSAVED_INTERVALS` intervals."""

    def __init__(self, cadence: Cadence | None, attempt: int, emit: Callable[..., None]) -> None:
        self.cadence, self.attempt, self.emit = cadence, attempt, emit
        self._since: tuple[int, float] | None = None  # (step, monotonic time) of the first unsaved step
        self._warned = False

    def saved(self) -> None:
        self._since = None

    def logged(self, step: int, last_saved: int | None) -> None:
        """``step`` was trained; ``last_saved``: the newest step saved or restored, None for none."""
        if self._warned or self.cadence is None:
            return
        if self._since is None:
            self._since = (step, time.monotonic())
            return
        steps, seconds = step - self._since[0] + 1, time.monotonic() - self._since[1]
        every, every_s = self.cadence.interval_steps, self.cadence.interval_s
        if (every is not None and steps >= UNSAVED_INTERVALS * every) or (
            every_s is not None and seconds >= UNSAVED_INTERVALS * every_s
        ):
            self._warned = True
            start = "step 0" if last_saved is None else f"step {last_saved + 1}"
            interval = f"{every} steps" if every is not None else f"{every_s:g} s"
            self.emit(
                "warning",
                attempt=self.attempt,
                step=step,
                warning=NO_CHECKPOINT,
                reason=f"trained {steps} steps ({UNSAVED_INTERVALS} checkpoint intervals of {interval}) without "
                f"a checkpoint: a retry would restart it from {start}; take the steps from ctx.steps() "
                "(or call run.step() after each)",
            )
