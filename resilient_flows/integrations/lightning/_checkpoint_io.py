"""Lightning's ``CheckpointIO`` over the resilient-flows engine."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from resilient_flows.errors import CheckpointError
from resilient_flows.integrations.lightning._package import CheckpointIO, ModelCheckpoint, run_contract
from resilient_flows.integrations.pathstore import PathStore, load
from resilient_flows.rundir import EventLog
from resilient_flows.training import read_spec

logger = logging.getLogger(__name__)


class ResilientCheckpointIO(CheckpointIO):
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
        contract = run_contract()
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
        newest = Path(path).name.startswith(ModelCheckpoint.CHECKPOINT_NAME_LAST)
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


def _to_device(node: Any, device: torch.device) -> Any:
    if isinstance(node, torch.Tensor):
        return node.to(device)
    if isinstance(node, dict):
        return {k: _to_device(v, device) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return type(node)(_to_device(v, device) for v in node)
    return node
