"""The callback that makes a Lightning run a workflow member and a preemptible job."""

from __future__ import annotations

from typing import Any

import torch

from resilient_flows.errors import ResilientFlowsError
from resilient_flows.integrations.lightning._boundary import lightning_runtime, step_metrics
from resilient_flows.integrations.lightning._checkpoint_io import ResilientCheckpointIO
from resilient_flows.integrations.lightning._data import close_loaders, place_loaders
from resilient_flows.integrations.lightning._package import Callback, run_contract
from resilient_flows.rundir import TaskLayout, member_dir
from resilient_flows.training import MemberSpec, read_spec, state_digest
from resilient_flows.training.boundary import StepRuntime, Stop

#: Strategies whose ``load_checkpoint`` bypasses the CheckpointIO plugin (Lightning 2.6), and what to use.
_BYPASSING_STRATEGIES = {
    "FSDPStrategy": "ResilientModelParallelStrategy (FSDP2: fully_shard in configure_model) or DDP",
    "ModelParallelStrategy": "ResilientModelParallelStrategy, which reads checkpoints through the plugin",
    "DeepSpeedStrategy": "DDP or ResilientModelParallelStrategy",
}


class ResilientCallback(Callback):
    """Makes a Lightning run a well-behaved workflow member (and a preemptible job anywhere).

    - SIGTERM or SIGUSR1 (a batch system's warning, or the runner forwarding one), or a
      ``preempt`` request from the runner: at the next optimizer step boundary every rank agrees,
      the checkpoint is saved to ``last.ckpt`` (in the first ``ModelCheckpoint``'s directory, else
      in the plugin's) and committed, and the process exits with status 75 inside a workflow (the
      runner requeues it for free) or the Trainer stops outside one. A ``retire`` request stops
      the Trainer after the same checkpoint: ``fit`` returns.
    - Inside a workflow, rank 0 appends a line per optimizer step to the member's metrics log
      (``loss`` from the training step's output, the rest from ``trainer.callback_metrics``),
      emits ``resumed``/``preempted``/``retired`` events, and writes the member's report (last
      metrics and the weights' digest) when ``fit`` ends.
    - Faults the workflow injects (``faults:``) hit the first attempt once the step they name is done.
    - A :class:`~resilient_flows.training.ResumableLoader` given to ``fit`` (or returned by
      ``train_dataloader()``) takes its rank's share of each global batch (the strategy's
      data-parallel rank and size, as Lightning's ``DistributedSampler`` would) and follows
      Lightning's epochs; Lightning saves its position in every checkpoint and hands it back on
      resume, so a run resumed mid-epoch trains on the batches an uninterrupted one would.

    The step boundary itself is :class:`~resilient_flows.training.boundary.StepRuntime`'s, as for
    every member; this callback feeds it Lightning's steps, collectives and checkpoint saves.
    Steps count optimizer steps from 0, as for every member: step ``s`` is the one after which
    Lightning's ``global_step`` is ``s + 1``, in metrics, events, faults and checkpoint
    directories alike (``step-00000124`` holds what Lightning names ``epoch=5-step=125.ckpt``).

    It needs :class:`ResilientCheckpointIO` as the Trainer's checkpoint plugin: a stop waits for
    the checkpoint to be committed, which only that plugin can tell. The launcher of a command
    member beats the member's heartbeat for the process, so this callback does not.
    """

    def __init__(self) -> None:
        self.contract = run_contract()
        self.stopped: str | None = None  # why the run stopped early, if it did
        self._spec = None if self.contract is None else read_spec(self.contract.run_dir, self.contract.member)
        self._runtime: StepRuntime | None = None
        self._report: dict[str, Any] | None = None  # what on_fit_end writes, agreed at the end of training
        # A process group that exists before the Trainer is the script's, not Lightning's: left alone.
        self._users_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        self._step = -1

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        _check_trainer(trainer, self._spec)
        self._runtime = lightning_runtime(trainer, self.contract, self._spec)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning installs its own SIGTERM handler just before training (it would end the run
        # with status 0): ours replaces it until the end of training.
        runtime = self._active
        runtime.signals.reason, self.stopped, self._report = None, None, None
        runtime.signals.install()
        place_loaders(trainer)  # a resumed epoch starts no on_train_epoch_start: its loaders are placed here
        self._step = trainer.global_step - 1
        if trainer.ckpt_path is not None:
            runtime.emit("resumed", attempt=runtime.attempt, step=self._step)
        if trainer.max_steps < 0 or self._step + 1 < trainer.max_steps:
            self._stop(trainer, runtime.decline_start(self._step + 1))

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        place_loaders(trainer)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step - 1
        if step == self._step:  # accumulating gradients: no optimizer step yet
            return
        self._step = step
        self._active.log(step, step_metrics(trainer, outputs))
        self._stop(trainer, self._active.after_step(step))

    def _stop(self, trainer: Any, stop: Stop | None) -> None:
        """Inside a workflow a preemption (or a start declined near the walltime) ends the process
        with status 75 at once; otherwise, and for a retirement, the Trainer stops at this step."""
        if stop is None:
            return
        self.stopped = stop.reason
        if stop.action == "preempt" and self.contract is not None:
            self.teardown(trainer, trainer.lightning_module, "fit")
            raise SystemExit(stop.exit_status)
        trainer.should_stop = True

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if self._runtime is not None:
            self._runtime.flush_metrics()  # every step up to a committed checkpoint is on disk

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._active.signals.restore()
        if self.contract is None:
            return
        # Here, not at fit's end: the ranks agree over the process group, and Lightning's strategy
        # teardown (which closes the checkpoint plugin) comes before on_fit_end.
        digest = state_digest(pl_module)
        report = {"step": trainer.global_step - 1, **self._active.last_metrics, "digest": digest}
        if trainer.world_size > 1:  # replicas that drifted apart (a rank that restored another state) show here
            agree = digest == trainer.strategy.broadcast(digest)
            report["ranks_agree"] = trainer.strategy.reduce_boolean_decision(agree, all=True)
        self._report = report

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self._report is None or not trainer.is_global_zero or self.contract is None:
            return
        if self.stopped is not None:
            self._report["stopped"] = self.stopped
        TaskLayout(member_dir(self.contract.run_dir, self.contract.member)).write_command_report(self._report)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        close_loaders(trainer)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        close_loaders(trainer)
        if self._runtime is not None:
            self._runtime.close()
        if not self._users_group:
            _release_process_group(trainer)

    @property
    def _active(self) -> StepRuntime:
        if self._runtime is None:
            raise ResilientFlowsError("ResilientCallback was not set up for fit")
        return self._runtime


def _check_trainer(trainer: Any, spec: MemberSpec | None) -> None:
    """Refuse a Trainer the callback cannot stop and resume correctly, before it trains."""
    if not isinstance(trainer.strategy.checkpoint_io, ResilientCheckpointIO):
        raise ResilientFlowsError(
            "ResilientCallback needs the Trainer to checkpoint through ResilientCheckpointIO: "
            "Trainer(plugins=[ResilientCheckpointIO()], callbacks=[..., ResilientCallback()])"
        )
    strategy = type(trainer.strategy).__name__
    if strategy in _BYPASSING_STRATEGIES:
        raise ResilientFlowsError(
            f"{strategy} loads checkpoints itself (torch.load of a file, or DCP), never through the Trainer's "
            f"CheckpointIO, so a resume could not read ours: use {_BYPASSING_STRATEGIES[strategy]}"
        )
    if spec is not None and spec.parent is not None:
        raise ResilientFlowsError(
            f"member {spec.name} is a clone of {spec.parent.member}, and Lightning members do not "
            "clone yet: clone members whose scripts use from_env()"
        )


def _release_process_group(trainer: Any) -> None:
    """Destroy the default process group Lightning created and never destroys.

    Left to interpreter exit, torch's gloo worker threads are torn down during finalisation and
    the process now and then aborts (SIGABRT, "terminate called without an active exception")
    after training finished and committed everything. A later ``fit`` or ``test`` of the same
    Trainer creates the group again.
    """
    if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
