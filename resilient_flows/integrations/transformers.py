"""Hugging Face ``Trainer`` checkpoints through resilient-flows: asynchronous, tiered, never pickled.

``Trainer`` stops every ``save_steps`` to write ``checkpoint-N/`` (weights, ``optimizer.pt``,
``scheduler.pt``, ``rng_state.pth``, ``trainer_state.json``) and reads it back with ``torch.load``.
:func:`resilient_trainer` hands both jobs to our engine and keeps Trainer's own resume logic (which
epoch, how many batches are done, when to reset the generators); its training data come from a
:class:`~resilient_flows.training.ResumableLoader` (:mod:`resilient_flows.integrations._trainer_data`),
so that a mid-epoch resume starts at the next sample instead of reading the skipped batches again::

    trainer = Trainer(model=model, args=args, train_dataset=train)
    resilient = resilient_trainer(trainer)  # tiers: the run contract, else <output_dir>/checkpoints
    trainer.train(resume_from_checkpoint=resilient.last_checkpoint())

A checkpoint holds the model and optimizer state (by parameter name), the LR scheduler, every
rank's RNG states and ``TrainerState``, which lives as JSON in the manifest. Its step is the index
of the optimizer step just done, counted from 0 as for every member: checkpoint ``s`` holds
Trainer's state at ``global_step`` ``s + 1``.

``Trainer`` has no checkpoint-IO interface, so the helper replaces methods of the one instance it
is given (``_save_checkpoint``, the four ``_load_*`` that resume reads through,
``_maybe_log_save_evaluate`` to act at each step boundary, ``get_train_dataloader`` and
``get_resumed_dataloader`` for the data, and, inside a workflow, ``training_step`` to read each
step's loss) and adds a :class:`ResilientTrainerCallback`. The
loaders act only on the resume points that :meth:`ResilientTrainerCallback.last_checkpoint` returns; an
ordinary Trainer checkpoint directory still loads as before.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch

try:  # from the defining modules: a type checker (an editor's, ours in CI) binding the package's top
    # level goes through every model it lists, 10 s and more; these take a second
    from transformers.trainer import Trainer
    from transformers.trainer_callback import ExportableState, TrainerCallback, TrainerControl, TrainerState
    from transformers.training_args import TrainingArguments
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "resilient_flows.integrations.transformers needs transformers: pip install 'resilient-flows[transformers]'"
    ) from exc

from resilient_flows.checkpoint import (
    Checkpointer,
    TierSpec,
    TrainState,
    capture_rng,
    read_manifest,
    restore_rng,
    unflatten,
)
from resilient_flows.errors import CheckpointError, CorruptCheckpointError, ResilientFlowsError
from resilient_flows.integrations._trainer_data import TrainerData, serves_data
from resilient_flows.training import ENV_NAMES, DataPositions
from resilient_flows.training.boundary import CheckpointSaver, CommRanks, StepRuntime, member_events

__all__ = ["ResilientTrainerCallback", "resilient_trainer"]

logger = logging.getLogger(__name__)

#: Keys of ``TrainerState`` (a JSON object) and of the AMP grad scaler's state in a checkpoint's
#: replicated ``extra`` values.
TRAINER_STATE = "trainer_state"
SCALER = "grad_scaler"

_TRAINER_STATE_FILE = "trainer_state.json"  # the name Trainer looks for in a resume directory


def resilient_trainer(
    trainer: Trainer,
    tiers: str | os.PathLike | Sequence[TierSpec | str | os.PathLike] | None = None,
    *,
    save_steps: int | None = None,
    keep: int | None = None,
    resumable_data: bool | None = None,
) -> ResilientTrainerCallback:
    """Make ``trainer`` checkpoint through resilient-flows and stop cleanly on SIGTERM/SIGUSR1.

    Inside a workflow (a command member, its run contract in the environment) the member decides:
    its tiers, its interval (steps or time), retention, ``preempt`` requests; a stop signal or a
    preemption request commits a checkpoint at the next step boundary and exits with status 75.
    The arguments are for a script run on its own:

    Parameters
    ----------
    trainer:
        The ``Trainer`` (or subclass) to change; call before ``trainer.train``.
    tiers:
        The shared tier's directory, or a list of tiers fastest first as a
        :class:`~resilient_flows.checkpoint.Checkpointer` takes them (``["/local/x",
        TierSpec("/lus/x", ...)]``: committed node-locally, flushed on at the shared
        :class:`~resilient_flows.checkpoint.TierSpec`'s cadence). Default: ``<output_dir>/checkpoints``.
    save_steps:
        Checkpoint every ``save_steps`` optimizer steps. Default: Trainer's own ``save_strategy``
        decides when (steps, epoch or best), and our engine writes it.
    keep:
        Committed checkpoints kept per tier (default 3); replaces ``save_total_limit``.
    resumable_data:
        Train from a :class:`~resilient_flows.training.ResumableLoader` built from the Trainer's
        own data settings (dataset, collator, ``per_device_train_batch_size`` times the ranks,
        workers, ``drop_last``, shuffled from ``data_seed`` or ``seed``), whose position is in
        every checkpoint: a mid-epoch resume starts at the next sample without reading the
        skipped ones, and random augmentation, in workers or in the collator, is the
        uninterrupted run's. Default: whenever Trainer's loader is the stock one
        (``train_sampling_strategy`` ``"random"`` or ``"sequential"``, a map-style dataset, no
        ``auto_find_batch_size``, no subclass overriding the data methods; on several ranks, no
        tensor, context or sequence parallelism and a last global batch with a sample for each
        rank); ``True`` refuses a Trainer where it cannot; ``False`` keeps Trainer's own loader
        and its skipping. Under DDP every rank takes its share of each global batch (with
        ``split_batches``, ``per_device_train_batch_size`` is the global batch).
    """
    if any(isinstance(cb, ResilientTrainerCallback) for cb in trainer.callback_handler.callbacks):
        raise ResilientFlowsError("this Trainer checkpoints through resilient-flows already")
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        raise ResilientFlowsError("resilient_trainer does not support DeepSpeed or FSDP yet: use DDP or one process")
    if trainer.args.load_best_model_at_end:
        raise ResilientFlowsError(
            "load_best_model_at_end needs Trainer's own checkpoint directories: turn it off with resilient_trainer"
        )
    serve_data = serves_data(trainer, resumable_data)
    if save_steps is not None and (isinstance(save_steps, bool) or not isinstance(save_steps, int) or save_steps < 1):
        raise ValueError(f"save_steps must be an integer >= 1, got {save_steps!r}")
    given = {"tiers": tiers, "save_steps": save_steps, "keep": keep}
    if os.environ.get(ENV_NAMES["run_dir"]):
        ignored = [name for name, value in given.items() if value is not None]
        if ignored:
            logger.warning("running as a workflow member: its checkpoint settings win over %s", ", ".join(ignored))
        run: _Member | _Standalone = _Member()
    else:
        run = _Standalone(
            # TrainingArguments sets output_dir ("trainer_output" when not given) in __post_init__
            Path(cast(str, trainer.args.output_dir)) / "checkpoints" if tiers is None else tiers,
            save_steps=save_steps,
            keep=3 if keep is None else keep,
        )
    callback = ResilientTrainerCallback(trainer, run, TrainerData(trainer, run.positions) if serve_data else None)
    trainer.add_callback(callback)
    return callback


class ResilientTrainerCallback(TrainerCallback):
    """The callback :func:`resilient_trainer` adds; it drives the checkpoints of one ``train()``.

    Attributes
    ----------
    checkpointer:
        The :class:`~resilient_flows.checkpoint.Checkpointer` writing the tiers.
    stopped:
        Outside a workflow, the reason training stopped early (``"signal SIGTERM"``), after
        committing a checkpoint; None otherwise. (Inside one the process exits with status 75.)
    """

    def __init__(self, trainer: Trainer, run: _Member | _Standalone, data: TrainerData | None = None) -> None:
        self.trainer = trainer
        self.checkpointer = run.checkpointer
        self.stopped: str | None = None
        self._run = run
        self._data = data
        self._extra: dict[str, Any] = {}
        self._tracked = False
        self._resume: tempfile.TemporaryDirectory | None = None
        self._resume_step: int | None = None
        self._boundary_step: int | None = None
        self._rng: dict[str, Any] | None = None
        self._loss: torch.Tensor | None = None
        self._replace_methods(trainer)

    def last_checkpoint(self) -> str | None:
        """What to pass as ``trainer.train(resume_from_checkpoint=...)``: None when no tier holds
        a committed checkpoint (a first start), else a resume point that this callback loads.

        Trainer then resumes as from its own checkpoint: same global step, same epoch, the
        generators reset where the data continue, and the data at the next sample (the
        resumable loader's position), or past the batches already seen, which Trainer's own
        loader reads again (unless ``ignore_data_skip``).

        Under DDP it is collective: every rank calls it, and every rank resumes when any rank
        sees a committed checkpoint (a rank on a replaced node may have lost its node-local tier).
        """
        if all(step is None for step in self.checkpointer.comm.allgather(self.checkpointer.latest_step())):
            return None
        if self._resume is None:
            self._resume = tempfile.TemporaryDirectory(prefix="rf-hf-resume-")
        return self._resume.name

    # ------------------------------------------------------------------ callback events

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        self._boundary_step = state.global_step - 1
        if not self._tracked:  # a first start (a resume restored the checkpoint once the optimizer existed)
            newest = self.checkpointer.latest_step()
            if newest is not None:
                raise CheckpointError(
                    f"the checkpoint tiers hold step {newest} already ({self.checkpointer.shared.path}): resume with "
                    "trainer.train(resume_from_checkpoint=resilient.last_checkpoint()), or start in an empty directory"
                )
            self._track()
        self._run.begin()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        self._run.step_end(state.global_step, control)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        self._run.epoch_end(control)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        self._refresh()
        try:
            self._run.finish(state.global_step - 1, self.trainer.model)
        finally:
            if self._resume is not None:
                self._resume.cleanup()

    # ------------------------------------------------------------------ Trainer's methods, replaced

    def _replace_methods(self, trainer: Trainer) -> None:
        """Route Trainer's checkpoint writing and (for our resume points) reading through us.

        Trainer resumes in this order: ``_load_from_checkpoint`` (the weights), then it reads
        ``trainer_state.json`` (epoch and batches to skip follow from it), creates the optimizer
        and scheduler, ``_load_optimizer_and_scheduler``, ``_load_scaler``, and, where the data
        continue, ``_load_rng_state``. With a resumable loader, ``get_train_dataloader`` builds it
        and a mid-epoch ``get_resumed_dataloader`` skips nothing: the generators are reset there,
        before the first batch is drawn, as at an epoch's start.
        """
        load_model = trainer._load_from_checkpoint
        load_optimizer = trainer._load_optimizer_and_scheduler
        load_scaler = trainer._load_scaler
        load_rng = trainer._load_rng_state
        log_save_evaluate = trainer._maybe_log_save_evaluate
        training_step = trainer.training_step
        inner_training_loop = trainer._inner_training_loop

        def _save_checkpoint(model: Any, trial: Any = None) -> None:
            if trial is None:
                trainer.store_flos()  # as Trainer does before its own save
            self._refresh()
            self._run.save_requested(trainer.state.global_step - 1)

        def _load_from_checkpoint(resume_from_checkpoint: str, model: Any = None) -> None:
            if self._ours(resume_from_checkpoint):
                self._pin(Path(resume_from_checkpoint))  # the weights follow once the optimizer exists
            else:
                load_model(resume_from_checkpoint, model)

        def _load_optimizer_and_scheduler(checkpoint: str | None) -> None:
            if self._ours(checkpoint):
                self._restore()
            else:
                load_optimizer(checkpoint)

        def _load_scaler(checkpoint: str | None) -> None:
            if not self._ours(checkpoint):
                load_scaler(checkpoint)
            elif self._extra.get(SCALER) and trainer.accelerator.scaler is not None:
                trainer.accelerator.scaler.load_state_dict(self._extra[SCALER])

        def _load_rng_state(checkpoint: str | None) -> None:
            if not self._ours(checkpoint):
                load_rng(checkpoint)
            elif self._rng is not None:
                restore_rng(self._rng)

        def _maybe_log_save_evaluate(*args: Any, **kwargs: Any) -> None:
            log_save_evaluate(*args, **kwargs)
            self._boundary()

        def _inner_training_loop(*args: Any, **kwargs: Any) -> Any:
            """Trainer's loop, which ``train()`` reads when it runs (``trainer.train`` itself is read
            before the call's arguments, ``resilient_trainer(trainer)`` among them). Where it
            raises, ``on_train_end`` never comes: the stop signals' handlers go back here."""
            try:
                return inner_training_loop(*args, **kwargs)
            except BaseException:
                self._run.abandon()
                raise

        def training_step_with_loss(*args: Any, **kwargs: Any) -> torch.Tensor:
            loss = training_step(*args, **kwargs)
            self._loss = loss.detach() if self._loss is None else self._loss + loss.detach()
            return loss

        trainer._save_checkpoint = _save_checkpoint
        trainer._load_from_checkpoint = _load_from_checkpoint
        trainer._load_optimizer_and_scheduler = _load_optimizer_and_scheduler
        trainer._load_scaler = _load_scaler
        trainer._load_rng_state = _load_rng_state
        trainer._maybe_log_save_evaluate = _maybe_log_save_evaluate
        trainer._inner_training_loop = _inner_training_loop
        if self._run.logs_loss:
            trainer.training_step = training_step_with_loss
        if self._data is not None:
            self._replace_data_methods(trainer, self._data)

    def _replace_data_methods(self, trainer: Trainer, data: TrainerData) -> None:
        resumed_dataloader = trainer.get_resumed_dataloader

        def get_resumed_dataloader(dataloader: Any, num_batches: int) -> Any:
            if not data.resumed(dataloader, num_batches):
                return resumed_dataloader(dataloader, num_batches)
            if self._rng is not None:  # the data continue here: nothing is skipped that would draw first
                restore_rng(self._rng)
                self._rng = None
            return dataloader

        # Trainer only iterates and measures its loader, as it does a ResumableLoader
        trainer.get_train_dataloader = data.build  # pyright: ignore[reportAttributeAccessIssue]
        trainer.get_resumed_dataloader = get_resumed_dataloader

    def _boundary(self) -> None:
        """What a step boundary owes the run (metrics, a checkpoint when the member's interval says,
        honouring a stop), once Trainer has logged, evaluated and saved for the step: the
        checkpoint then holds that step's log and metrics, as Trainer's own would."""
        step = self.trainer.state.global_step - 1
        if step == self._boundary_step:  # called again at an epoch's end: no new step
            return
        self._boundary_step = step
        loss, self._loss = self._loss, None
        self._refresh()
        self.stopped = self._run.boundary(step, None if loss is None else float(loss), self.trainer.control)

    def _ours(self, checkpoint: str | None) -> bool:
        return checkpoint is not None and self._resume is not None and Path(checkpoint) == Path(self._resume.name)

    def _pin(self, resume: Path) -> None:
        """Choose the checkpoint to resume from and put its ``TrainerState`` where Trainer reads it
        next, before the optimizer exists to restore the rest into."""
        self._resume_step, trainer_state = _agreed_trainer_state(self.checkpointer)
        (resume / _TRAINER_STATE_FILE).write_text(json.dumps(trainer_state))

    def _restore(self) -> None:
        """Restore the pinned checkpoint into the model, optimizer, scheduler and generators.

        The generators' states are kept for ``_load_rng_state``, which Trainer calls where the
        data continue: after skipping the batches already seen, which may draw from them.
        """
        restored = self._track()
        if restored is None or restored != self._resume_step:
            raise CheckpointError(
                f"checkpoint step {self._resume_step} failed verification after Trainer had read its state "
                f"(step {restored} is the newest valid one now): run again to resume from it"
            )
        self._rng = capture_rng()
        if self._data is not None and self.trainer.args.ignore_data_skip:
            self._data.restart_epoch()
        logger.info("resumed from checkpoint step %d (global step %d)", restored, restored + 1)

    def _track(self) -> int | None:
        trainer = self.trainer
        self._tracked = True
        optimizer = _unwrapped(trainer.optimizer, "optimizer")
        scheduler = _unwrapped(trainer.lr_scheduler, "scheduler")
        return self._run.track(trainer.model, optimizer, scheduler, self._extra)

    def _refresh(self) -> None:
        """Bring the values checkpointed beside the tensors up to date (cheap: see :func:`_trainer_state`)."""
        self._extra[TRAINER_STATE] = _trainer_state(self.trainer)
        scaler = self.trainer.accelerator.scaler
        if scaler is not None:
            self._extra[SCALER] = scaler.state_dict()


def _agreed_trainer_state(checkpointer: Checkpointer) -> tuple[int, dict[str, Any]]:
    """The step every rank resumes from and its ``TrainerState``: the newest that any rank can read,
    as the collective restore that follows chooses (a rank that lost its node-local tier has an
    older newest step, or none). Collective with the checkpointer's ranks; every rank raises alike."""
    try:
        mine: tuple[int, dict[str, Any]] | str = _newest_trainer_state(checkpointer)
    except CheckpointError as exc:
        mine = str(exc)
    found = checkpointer.comm.allgather(mine)
    readable = [each for each in found if not isinstance(each, str)]
    if not readable:
        raise CheckpointError(found[checkpointer.comm.rank])
    return max(readable, key=lambda each: each[0])


def _newest_trainer_state(checkpointer: Checkpointer) -> tuple[int, dict[str, Any]]:
    """The newest committed step with a readable manifest, in any tier, and its ``TrainerState``:
    read from the manifest alone, as the restore that follows will choose it (it skips the same)."""
    committed = [(step, tier) for tier in checkpointer.tiers for step in tier.committed_steps()]
    committed.sort(key=lambda found: found[0], reverse=True)  # fastest tier first among equals
    for step, tier in committed:
        try:
            node = read_manifest(tier.step_dir(step)).skeleton
        except CorruptCheckpointError as exc:
            logger.warning("not resuming from %s: %s", tier.path, exc)
            continue
        for key in ("extra", TRAINER_STATE):
            node = dict(node.get("dict", [])).get(key, {})
        if not node:
            raise CheckpointError(
                f"checkpoint step {step} in {tier.path} holds no TrainerState: Trainer did not write it"
            )
        return step, unflatten(node, {})
    raise CheckpointError(f"no readable checkpoint in {checkpointer.shared.path} to resume from")


def _unwrapped(obj: Any, attribute: str) -> Any:
    """The torch optimizer or scheduler inside Accelerate's wrapper (the wrapper has no state of its own)."""
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.scheduler import AcceleratedScheduler

    return getattr(obj, attribute) if isinstance(obj, AcceleratedOptimizer | AcceleratedScheduler) else obj


def _trainer_state(trainer: Trainer) -> dict[str, Any]:
    """``TrainerState`` as ``trainer_state.json`` holds it, with the callbacks' exportable state.

    Shallow: ``log_history`` is the live list, turned into JSON only when a checkpoint is taken,
    so that refreshing it every step costs nothing however long the history grows.
    """
    state = trainer.state
    exported: dict[str, list[dict[str, Any]]] = {}
    for cb in [*trainer.callback_handler.callbacks, trainer.control]:
        if isinstance(cb, ExportableState):
            exported.setdefault(type(cb).__name__, []).append(cb.state())
    fields = {field.name: getattr(state, field.name) for field in dataclasses.fields(state)}
    fields["stateful_callbacks"] = {
        name: states[0] if len(states) == 1 else states for name, states in exported.items()
    }
    return fields


class _Standalone:
    """A script on its own: our Checkpointer on the given tiers; a stop signal, agreed by every
    rank, ends ``train()`` after committing the step (:class:`StepRuntime`'s boundary)."""

    logs_loss = False

    def __init__(
        self,
        tiers: str | os.PathLike | Sequence[TierSpec | str | os.PathLike],
        *,
        save_steps: int | None,
        keep: int,
    ) -> None:
        self.checkpointer = Checkpointer(tiers, keep=keep, comm=_world_group())
        self.save_steps = save_steps
        self.positions = DataPositions()
        self._saver = CheckpointSaver(self.checkpointer)
        ranks = CommRanks(self.checkpointer.comm)
        self._runtime = StepRuntime("trainer", 1, ranks, self._saver, member_events(None, None, False))

    def begin(self) -> None:
        """From now until :meth:`finish`, a stop signal waits for the next step boundary."""
        self._runtime.signals.install()

    def abandon(self) -> None:
        """``train()`` raised: a stop signal ends the process again, as before :meth:`begin`, and
        the checkpoint still being written is finished before the exception goes on. A run that
        follows, in this process or another, must not meet this one's writer at work in the same
        directory. A failure to finish it is logged: the exception that ended ``train()`` is the
        one to see."""
        self.positions.close()
        try:
            self._runtime.close()
            self.checkpointer.close()
        except Exception:
            logger.exception("the checkpoint being written when train() raised could not be finished")

    def track(self, model: Any, optimizer: Any, scheduler: Any, extra: dict[str, Any]) -> int | None:
        self._saver.state = TrainState(model, optimizer, scheduler, extra=extra, data=self.positions)
        restored = self.checkpointer.restore(self._saver.state)
        if self.checkpointer.skipped:  # newer ones failed verification: training goes on from this one
            self.checkpointer.discard_newer_than(-1 if restored is None else restored)
        self._saver.last_saved = restored
        return restored

    def step_end(self, global_step: int, control: TrainerControl) -> None:
        if self.save_steps is not None:  # ours replaces save_strategy
            control.should_save = global_step % self.save_steps == 0

    def boundary(self, step: int, loss: float | None, control: TrainerControl) -> str | None:
        stop = self._runtime.after_step(step)
        if stop is None:
            return None
        control.should_training_stop = True
        return stop.reason

    def epoch_end(self, control: TrainerControl) -> None:
        if self.save_steps is not None:
            control.should_save = False

    def save_requested(self, step: int) -> None:
        if self._saver.last_saved != step:
            self._runtime.save(step)

    def finish(self, step: int, model: Any) -> None:
        try:
            if step >= 0:
                self._runtime.commit(step)
        finally:
            self.positions.close()
            self._runtime.close()
            self.checkpointer.close()


class _Member:
    """A workflow's command member: its :class:`~resilient_flows.training.ScriptRun` decides when to
    checkpoint, logs the loss to the member's metrics log, and exits with status 75 on a stop."""

    logs_loss = True

    def __init__(self) -> None:
        from resilient_flows.training import from_env

        self.run = from_env()
        self.checkpointer = self.run.context.checkpointer
        self.positions = self.run.context.data

    def track(self, model: Any, optimizer: Any, scheduler: Any, extra: dict[str, Any]) -> int | None:
        self.run.restore(model=model, optimizer=optimizer, scheduler=scheduler, extra=extra)
        return self.run.context.restored_step

    def begin(self) -> None:
        """Nothing to do: the member's run handles stop signals from its start."""

    def abandon(self) -> None:
        """Nothing to do: the member's run ends with its process."""

    def step_end(self, global_step: int, control: TrainerControl) -> None:
        control.should_save = False  # the member's interval replaces save_strategy

    def epoch_end(self, control: TrainerControl) -> None:
        control.should_save = False

    def boundary(self, step: int, loss: float | None, control: TrainerControl) -> None:
        self.run.step(step, **({} if loss is None else {"loss": loss}))  # may exit: 75 on a stop

    def save_requested(self, step: int) -> None:
        """Trainer asked for a checkpoint outside the member's interval (``save_strategy="best"``): ignored."""

    def finish(self, step: int, model: Any) -> None:
        self.run.close(model=model)


def _world_group() -> Any:
    """The default process group when Trainer runs on several ranks (DDP), else None."""
    import torch.distributed as dist

    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
