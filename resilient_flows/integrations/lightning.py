"""PyTorch Lightning on resilient-flows: asynchronous multi-tier checkpoints, stop signals, workflow metrics.

Two objects, added to an ordinary ``Trainer``::

    from resilient_flows.integrations.lightning import ResilientCallback, ResilientCheckpointIO

    trainer = Trainer(
        plugins=[ResilientCheckpointIO()],  # the member's tiers in a workflow; directory=... elsewhere
        callbacks=[ModelCheckpoint(dirpath=ckpts, every_n_train_steps=50, save_last=True), ResilientCallback()],
    )
    trainer.fit(model, data, ckpt_path="last")  # resumes from the newest committed checkpoint, if any

:class:`ResilientCheckpointIO` replaces ``torch.save``: a save returns once the tensors are copied
into host buffers and the engine writes them behind training; the path Lightning names becomes a
reference to a step of the engine's store (:mod:`resilient_flows.integrations.pathstore` has the
mapping). :class:`ResilientCallback` turns SIGTERM/SIGUSR1 and the runner's requests into a
committed checkpoint at the next step boundary, and writes the member's metrics.

Both classes derive from the Lightning that is imported when this module is first imported:
``pytorch_lightning`` or ``lightning.pytorch``, whichever the script imported already (the
Trainer checks its plugins and callbacks against its own package's classes), else whichever is
installed, ``pytorch_lightning`` first. Import your Lightning before this module when both are
installed.

Under DDP Lightning calls the plugin on global rank 0 only; that rank writes the checkpoint whole,
and every rank reads it whole. FSDP2 (``fully_shard`` in ``configure_model``) runs under
:class:`ResilientModelParallelStrategy`: Lightning's own FSDP strategies read checkpoints with
``torch.load`` or DCP, around the plugin, so that one gathers the full state onto rank 0 to save
and shards what every rank reads back, on any number of ranks. Each rank writing its own shard,
as :class:`~resilient_flows.checkpoint.Checkpointer` does under ``TrainContext``, is not done
for Lightning yet.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from resilient_flows.errors import CheckpointError, ResilientFlowsError
from resilient_flows.integrations.pathstore import PathStore, load
from resilient_flows.rundir import TaskLayout
from resilient_flows.rundir.events import EventLog
from resilient_flows.rundir.metrics import MetricsLog
from resilient_flows.training.boundary import StopSignals, consume_request, fire_faults, pending_request
from resilient_flows.training.contract import ENV_NAMES, EXIT_PREEMPTED, RunContract
from resilient_flows.training.control import RequestWatch, member_dir, read_spec
from resilient_flows.training.spec import FaultSpec

__all__ = ["LIGHTNING", "ResilientCallback", "ResilientCheckpointIO", "ResilientModelParallelStrategy"]

logger = logging.getLogger(__name__)


def _import_lightning() -> ModuleType:
    """The Lightning package the script's Trainer comes from (see the module's docstring)."""
    names = ("pytorch_lightning", "lightning.pytorch")
    for name in names:
        if name in sys.modules:
            return sys.modules[name]
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(
        "resilient_flows.integrations.lightning needs PyTorch Lightning: "
        "pip install 'resilient-flows[lightning]' (or install lightning)"
    )


#: The Lightning package these classes derive from.
LIGHTNING = _import_lightning()
_CheckpointIO = LIGHTNING.plugins.CheckpointIO
_Callback = LIGHTNING.Callback
_ModelCheckpoint = LIGHTNING.callbacks.ModelCheckpoint
_ModelParallelStrategy = LIGHTNING.strategies.ModelParallelStrategy


#: Strategies whose ``load_checkpoint`` bypasses the CheckpointIO plugin (Lightning 2.6), and what to use.
_BYPASSING_STRATEGIES = {
    "FSDPStrategy": "ResilientModelParallelStrategy (FSDP2: fully_shard in configure_model) or DDP",
    "ModelParallelStrategy": "ResilientModelParallelStrategy, which reads checkpoints through the plugin",
    "DeepSpeedStrategy": "DDP or ResilientModelParallelStrategy",
}


def _contract() -> RunContract | None:
    """This process's run contract, or None outside a workflow."""
    return RunContract.from_env() if os.environ.get(ENV_NAMES["run_dir"]) else None


class ResilientCheckpointIO(_CheckpointIO):
    """A Lightning ``CheckpointIO`` that saves through the resilient-flows engine.

    Parameters
    ----------
    directory:
        The shared tier. Default: the member's checkpoint directory inside a workflow
        (``RESILIENT_FLOWS_CHECKPOINT_DIR``), else the directory of the first path saved.
    local_dir:
        Optional node-local tier, committed first and flushed to ``directory`` in the background.
        Default: the member's (``RESILIENT_FLOWS_LOCAL_DIR``) inside a workflow.
    persist_every:
        With ``local_dir``, every ``persist_every``-th save also goes to ``directory``. Default:
        the member's ``checkpoint.persist_every``, else 1.
    keep:
        Checkpoints are deleted when no path names them any more (``ModelCheckpoint`` removed its
        file, ``last.ckpt`` moved on), except the ``keep`` newest. Default: the member's
        ``checkpoint.keep``, else 2.

    A save returns once the checkpoint's tensors are copied into host buffers: later in-place
    updates do not reach it. Everything else in the checkpoint must be JSON (numbers, strings,
    lists, tuples, dicts with str or int keys); anything else raises :class:`CheckpointError`
    naming its key path, since a checkpoint is never pickled.

    A path whose name starts with ``last`` loads the newest committed checkpoint of its store in
    any tier, which is what ``trainer.fit(ckpt_path="last")`` asks for: a process killed after
    committing a newer checkpoint than its ``last`` named, or before committing the one it named,
    resumes from the newest that exists. Tensors are loaded onto the CPU, or onto
    ``map_location`` when it is a device.
    """

    def __init__(
        self,
        directory: str | os.PathLike | None = None,
        *,
        local_dir: str | os.PathLike | None = None,
        persist_every: int | None = None,
        keep: int | None = None,
    ) -> None:
        super().__init__()
        contract = _contract()
        spec = None if contract is None else read_spec(contract.run_dir, contract.member)
        if directory is None and contract is not None:
            directory = contract.checkpoint_dir
            local_dir = contract.local_dir if local_dir is None else local_dir
        if persist_every is None:
            persist_every = 1 if spec is None else spec.checkpoint.persist_every
        if keep is None:
            keep = 2 if spec is None else spec.checkpoint.keep
        self.directory = None if directory is None else Path(directory)
        self.local_dir = None if local_dir is None else Path(local_dir)
        self.persist_every = persist_every
        self.keep = keep
        self._contract = contract
        self._store: PathStore | None = None
        self.last_stall = 0.0

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        """Snapshot ``checkpoint`` under ``path``; serialisation and I/O go on in the background."""
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        done = checkpoint.get("global_step")
        if isinstance(done, bool) or not isinstance(done, int) or done < 1:
            raise CheckpointError(
                f"cannot save {path} at global_step {done!r}: a checkpoint is numbered by the optimizer step it "
                "follows, and none has run yet"
            )
        step = done - 1
        started = time.perf_counter()
        self._writer(path).save(checkpoint, step, path)
        self.last_stall = time.perf_counter() - started
        if self._contract is not None:
            EventLog(self._contract.run_dir).emit(
                "checkpointed", self._contract.member, step=step, stall_ms=round(1000 * self.last_stall, 3)
            )

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint ``path`` names (the newest of its store for ``last*``); ``weights_only``
        changes nothing: nothing is unpickled either way."""
        if self._store is not None:
            self._store.wait()  # read our own writes
        newest = Path(path).name.startswith(_ModelCheckpoint.CHECKPOINT_NAME_LAST)
        step, state = load(path, newest=newest)
        logger.info("loaded checkpoint step %d for %s", step, path)
        if isinstance(map_location, str | torch.device):
            state = _to_device(state, torch.device(map_location))
        return state

    def remove_checkpoint(self, path: Any) -> None:
        """Remove ``path``, and its checkpoint from every tier when no other path names it."""
        self._writer(path).remove(path)

    def wait(self) -> None:
        """Block until every checkpoint saved so far is committed (flushed, where it persists)."""
        if self._store is not None:
            self._store.wait()

    def teardown(self) -> None:
        """Wait for the writes in flight and free the host buffers (Lightning calls it after each stage)."""
        if self._store is not None:
            self._store.close()

    def _writer(self, path: Any) -> PathStore:
        if self._store is None:
            directory = self.directory if self.directory is not None else Path(path).absolute().parent
            self._store = PathStore(
                directory, local_dir=self.local_dir, persist_every=self.persist_every, keep=self.keep
            )
        return self._store


class ResilientModelParallelStrategy(_ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2 and tensor parallelism) resuming from our checkpoints.

    Lightning's strategy reads a checkpoint with ``torch.load`` or DCP, never through the Trainer's
    ``CheckpointIO``; this one reads it through :class:`ResilientCheckpointIO`. Saving gathers the
    full model and optimizer state onto global rank 0, which hands it to the plugin (a copy into
    host buffers, then background writes). Every rank reads the checkpoint whole and keeps its
    shards, so a run may resume on another number of ranks. The arguments are
    ``ModelParallelStrategy``'s, less ``save_distributed_checkpoint``: Lightning's per-rank
    checkpoints are DCP directories that the plugin never sees.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.pop("save_distributed_checkpoint", False):
            raise ValueError(
                "ResilientModelParallelStrategy saves through ResilientCheckpointIO, which gets the full state on "
                "rank 0: save_distributed_checkpoint=True (a DCP directory per checkpoint) cannot go through it"
            )
        super().__init__(*args, save_distributed_checkpoint=False, **kwargs)

    def teardown(self) -> None:
        """Lightning's ``ModelParallelStrategy`` skips its base class's teardown, which closes the
        checkpoint plugin: without this the engine would be closed only from an ``atexit`` hook."""
        super().teardown()
        self.checkpoint_io.teardown()

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Read ``checkpoint_path`` through the plugin and load its shards into the model and optimizers."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        if not isinstance(self.checkpoint_io, ResilientCheckpointIO):
            raise ResilientFlowsError(
                "ResilientModelParallelStrategy reads checkpoints through ResilientCheckpointIO: "
                "Trainer(strategy=ResilientModelParallelStrategy(), plugins=[ResilientCheckpointIO()])"
            )
        checkpoint = self.checkpoint_io.load_checkpoint(Path(self.broadcast(checkpoint_path)))
        full = StateDictOptions(full_state_dict=True, strict=self.lightning_module.strict_loading)
        set_model_state_dict(self.model, checkpoint.pop("state_dict"), options=full)
        if self.lightning_module.trainer.state.fn == LIGHTNING.trainer.states.TrainerFn.FITTING:
            for optimizer, state in zip(self.optimizers, checkpoint.get("optimizer_states", ()), strict=True):
                state = _keyed_by_name(state, self.model)
                set_optimizer_state_dict(self.model, optimizer, optim_state_dict=state, options=full)
        return checkpoint


def _keyed_by_name(state: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """Optimizer state as ``set_optimizer_state_dict`` takes it: Lightning saved it keyed by parameter index."""
    from torch.distributed.fsdp import FullyShardedDataParallel, OptimStateKeyType

    keys = [*state.get("state", {}), *(p for group in state.get("param_groups", ()) for p in group["params"])]
    if not any(isinstance(key, int) for key in keys):
        return state
    return FullyShardedDataParallel.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_NAME, model)


def _to_device(node: Any, device: torch.device) -> Any:
    if isinstance(node, torch.Tensor):
        return node.to(device)
    if isinstance(node, dict):
        return {k: _to_device(v, device) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return type(node)(_to_device(v, device) for v in node)
    return node


class ResilientCallback(_Callback):
    """Makes a Lightning run a well-behaved workflow member (and a preemptible job anywhere).

    - SIGTERM or SIGUSR1 (a batch system's warning, or the runner forwarding one), or a
      ``preempt`` request from the runner: at the next optimizer step boundary every rank agrees,
      the checkpoint is saved to ``last.ckpt`` (in the first ``ModelCheckpoint``'s directory, else
      in the plugin's) and committed, and the process exits with status 75 inside a workflow (the
      runner requeues it for free) or the Trainer stops outside one. A ``retire`` request stops
      the Trainer after the same checkpoint: ``fit`` returns.
    - Inside a workflow, rank 0 appends a line per optimizer step to the member's
      the member's metrics log (``loss`` from the training step's output, the rest from
      ``trainer.callback_metrics``), emits ``resumed``/``preempted``/``retired`` events, and
      writes the member's report (last metrics and the weights' digest) when ``fit`` ends.
    - Faults the workflow injects (``faults:``) hit the first attempt once the step they name is done.

    Steps count optimizer steps from 0, as for every member: step ``s`` is the one after which
    Lightning's ``global_step`` is ``s + 1``, in metrics, events, faults and checkpoint
    directories alike (``step-00000124`` holds what Lightning names ``epoch=5-step=125.ckpt``).

    It needs :class:`ResilientCheckpointIO` as the Trainer's checkpoint plugin: a stop waits for
    the checkpoint to be committed, which only that plugin can tell. The launcher of a command
    member beats the member's heartbeat for the process, so this callback does not.
    """

    def __init__(self) -> None:
        self.contract = _contract()
        self.stopped: str | None = None  # why the run stopped early, if it did
        self._spec = None if self.contract is None else read_spec(self.contract.run_dir, self.contract.member)
        self._faults: tuple[FaultSpec, ...] = () if self._spec is None else self._spec.faults
        self._signals = StopSignals()
        self._metrics: MetricsLog | None = None
        self._watch: RequestWatch | None = None
        self._last: dict[str, float] = {}
        self._report: dict[str, Any] | None = None  # what on_fit_end writes, agreed at the end of training
        # A process group that exists before the Trainer is the script's, not Lightning's: left alone.
        self._users_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        self._step = -1

    @property
    def _directory(self) -> Path:
        assert self.contract is not None
        return member_dir(self.contract.run_dir, self.contract.member)

    # ------------------------------------------------------------------ hooks

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
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
        if self._spec is not None and self._spec.parent is not None:
            raise ResilientFlowsError(
                f"member {self._spec.name} is a clone of {self._spec.parent.member}, and Lightning members do not "
                "clone yet: clone members whose scripts use from_env()"
            )
        if self.contract is not None and trainer.is_global_zero:
            self._metrics = MetricsLog(TaskLayout(self._directory).metrics)
            self._watch = RequestWatch(self._directory)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning installs its own SIGTERM handler just before training (it would end the run
        # with status 0): ours replaces it until the end of training.
        self._signals.reason, self.stopped, self._report = None, None, None
        self._signals.install()
        self._step = trainer.global_step - 1
        if trainer.ckpt_path is not None:
            self._emit(trainer, "resumed", attempt=self._attempt, step=self._step)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step - 1
        if step == self._step:  # accumulating gradients: no optimizer step yet
            return
        self._step = step
        self._log(trainer, step, outputs)
        if self.contract is not None:
            flush = None if self._metrics is None else self._metrics.flush
            fire_faults(self._faults, step, self.contract.attempt, self.contract.member, flush)
        request = self._agreed_request(trainer)
        if request is not None:
            self._stop(trainer, *request)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.flush()  # every step up to a committed checkpoint is on disk

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._signals.restore()
        if self.contract is None:
            return
        from resilient_flows.training.context import state_digest

        # Here, not at fit's end: the ranks agree over the process group, and Lightning's strategy
        # teardown (which closes the checkpoint plugin) comes before on_fit_end.
        digest = state_digest(pl_module)
        report = {"step": trainer.global_step - 1, **self._last, "digest": digest}
        if trainer.world_size > 1:  # replicas that drifted apart (a rank that restored another state) show here
            agree = digest == trainer.strategy.broadcast(digest)
            report["ranks_agree"] = trainer.strategy.reduce_boolean_decision(agree, all=True)
        self._report = report

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self._report is None or not trainer.is_global_zero:
            return
        if self.stopped is not None:
            self._report["stopped"] = self.stopped
        TaskLayout(self._directory).write_command_report(self._report)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._signals.restore()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if not self._users_group:
            _release_process_group(trainer)

    # ------------------------------------------------------------------ internals

    def _log(self, trainer: Any, step: int, outputs: Any) -> None:
        values = {k: float(v) for k, v in trainer.callback_metrics.items() if _is_scalar(v)}
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if _is_scalar(loss):
            values["loss"] = float(loss)
        self._last = {"step": step, **values}
        if self._metrics is not None:
            extra = {k: v for k, v in values.items() if k not in ("step", "attempt", "time")}
            self._metrics.append({"step": step, "attempt": self.contract.attempt, "time": time.time(), **extra})

    def _agreed_request(self, trainer: Any) -> tuple[str, str] | None:
        """A stop request any rank has (a signal) or rank 0 read (the runner's), the same on every rank."""
        look = self._watch is not None and self._watch.due()
        request = pending_request(self._signals.reason, look, self._directory if look else None)
        if trainer.world_size == 1:
            return request
        codes = {None: 0, "preempt": 1, "retire": 2}
        code = torch.tensor(codes[request[0] if request else None], device=trainer.strategy.root_device)
        agreed = int(trainer.strategy.reduce(code, reduce_op="max"))
        if agreed == 0:
            return None
        action = "preempt" if agreed == 1 else "retire"
        return action, request[1] if request is not None else "requested on another rank"

    def _stop(self, trainer: Any, action: str, reason: str) -> None:
        """Commit a checkpoint of this step on every tier it goes to, then stop or exit."""
        trainer.save_checkpoint(self._stop_path(trainer), weights_only=False)
        if trainer.is_global_zero:
            trainer.strategy.checkpoint_io.wait()
        trainer.strategy.barrier("resilient-flows stop")
        self.stopped = reason
        step = trainer.global_step - 1
        if self.contract is not None and trainer.is_global_zero:
            consume_request(self._directory)
        kind = "retired" if action == "retire" else "preempted"
        self._emit(
            trainer, kind, step=step, reason=reason, **({} if action == "retire" else {"attempt": self._attempt})
        )
        logger.warning("stopping after committing step %d: %s", step, reason)
        if action == "preempt" and self.contract is not None:
            self.teardown(trainer, trainer.lightning_module, "fit")
            raise SystemExit(EXIT_PREEMPTED)
        trainer.should_stop = True

    @property
    def _attempt(self) -> int:
        return 1 if self.contract is None else self.contract.attempt

    def _stop_path(self, trainer: Any) -> Path:
        """``last.ckpt`` where ``trainer.fit(ckpt_path="last")`` looks for it."""
        name = _ModelCheckpoint.CHECKPOINT_NAME_LAST + _ModelCheckpoint.FILE_EXTENSION
        callback = trainer.checkpoint_callback
        if isinstance(callback, _ModelCheckpoint) and callback.dirpath is not None:
            return Path(callback.dirpath) / name
        io = trainer.strategy.checkpoint_io
        return Path(io.directory if io.directory is not None else trainer.default_root_dir) / name

    def _emit(self, trainer: Any, kind: str, **fields: Any) -> None:
        if self.contract is not None and trainer.is_global_zero:
            EventLog(self.contract.run_dir).emit(kind, self.contract.member, **fields)


def _release_process_group(trainer: Any) -> None:
    """Destroy the default process group Lightning created and never destroys.

    Left to interpreter exit, torch's gloo worker threads are torn down during finalisation and
    the process now and then aborts (SIGABRT, "terminate called without an active exception")
    after training finished and committed everything. A later ``fit`` or ``test`` of the same
    Trainer creates the group again.
    """
    if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _is_scalar(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, int | float) and not isinstance(value, bool)
