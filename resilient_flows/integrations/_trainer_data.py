"""Trainer's training data through a ResumableLoader: a mid-epoch resume starts at the next sample.

``Trainer`` resumes mid-epoch by iterating over the batches already trained
(``skip_first_batches``): each is loaded and collated again, in worker processes whose generators
are not checkpointed, and a collator that draws random numbers draws them before Trainer resets
the generators. A :class:`~resilient_flows.training.ResumableLoader` built from the Trainer's own
settings replaces its training loader: the order of an epoch comes from ``(seed, epoch)``, the
position is in every checkpoint, each sample loads under its own seed, and a resume slices the
order at the position without loading what it skips.
"""

from __future__ import annotations

import logging
from collections.abc import Sized
from typing import TYPE_CHECKING, Any, TypeGuard

from torch.utils.data import DataLoader, IterableDataset
from transformers.trainer import Trainer  # not the package's top level: see integrations.transformers

from resilient_flows.errors import CheckpointError, ResilientFlowsError
from resilient_flows.training import DataPositions, ResumableLoader

if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)

#: Trainer's ``train_sampling_strategy`` values whose order a ResumableLoader draws: shuffled or not.
_SHUFFLE = {"random": True, "sequential": False}


def own_loader_reason(trainer: Trainer) -> str | None:
    """Why Trainer's own training loader must stay, or None when a ResumableLoader can replace it."""
    cls, args = type(trainer), trainer.args
    for method in ("get_train_dataloader", "_get_train_sampler", "get_resumed_dataloader"):
        if getattr(cls, method) is not getattr(Trainer, method):
            return f"{cls.__name__} overrides {method}"
    strategy = getattr(args, "train_sampling_strategy", "random")
    if strategy not in _SHUFFLE:
        return f"train_sampling_strategy={strategy!r} has an order of its own"
    if args.auto_find_batch_size:
        return "auto_find_batch_size changes the global batch between tries"
    if not getattr(args, "dataloader_in_order", True):
        return "dataloader_in_order=False yields batches in the order workers finish them"
    dataset = trainer.train_dataset
    if dataset is not None and (isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__")):
        return "an IterableDataset has no order to resume in"
    return _ranks_reason(trainer)


def _ranks_reason(trainer: Trainer) -> str | None:
    """Why the ranks cannot each take a share of every global batch, or None (DDP, one process)."""
    world = max(1, trainer.args.world_size)
    if world == 1:
        return None
    model_parallel = {
        "tensor": trainer.get_tp_size(),
        "context": trainer.get_cp_size(),
        "sequence": trainer.get_sp_size(),
    }
    shared = [f"{kind} parallelism ({size} ranks)" for kind, size in model_parallel.items() if size > 1]
    if shared:
        return f"{', '.join(shared)} feeds several ranks the same batch, which only Trainer's loader deals"
    dataset = trainer.train_dataset
    if dataset is None or not isinstance(dataset, Sized):  # Trainer's own error at train(); no length: turned away
        return None
    length, batch = len(dataset), global_batch(trainer)
    tail = 0 if trainer.args.dataloader_drop_last else length % batch
    smallest = min(batch, tail or batch, length)
    if smallest < world:
        return (
            f"a global batch of {smallest} sample(s) cannot give each of {world} ranks a share "
            f"(an epoch of {length} samples in global batches of {batch}): set dataloader_drop_last=True "
            "or a larger per_device_train_batch_size"
        )
    return None


def global_batch(trainer: Trainer) -> int:
    """Samples of one micro-step over all ranks: ``per_device_train_batch_size`` times the ranks, or,
    with Accelerate's ``split_batches``, ``per_device_train_batch_size`` itself, split among them."""
    if getattr(trainer.args.accelerator_config, "split_batches", False):
        return trainer._train_batch_size
    return trainer._train_batch_size * max(1, trainer.args.world_size)


def serves_data(trainer: Trainer, resumable_data: bool | None) -> bool:
    """Whether ``resilient_trainer(trainer, resumable_data=...)`` trains from a ResumableLoader:
    by default wherever it can (a log line says why not), always or never when told."""
    reason = own_loader_reason(trainer)
    if reason is None:
        return resumable_data is not False
    if resumable_data:
        raise ResilientFlowsError(f"resilient_trainer(resumable_data=True): {reason}")
    if resumable_data is None:
        logger.info("Trainer's own training loader stays (a resume reads the skipped batches): %s", reason)
    return False


def resumable_loader(trainer: Trainer) -> ResumableLoader:
    """The loader Trainer's ``get_train_dataloader`` would build, with the order and position ours.

    The same dataset (unused columns removed), collator, workers and ``drop_last``; the global
    batch is :func:`global_batch`, each rank (``process_index``) taking its share of it, as
    Accelerate's sharding of Trainer's loader would (the loader is not given to Accelerate: it is
    sharded already); the order is shuffled unless ``train_sampling_strategy="sequential"``, from
    ``data_seed`` (else ``seed``), the same on every rank.
    """
    args = trainer.args
    dataset, collator = trainer.train_dataset, trainer.data_collator
    if _is_datasets_dataset(dataset):
        dataset = trainer._remove_unused_columns(dataset, description="Training")
    else:
        collator = trainer._get_collator_with_removed_columns(collator, description="Training")
    workers: dict[str, Any] = (
        {"prefetch_factor": args.dataloader_prefetch_factor} if args.dataloader_num_workers > 0 else {}
    )
    world = max(1, args.world_size)
    return ResumableLoader(
        dataset,
        global_batch(trainer),
        shuffle=_SHUFFLE[getattr(args, "train_sampling_strategy", "random")],
        drop_last=args.dataloader_drop_last,
        seed=args.seed if args.data_seed is None else args.data_seed,
        rank=args.process_index if world > 1 else 0,
        world_size=world,
        collate_fn=collator,
        num_workers=args.dataloader_num_workers,
        pin_memory=args.dataloader_pin_memory,
        persistent_workers=args.dataloader_persistent_workers,
        multiprocessing_context=args.dataloader_multiprocessing_context,
        **workers,
    )


def _is_datasets_dataset(dataset: Any) -> TypeGuard[datasets.Dataset]:
    try:
        import datasets
    except ImportError:
        return False
    return isinstance(dataset, datasets.Dataset)


class TrainerData:
    """The resumable training loader of one Trainer, and its position in the checkpoints.

    ``positions`` is the Stateful the checkpoint holds under ``data``; the loader joins it when
    Trainer builds it (at each ``train()``), before the checkpoint is restored into it.
    """

    def __init__(self, trainer: Trainer, positions: DataPositions) -> None:
        self.trainer, self.positions = trainer, positions
        self.loader: ResumableLoader | None = None

    def build(self) -> ResumableLoader | DataLoader:
        """What ``trainer.get_train_dataloader()`` returns: a new loader (a later ``train()`` starts anew)."""
        if self.trainer.train_dataset is None:
            return Trainer.get_train_dataloader(self.trainer)  # Trainer's own error
        reason = own_loader_reason(self.trainer)
        if reason is not None:
            raise ResilientFlowsError(f"resilient_trainer(resumable_data=True): {reason}; pass resumable_data=False")
        self.positions.loaders.pop("train", None)
        self.loader = resumable_loader(self.trainer)
        self.positions.add(self.loader)
        return self.loader

    def resumed(self, loader: Any, num_batches: int) -> bool:
        """Whether ``loader`` (Trainer's, ``num_batches`` batches into its epoch) is ours and
        already there: then nothing is skipped. A checkpoint without a data position (saved
        before the loader was resumable) seeks to Trainer's count, in this loader's order."""
        if loader is not self.loader or self.loader is None:
            return False
        expected = num_batches * self.loader.batch_size
        if not self.positions.restored:
            logger.warning("the checkpoint holds no data position: the resumed epoch goes on in another order")
            steps_per_epoch = -(-len(self.loader) // self.trainer.args.gradient_accumulation_steps)
            epoch = int(self.trainer.state.global_step // max(1, steps_per_epoch))
            self.loader.load_state_dict({**self.loader.state_dict(), "epoch": epoch, "position": expected})
        elif self.loader.position != expected:
            raise CheckpointError(
                f"the checkpoint's data position (sample {self.loader.position} of epoch {self.loader.epoch}) is not "
                f"Trainer's ({num_batches} batches of {self.loader.batch_size} into the epoch): resume with the "
                "batch size and gradient accumulation it was saved with"
            )
        return True

    def restart_epoch(self) -> None:
        """``ignore_data_skip``: the resumed epoch starts from its first batch, as Trainer documents."""
        if self.loader is not None:
            self.loader.load_state_dict({**self.loader.state_dict(), "position": 0})
