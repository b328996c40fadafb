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
committed checkpoint at the next step boundary, and writes the member's metrics. A
:class:`~resilient_flows.training.ResumableLoader` given to ``fit`` resumes mid-epoch at the next
sample: Lightning checkpoints its position, and the callback gives each rank its share
(:mod:`resilient_flows.integrations.lightning._data`).

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

from typing import TYPE_CHECKING

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.integrations.lightning._callback": ("ResilientCallback",),
    "resilient_flows.integrations.lightning._checkpoint_io": ("ResilientCheckpointIO",),
    "resilient_flows.integrations.lightning._package": ("LIGHTNING",),
    "resilient_flows.integrations.lightning._strategy": ("ResilientModelParallelStrategy",),
}

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.integrations.lightning._callback import (
        ResilientCallback as ResilientCallback,
    )
    from resilient_flows.integrations.lightning._checkpoint_io import (
        ResilientCheckpointIO as ResilientCheckpointIO,
    )
    from resilient_flows.integrations.lightning._package import (
        LIGHTNING as LIGHTNING,
    )
    from resilient_flows.integrations.lightning._strategy import (
        ResilientModelParallelStrategy as ResilientModelParallelStrategy,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
