"""Run one workflow stage: a checkpointed array loop (see :mod:`resilient_flows.resilience`).

A stage is the part of a pipeline that is not a training: a simulation that generates data, a
preparation, an analysis. Its files (its :class:`~resilient_flows.rundir.TaskLayout`): the
loop's checkpoints, one Checkpointer per label under the checkpoint folder; its output, which
later stages and members read; the attempt counter; and its result, the loop function's return
value, once it finished.

The loop function is called as ``function(ctx, output=Path, inputs={stage: Path}, **params)``
with a :class:`~resilient_flows.resilience.Context` on ``checkpoints/``. Like ``run_member`` this
knows nothing of Parsl: a retry after a lost worker calls it again, and the loop resumes after
its newest committed iteration.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from resilient_flows.rundir import EventLog, stage_layout
from resilient_flows.rundir._heartbeat import Heartbeat
from resilient_flows.training._members import newest_committed
from resilient_flows.training._params import check_params, signature_params
from resilient_flows.training._pool import PoolWatch
from resilient_flows.training._spec import StageSpec

if TYPE_CHECKING:
    from resilient_flows.resilience import Filter

#: What a stage's loop function is given besides its params: ``loop(ctx, output=..., inputs=..., **params)``.
STAGE_ARGUMENTS = ("ctx", "output", "inputs")


def stage_dir(run_dir: str | os.PathLike, name: str) -> Path:
    return stage_layout(run_dir, name).root


def stage_output(name: str) -> str:
    """Where stage ``name`` writes its output, relative to the run directory."""
    return str(PurePosixPath(stage_layout("", name).output))


def newest_iteration(run_dir: str | os.PathLike, name: str) -> int:
    """The newest iteration committed under any of the stage's labels; -1 when none is."""
    root = stage_layout(run_dir, name).checkpoints
    return newest_committed(list(root.iterdir()) if root.is_dir() else [])


def stage_finished(run_dir: str | os.PathLike, name: str) -> bool:
    return stage_layout(run_dir, name).result.exists()


def run_stage(spec: dict[str, Any], run_dir: str) -> Any:
    """Run the stage's loop from its newest checkpoint to the end; the loop function's value."""
    from resilient_flows.resilience import Context, every  # torch: only where a stage runs
    from resilient_flows.training._functions import import_function

    stage = StageSpec.from_dict(spec)
    loop = import_function(stage.loop, "loop function")
    check_params(stage.loop, signature_params(loop, STAGE_ARGUMENTS), stage.params, what="loop function")
    layout = stage_layout(run_dir, stage.name)
    output = layout.output
    output.mkdir(parents=True, exist_ok=True)
    events = EventLog(run_dir)
    attempt = layout.count_attempt()
    restart = newest_iteration(run_dir, stage.name)
    events.emit(
        "stage_started", stage.name, attempt=attempt, pid=os.getpid(), iteration=None if restart < 0 else restart
    )
    inputs = {name: Path(run_dir) / path for name, path in stage.inputs.items()}
    schedule = every(stage.every_n) if stage.every_n is not None else every(seconds=stage.every_s)
    if attempt == 1 and stage.faults:  # injected faults hit the first attempt only, as for members
        schedule = _faulty(schedule, stage)
    with (
        Heartbeat(run_dir, stage.name, attempt, pool=PoolWatch.find()),
        Context(layout.checkpoints, filter=schedule, keep=stage.keep) as ctx,
    ):
        value = loop(ctx, output=output, inputs=inputs, **stage.params)
    result = {"stage": stage.name, "attempts": attempt, "value": value}
    layout.write_result(result)
    events.emit("stage_finished", stage.name, attempt=attempt)
    return value


def _faulty(schedule: Filter, stage: StageSpec) -> Filter:
    """``schedule``, which first fires the stage's faults: the filter runs after each iteration."""
    hits = {fault.at_step: fault for fault in stage.faults}

    def checked(label: str, i: int) -> bool:
        if i in hits:
            hits[i].fire(f"stage {stage.name} at iteration {i}")
        return schedule(label, i)

    return checked
