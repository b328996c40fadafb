"""Resumable loaders in a Lightning fit: each rank's share of the global batch, and Lightning's epoch.

Lightning already checkpoints a training loader that has ``state_dict``/``load_state_dict`` (its
fit loop saves them under ``loops/fit_loop/state_dict/combined_loader`` and hands them back before
the first batch of a resumed fit) and, for such a loader, counts the batches of a resumed epoch on
from where the checkpoint was: it skips nothing itself, so the loader alone decides where the data
go on. A :class:`~resilient_flows.training.ResumableLoader` does, in O(1). What Lightning cannot
give it is done here: the rank's place (Lightning injects a ``DistributedSampler`` into a plain
``DataLoader`` only) and the epoch (Lightning calls ``set_epoch`` on a loader's sampler only).
"""

from __future__ import annotations

from typing import Any

from lightning_utilities.core.apply_func import apply_to_collection

from resilient_flows.training import ResumableLoader


def place_loaders(trainer: Any) -> list[ResumableLoader]:
    """Give every resumable training loader its rank's share and Lightning's current epoch.

    Called before the epoch's first batch is drawn (a loader's iterator draws nothing until its
    first ``next``): at the start of training, where a resumed epoch goes on, and at the start of
    each epoch, where ``reload_dataloaders_every_n_epochs`` may have made new loaders. The epoch
    of a loader already in it is left alone, so a resumed epoch goes on at its position.
    """
    loaders: list[ResumableLoader] = []
    apply_to_collection(trainer.train_dataloader, ResumableLoader, loaders.append)
    placement = trainer.distributed_sampler_kwargs or {"rank": 0, "num_replicas": 1}
    for loader in loaders:
        loader.set_ranks(int(placement["rank"]), int(placement["num_replicas"]))
        loader.set_epoch(trainer.current_epoch)
    return loaders


def close_loaders(trainer: Any) -> None:
    """Stop the worker processes of every resumable training loader, as a fit ends or fails:
    Lightning stops those of its own ``DataLoader`` objects only (see
    :meth:`~resilient_flows.training.ResumableLoader.close`)."""
    apply_to_collection(trainer.train_dataloader, ResumableLoader, ResumableLoader.close)
