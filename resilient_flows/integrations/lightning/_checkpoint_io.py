"""Lightning's ``CheckpointIO`` over the resilient-flows engine."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from resilient_flows.checkpoint import TierSpec
from resilient_flows.checkpoint._config import check_tiers
from resilient_flows.errors import CheckpointError
from resilient_flows.integrations.lightning._package import CheckpointIO, ModelCheckpoint, run_contract
from resilient_flows.integrations.pathstore import PathStore, load
from resilient_flows.rundir import EventLog

logger = logging.getLogger(__name__)


class ResilientCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` that saves through the resilient-flows engine.

    Parameters
    ----------
    tiers:
        The shared tier's directory, or a node-local tier and the shared one as a
        :class:`~resilient_flows.checkpoint.Checkpointer` takes them (``[local,
        TierSpec(shared, ...)]``: committed in the first, flushed on at the shared
        :class:`~resilient_flows.checkpoint.TierSpec`'s cadence). Default inside a workflow:
        the member's node-local tier and its shared one, with the cadence of its checkpoint
        configuration (``RESILIENT_FLOWS_CHECKPOINT``); else the directory of the first path saved.
    keep:
        Checkpoints are deleted when no path names them any more (``ModelCheckpoint`` removed its
        file, ``last.ckpt`` moved on), except the ``keep`` newest. Default: the member's
        ``keep``, else 2.

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
        tiers: str | os.PathLike | Sequence[TierSpec | str | os.PathLike] | None = None,
        *,
        keep: int | None = None,
    ) -> None:
        super().__init__()
        contract = run_contract()
        config = None if contract is None else contract.checkpoint_config()
        if tiers is None and config is not None:
            local = config.tier("local")  # a path store keeps one node-local tier, committed first
            tiers = [config.shared] if local is None else [TierSpec(local.path, name="local"), config.shared]
        self.tiers = None if tiers is None else check_tiers(tiers)
        self.directory = None if self.tiers is None else Path(self.tiers[-1].path)
        self.keep = keep if keep is not None else 2 if config is None else config.keep
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
            tiers = self.tiers if self.tiers is not None else Path(path).absolute().parent
            self._store = PathStore(tiers, keep=self.keep)
        return self._store


def _to_device(node: Any, device: torch.device) -> Any:
    if isinstance(node, torch.Tensor):
        return node.to(device)
    if isinstance(node, dict):
        return {k: _to_device(v, device) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return type(node)(_to_device(v, device) for v in node)
    return node
