"""A data loader whose position is part of the train state, and the same on any number of ranks.

A ``DataLoader(dataset, shuffle=True)`` restarts its epoch when the process restarts, and a
``DistributedSampler`` deals samples by rank count: after a resume, on the same ranks or on
others, samples are trained twice or never. :class:`ResumableLoader` keeps what decides the next
batch in a few integers:

- each epoch's global order is a permutation drawn from ``(seed, epoch)`` and the dataset's length
  (:mod:`resilient_flows.training._data_order`), never from the world size;
- the position is the number of samples of that order already trained; each global batch of
  ``batch_size`` samples is cut into one contiguous share per rank;
- every sample is loaded with the torch, numpy and ``random`` generators seeded from
  ``(seed, epoch, sample index)``, so its random augmentation is the same whichever rank or worker
  loads it, before and after a resume;
- resuming slices the order at the position: no skipped sample is loaded.

The state (epoch, position, seed, shuffle, dataset length) is a handful of JSON values in every
checkpoint (see :class:`DataPositions`); it is replicated, so a checkpoint of 4 ranks resumes on 3.
"""

from __future__ import annotations

import contextlib
import random
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    get_worker_info,
)

from resilient_flows.errors import ResilientFlowsError
from resilient_flows.training._data_order import (
    batches_per_epoch,
    derive_seed,
    epoch_end,
    epoch_order,
    rank_share,
    sample_seed,
)

#: DataLoader arguments that decide the order, which the loader owns.
_OWNED = ("sampler", "batch_sampler", "generator")


def stop_workers(loader: DataLoader, live: Iterator[Any] | None) -> None:
    """Stop the worker processes of ``live``, an iterator of ``loader``, and of the iterator
    ``loader`` keeps (persistent workers, or one torchdata's ``state_dict()`` started), now; the
    loader's next iterator starts new ones.

    A member's training function keeps its loader's iterator in a cycle of frames and generators,
    which the garbage collector frees, and it runs the finalizers of the iterator's queues before
    the iterator's ``__del__``: their feeder threads end before the shutdown message reaches the
    workers, and the shutdown waits 5 s for each worker before it kills it, stalling whatever the
    process does next (in a Parsl worker, the next member). ``_shutdown_workers`` is the step
    torch's own ``__del__`` takes, and forgetting the kept iterator lets the loader be read again,
    as Lightning does for its own loaders; it does nothing the second time, and an iterator
    without workers has none.
    """
    kept = getattr(loader, "_iterator", None)
    for iterator in (live, kept):
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
    if kept is not None:
        loader._iterator = None


class _SeededSamples(Dataset):
    """The user's dataset, indexed by ``(epoch, index)``: each sample loads under its own seed."""

    def __init__(self, dataset: Any, seed: int, seeded: bool) -> None:
        self.dataset, self.seed, self.seeded = dataset, seed, seeded

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        if not self.seeded:
            return self.dataset[index]
        if get_worker_info() is not None:  # a worker's generators serve its samples only
            _seed_generators(sample_seed(self.seed, epoch, index))
            return self.dataset[index]
        with _kept_generators():  # in the training process: the training's own draws stay as they were
            _seed_generators(sample_seed(self.seed, epoch, index))
            return self.dataset[index]


def _seed_generators(seed: int) -> None:
    torch.default_generator.manual_seed(seed)  # the CPU's only: torch.manual_seed also seeds every device, at 1 ms
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)


@contextlib.contextmanager
def _kept_generators() -> Iterator[None]:
    state = torch.default_generator.get_state(), random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        torch.default_generator.set_state(state[0])
        random.setstate(state[1])
        np.random.set_state(state[2])


class _ShareBatches:
    """The batch sampler: this rank's share of each global batch, from a start position on.

    It refers to its loader weakly: a loader that is part of no cycle is freed once dropped, with
    its workers stopped at once (see :func:`stop_workers` for what the garbage collector does)."""

    def __init__(self, loader: ResumableLoader) -> None:
        self._loader = weakref.ref(loader)
        self.epoch, self.start = 0, 0

    @property
    def loader(self) -> ResumableLoader:
        loader = self._loader()
        if loader is None:
            raise ResilientFlowsError("a ResumableLoader's DataLoader is read after the ResumableLoader was dropped")
        return loader

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        # No local names the loader across a yield: the iterator's sampler would hold it.
        epoch, (end, size, order) = self.epoch, self._epoch(self.epoch)
        for first in range(self.start, end, size):
            yield [(epoch, index) for index in self._share(order[first : min(first + size, end)])]

    def _epoch(self, epoch: int) -> tuple[int, int, torch.Tensor]:
        """The epoch's end position, the global batch size, and the epoch's order."""
        loader = self.loader
        end = epoch_end(loader.length, loader.batch_size, loader.drop_last)
        return end, loader.batch_size, epoch_order(loader.length, loader.seed, epoch, loader.shuffle)

    def _share(self, batch: torch.Tensor) -> list[int]:
        """This rank's share of a global batch, by the loader's rank now (``set_ranks`` may change it)."""
        loader = self.loader
        return batch[rank_share(len(batch), loader.rank, loader.world_size)].tolist()

    def __len__(self) -> int:
        loader = self.loader
        end = epoch_end(loader.length, loader.batch_size, loader.drop_last)
        return -(-(end - self.start) // loader.batch_size)


class ResumableLoader:
    """A ``DataLoader`` over a map-style dataset that resumes at the next sample, on any rank count.

    Iterate it like a ``DataLoader``: ``for batch in loader`` yields this rank's share of each
    global batch left in the current epoch, and the next ``for`` starts the next epoch;
    :meth:`batches` runs over epochs without end, for ``zip(ctx.steps(total), loader.batches())``.
    Build it with :meth:`TrainContext.loader <resilient_flows.training.TrainContext.loader>`,
    which fills in the rank, world size and seed and puts its state in every checkpoint; or
    directly, and checkpoint :meth:`state_dict` yourself.

    Parameters
    ----------
    dataset:
        A map-style dataset: ``len(dataset)`` and ``dataset[i]`` for ``0 <= i < len`` (a torch
        ``Dataset``, a Hugging Face ``datasets.Dataset``, a list). Not an ``IterableDataset``: it
        has no order to resume in.
    batch_size:
        The *global* batch: what one step trains over all ranks together. Each rank takes a
        contiguous share; when the ranks do not divide it, shares differ by one sample (the
        first ones are shorter), and :attr:`rank_weight` says how to weigh a rank's mean loss.
    shuffle, drop_last:
        As in ``DataLoader``; ``drop_last`` drops the epoch's last global batch when it is short.
    seed:
        Decides each epoch's order and each sample's augmentation seed with the epoch.
    rank, world_size:
        This process's place among the ranks that share each global batch.
    seed_samples:
        Seed torch, numpy and ``random`` from ``(seed, epoch, index)`` before loading each sample,
        so that random augmentation does not depend on which rank or worker loads it.
    name:
        Its key in a checkpoint, when a member has several loaders.
    loader_kwargs:
        Any other ``DataLoader`` argument: ``num_workers``, ``persistent_workers``,
        ``collate_fn``, ``worker_init_fn``, ``pin_memory``, ``prefetch_factor``, ...
        Not ``sampler``, ``batch_sampler`` or ``generator``: the loader owns the order.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        *,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        seed_samples: bool = True,
        name: str = "train",
        **loader_kwargs: Any,
    ) -> None:
        self.length = _check_dataset(dataset, name)
        owned = sorted(set(loader_kwargs) & set(_OWNED))
        if owned:
            raise ResilientFlowsError(
                f"loader {name!r}: {', '.join(owned)} decide the sample order, which a resumable loader owns; "
                "pass shuffle= and the member's seed instead"
            )
        self.dataset, self.batch_size, self.shuffle, self.drop_last = dataset, int(batch_size), shuffle, drop_last
        self.seed, self.rank, self.world_size, self.name = int(seed), rank, world_size, name
        self.epoch, self.position = 0, 0
        self._check_shares()
        self._samples = _SeededSamples(dataset, self.seed, seed_samples)
        self._batches = _ShareBatches(self)
        self._last_batch = self.batch_size
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "workers"))  # never the global RNG
        self.loader = DataLoader(self._samples, batch_sampler=self._batches, generator=generator, **loader_kwargs)
        self._live: Iterator[Any] | None = None  # the epoch's iterator, whose workers close() stops

    def _check_shares(self) -> None:
        """Every rank must get a sample of every global batch: DDP steps all ranks together."""
        if self.batch_size < 1:
            raise ResilientFlowsError(f"loader {self.name!r}: batch_size must be at least 1, not {self.batch_size}")
        tail = self.length % self.batch_size if not self.drop_last else 0
        smallest = min(self.batch_size, tail or self.batch_size, self.length)
        if smallest < self.world_size:
            raise ResilientFlowsError(
                f"loader {self.name!r}: a global batch of {smallest} sample(s) cannot give each of "
                f"{self.world_size} ranks a share; use a larger batch_size"
                + ("" if smallest == self.batch_size else " or drop_last=True")
            )

    def __len__(self) -> int:
        """Global batches per epoch (the same on every rank)."""
        return batches_per_epoch(self.length, self.batch_size, self.drop_last)

    def __iter__(self) -> Iterator[Any]:
        end = epoch_end(self.length, self.batch_size, self.drop_last)
        if self.position >= end:  # the last epoch was done: this is the next one
            self.epoch, self.position = self.epoch + 1, 0
        self._batches.epoch, self._batches.start = self.epoch, self.position
        self._live = iter(self.loader)
        for batch in self._live:
            self._last_batch = min(self.batch_size, end - self.position)
            self.position += self._last_batch  # trained once the step that draws it ends: then it is saved
            yield batch

    def batches(self) -> Iterator[Any]:
        """Batch after batch, epoch after epoch, without end."""
        while True:
            yield from self

    def close(self) -> None:
        """Stop the worker processes of the epoch being read now (:func:`stop_workers`), as the
        member's run ends; a later ``for`` goes on at the position, with new ones."""
        stop_workers(self.loader, self._live)
        self._live = None

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch; the current epoch goes on where it is (as after a
        resume), so that a ``DistributedSampler``-style ``set_epoch`` loop stays exact."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def set_ranks(self, rank: int, world_size: int) -> None:
        """Take rank ``rank``'s share of each global batch among ``world_size`` ranks from the next
        batch on: for a framework that places the ranks after the loader was built (Lightning's
        strategy). The order and the position do not depend on it, so it may differ between attempts."""
        if not 0 <= rank < world_size:
            raise ResilientFlowsError(f"loader {self.name!r}: rank {rank} is not one of {world_size} ranks")
        self.rank, self.world_size = rank, world_size
        self._check_shares()

    @property
    def rank_weight(self) -> float:
        """This rank's share of the last global batch times the world size, over that batch's size:
        multiply the rank's mean loss by it when the ranks do not divide the batch, and DDP's
        average of the ranks' gradients is the gradient of the global batch's mean loss."""
        share = rank_share(self._last_batch, self.rank, self.world_size)
        return (share.stop - share.start) * self.world_size / self._last_batch

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: plain JSON values, the same on every rank."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "length": self.length,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from ``state``: its seed and shuffle decide the order, which must not change mid-run."""
        if int(state["length"]) != self.length:
            raise ResilientFlowsError(
                f"loader {self.name!r}: the checkpoint's dataset had {state['length']} samples, this one "
                f"{self.length}; a resumed member must read the same dataset"
            )
        self.seed, self.shuffle = int(state["seed"]), bool(state["shuffle"])
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._samples.seed = self.seed


def _check_dataset(dataset: Any, name: str) -> int:
    if isinstance(dataset, IterableDataset):
        raise ResilientFlowsError(
            f"loader {name!r}: an IterableDataset has no order to resume in; give a map-style dataset "
            "(len() and [i]), or the stream to ctx.loader, which resumes it through torchdata's StatefulDataLoader"
        )
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ResilientFlowsError(
            f"loader {name!r}: {type(dataset).__name__} is not a map-style dataset (it needs len() and [i])"
        )
    return len(dataset)


def loader_arguments(data: Any) -> tuple[Any, dict[str, Any]]:
    """The dataset and arguments of a ``DataLoader`` that a user already built.

    Its sampler tells the order: a ``RandomSampler`` shuffles, a ``SequentialSampler`` does not, a
    ``DistributedSampler`` shuffles as it says, and its per-rank ``batch_size`` times its
    ``num_replicas`` is the global batch. Any other sampler is refused: its order is its own.
    """
    if not isinstance(data, DataLoader):
        return data, {}
    if isinstance(data.dataset, IterableDataset):
        return data.dataset, {}  # refused with the dataset's message
    if data.batch_size is None or type(data.batch_sampler) is not BatchSampler:
        raise ResilientFlowsError(
            "ctx.loader: this DataLoader batches with its own batch_sampler; give the dataset and batch_size instead"
        )
    sampler, replicas = data.sampler, 1
    if isinstance(sampler, DistributedSampler):
        shuffle, replicas = sampler.shuffle, sampler.num_replicas
    elif isinstance(sampler, RandomSampler) and not sampler.replacement and sampler._num_samples is None:
        shuffle = True
    elif isinstance(sampler, SequentialSampler):
        shuffle = False
    else:
        raise ResilientFlowsError(
            f"ctx.loader: this DataLoader's sampler ({type(sampler).__name__}) has an order of its own, "
            "which cannot resume; give the dataset and shuffle= instead"
        )
    kwargs = {
        "batch_size": data.batch_size * replicas,
        "shuffle": shuffle,
        "drop_last": data.drop_last,
        "num_workers": data.num_workers,
        "collate_fn": data.collate_fn,
        "pin_memory": data.pin_memory,
        "timeout": data.timeout,
        "worker_init_fn": data.worker_init_fn,
        "multiprocessing_context": data.multiprocessing_context,
        "persistent_workers": data.persistent_workers,
    }
    if data.num_workers > 0:
        kwargs["prefetch_factor"] = data.prefetch_factor
    return data.dataset, kwargs


class DataPositions:
    """The loaders of a train state, as one Stateful: their positions by name.

    A map-style loader's position is the same on every rank (this Stateful's own state); a
    stream's is each rank's own (:attr:`per_rank`, saved in each rank's part of a checkpoint).
    A loader made after the state was restored takes its saved position when it joins
    (:meth:`add`), so that a training function may build its data before or after ``ctx.track``.
    """

    def __init__(self) -> None:
        self.loaders: dict[str, ResumableLoader] = {}
        self.saved: dict[str, dict[str, Any]] = {}
        self.restored = False  # whether a checkpoint gave positions
        self.per_rank = _RankPositions(self)

    def add(self, loader: Any) -> None:
        """Track ``loader``: a :class:`ResumableLoader`, or a stream's loader (``per_rank`` true)."""
        if loader.name in self.loaders or loader.name in self.per_rank.loaders:
            raise ResilientFlowsError(f"two loaders are named {loader.name!r}: give each its own name=")
        if getattr(loader, "per_rank", False):
            self.per_rank.add(loader)
            return
        if loader.name in self.saved:
            loader.load_state_dict(self.saved.pop(loader.name))
        self.loaders[loader.name] = loader

    def names(self) -> list[str]:
        """Every loader's name, sorted."""
        return sorted([*self.loaders, *self.per_rank.loaders])

    def close(self) -> None:
        """Stop every loader's worker processes, as the member's run ends."""
        for loader in [*self.loaders.values(), *self.per_rank.loaders.values()]:
            loader.close()

    def state_dict(self) -> dict[str, Any]:
        return {**self.saved, **{name: loader.state_dict() for name, loader in self.loaders.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.restored = True
        for name, position in state.items():
            if name in self.loaders:
                self.loaders[name].load_state_dict(position)
            else:
                self.saved[name] = dict(position)


class _RankPositions:
    """The per-rank half of :class:`DataPositions`: the streams' positions, as a Stateful of its own."""

    def __init__(self, positions: DataPositions) -> None:
        self.positions = positions
        self.loaders: dict[str, Any] = {}
        self.saved: dict[str, dict[str, Any]] = {}

    def add(self, loader: Any) -> None:
        if loader.name in self.saved:
            loader.load_state_dict(self.saved.pop(loader.name))
        self.loaders[loader.name] = loader

    def state_dict(self) -> dict[str, Any]:
        return {**self.saved, **{name: loader.state_dict() for name, loader in self.loaders.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.positions.restored = True
        for name, position in state.items():
            if name in self.loaders:
                self.loaders[name].load_state_dict(position)
            else:
                self.saved[name] = dict(position)
