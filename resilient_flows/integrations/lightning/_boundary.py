"""Lightning's side of the step boundary: its collectives and its saves, as
:class:`~resilient_flows.training.boundary.StepRuntime` drives them, and a step's metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeGuard

import torch

from resilient_flows.integrations.lightning._package import ModelCheckpoint
from resilient_flows.rundir import MetricsLog, TaskLayout, member_dir
from resilient_flows.training import MemberSpec, RunContract
from resilient_flows.training.boundary import Request, StepRuntime, member_events


def lightning_runtime(trainer: Any, contract: RunContract | None, spec: MemberSpec | None) -> StepRuntime:
    """The step boundary of a Trainer's fit: of its member inside a workflow, else of a plain
    preemptible run (signals only)."""
    ranks, saver = LightningRanks(trainer), LightningSaver(trainer)
    if contract is None:
        return StepRuntime("lightning", 1, ranks, saver, member_events(None, None, False))
    directory = member_dir(contract.run_dir, contract.member)
    writes = trainer.is_global_zero
    return StepRuntime(
        contract.member,
        contract.attempt,
        ranks,
        saver,
        member_events(contract.run_dir, contract.member, writes),
        directory=directory,
        faults=() if spec is None else spec.faults,
        metrics=MetricsLog(TaskLayout(directory).metrics) if writes else None,
    )


#: A stop request as a number ranks can reduce: the strongest wins.
_REQUEST_CODES = {None: 0, "preempt": 1, "retire": 2}


class LightningRanks:
    """The boundary's collectives over the Trainer's strategy."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.rank, self.size = trainer.global_rank, trainer.world_size

    def first_request(self, request: Request | None) -> Request | None:
        if self.size == 1:
            return request
        strategy = self.trainer.strategy
        code = torch.tensor(_REQUEST_CODES[request[0] if request else None], device=strategy.root_device)
        agreed = int(strategy.reduce(code, reduce_op="max"))
        if agreed == 0:
            return None
        action = "preempt" if agreed == 1 else "retire"
        return action, request[1] if request is not None else "requested on another rank"

    def broadcast(self, value: Any) -> Any:
        return value if self.size == 1 else self.trainer.strategy.broadcast(value)


class LightningSaver:
    """The boundary's saves: ``last.ckpt`` through the Trainer (so that Lightning's state is in
    it), committed once the plugin's writes are and every rank got there."""

    reports_saves = True  # the plugin announces every save, Lightning's own ones too

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.last_saved: int | None = None

    @property
    def stall(self) -> float:
        return self.trainer.strategy.checkpoint_io.last_stall

    def save(self, step: int, *, persist: bool | None = None, on_commit: Any = None, cached: bool = False) -> None:
        self.trainer.save_checkpoint(last_path(self.trainer), weights_only=False)
        self.last_saved = step

    def wait(self) -> None:
        if self.trainer.is_global_zero:
            self.trainer.strategy.checkpoint_io.wait()
        self.trainer.strategy.barrier("resilient-flows stop")

    def prepare(self, step: int) -> None:
        """Nothing ahead of time: the plugin's engine prepares on its first save."""


def last_path(trainer: Any) -> Path:
    """``last.ckpt`` where ``trainer.fit(ckpt_path="last")`` looks for it."""
    name = ModelCheckpoint.CHECKPOINT_NAME_LAST + ModelCheckpoint.FILE_EXTENSION
    callback = trainer.checkpoint_callback
    if isinstance(callback, ModelCheckpoint) and callback.dirpath is not None:
        return Path(callback.dirpath) / name
    io = trainer.strategy.checkpoint_io
    return Path(io.directory if io.directory is not None else trainer.default_root_dir) / name


def step_metrics(trainer: Any, outputs: Any) -> dict[str, float]:
    """A step's metrics: ``loss`` from the training step's output, the rest from ``callback_metrics``."""
    values = {k: float(v) for k, v in trainer.callback_metrics.items() if _is_scalar(v)}
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if _is_scalar(loss):
        values["loss"] = float(loss)
    return values


def _is_scalar(value: Any) -> TypeGuard[torch.Tensor | int | float]:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, int | float) and not isinstance(value, bool)
