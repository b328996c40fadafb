"""An iterable dataset's position in every checkpoint, through torchdata's ``StatefulDataLoader``.

A stream has no global order that :class:`~resilient_flows.training.ResumableLoader` could slice:
where it is is what its loader says, per rank (each rank reads its own stream, each worker its
own part of it). torchdata's ``StatefulDataLoader`` says it in ``state_dict()``: how many
batches were yielded, each worker's dataset state (where the dataset has a ``state_dict``,
else the count it fast-forwards by on resume) and the workers' base seed. :class:`StreamLoader`
keeps that state, with the rank and the world size it belongs to, in each rank's own part of
every checkpoint, and gives it back on resume. A resume on another rank count is refused: a
rank's stream position says nothing of where another rank count's streams would be.

torchdata is an optional extra (``pip install 'resilient-flows[data]'``); nothing here imports
it before an iterable dataset or a ``StatefulDataLoader`` comes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from resilient_flows.errors import ResilientFlowsError
from resilient_flows.training._data_order import derive_seed
from resilient_flows.training._loader import stop_workers

#: What installs torchdata.
EXTRA = "pip install 'resilient-flows[data]'"

#: The ``DataLoader`` arguments of a user's loader over an iterable dataset that its stateful one keeps.
_KEPT = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "persistent_workers",
)


def _stateful_class(name: str) -> type:
    """torchdata's ``StatefulDataLoader``, or an error that says how to install it."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        raise ResilientFlowsError(
            f"loader {name!r}: an IterableDataset resumes through torchdata's StatefulDataLoader, which is not "
            f"installed: {EXTRA}"
        ) from None
    return StatefulDataLoader


def is_stream(data: Any) -> bool:
    """Whether ``ctx.loader`` resumes ``data`` by its loader's own state rather than by a global order:
    an iterable dataset, a ``DataLoader`` over one, or a ``StatefulDataLoader`` of any dataset."""
    if isinstance(data, IterableDataset):
        return True
    if not isinstance(data, DataLoader):
        return False
    torchdata = sys.modules.get("torchdata.stateful_dataloader")  # not imported: data is none of its loaders
    return isinstance(data.dataset, IterableDataset) or (
        torchdata is not None and isinstance(data, torchdata.StatefulDataLoader)
    )


def stream_loader(
    data: Any, batch_size: int | None, *, seed: int, rank: int, world_size: int, name: str, **loader_kwargs: Any
) -> StreamLoader:
    """A :class:`StreamLoader` around ``data``: a ``StatefulDataLoader`` as it is, or one built over an
    iterable dataset (``batch_size`` is the global batch, each rank's loader gets its share) or
    over the dataset and arguments of a ``DataLoader`` (whose ``batch_size`` is per rank)."""
    stateful = _stateful_class(name)
    if isinstance(data, stateful):
        if batch_size is not None or loader_kwargs:
            raise ResilientFlowsError(
                f"loader {name!r}: a StatefulDataLoader comes built; give its arguments to it, not to ctx.loader"
            )
        return StreamLoader(data, rank=rank, world_size=world_size, name=name)
    if isinstance(data, DataLoader):
        taken = {key: getattr(data, key) for key in _KEPT}
        if data.num_workers > 0:
            taken["prefetch_factor"] = data.prefetch_factor
        per_rank, data = data.batch_size, data.dataset
        loader_kwargs = {**taken, **loader_kwargs}
    else:
        per_rank = _share(batch_size, world_size, name)
    if loader_kwargs.pop("shuffle", None):
        raise ResilientFlowsError(f"loader {name!r}: a stream is read in its own order; shuffle it in the dataset")
    generator = torch.Generator().manual_seed(derive_seed(seed, "stream-workers", rank))  # the workers' base seed
    made = stateful(data, batch_size=per_rank, generator=generator, **loader_kwargs)
    return StreamLoader(made, rank=rank, world_size=world_size, name=name)


def _share(batch_size: int | None, world_size: int, name: str) -> int:
    """Each rank's batch of a global ``batch_size``: the ranks must divide it, for a stream has no
    global batch to cut unevenly."""
    batch = 1 if batch_size is None else int(batch_size)
    if batch < world_size or batch % world_size:
        raise ResilientFlowsError(
            f"loader {name!r}: a global batch of {batch} does not split evenly over {world_size} ranks; "
            "a stream's batch_size must be a multiple of the rank count"
        )
    return batch // world_size


class StreamLoader:
    """A ``StatefulDataLoader`` whose state is part of every checkpoint, per rank.

    What :meth:`TrainContext.loader <resilient_flows.training.TrainContext.loader>` returns for an
    iterable dataset. Iterate it like its loader (``for batch in loader`` runs to the end of the
    stream, the next ``for`` reads it again as the next epoch), or use :meth:`batches` with
    ``ctx.batches``. The dataset shards itself over ranks and workers, as under any
    ``DataLoader`` (``ctx.rank``, ``ctx.world_size``, ``torch.utils.data.get_worker_info()``).
    """

    #: Saved in each rank's own part of a checkpoint: a stream's position is the rank's alone.
    per_rank = True
    #: Every rank reads a batch of the same size: DDP's average needs no weight.
    rank_weight = 1.0

    def __init__(self, loader: Any, *, rank: int, world_size: int, name: str = "train") -> None:
        self.loader, self.rank, self.world_size, self.name = loader, rank, world_size, name
        self.epoch = 0
        self._live: Iterator[Any] | None = None  # the epoch's iterator, whose workers close() stops

    def __iter__(self) -> Iterator[Any]:
        self._live = iter(self.loader)
        yield from self._live
        self.epoch += 1

    def close(self) -> None:
        """Stop the worker processes of the epoch being read now (see
        :func:`~resilient_flows.training._loader.stop_workers`), as the member's run ends."""
        stop_workers(self.loader, self._live)
        self._live = None

    def batches(self) -> Iterator[Any]:
        """Batch after batch, reading the stream again at its end, without end. The rest of an epoch
        may be empty (a checkpoint after its last batch); a whole epoch may not."""
        empty = 0
        while empty < 2:
            empty += 1
            for batch in self:
                empty = 0
                yield batch
        raise ResilientFlowsError(f"loader {self.name!r}: the stream yielded no batch in epoch {self.epoch - 1}")

    def state_dict(self) -> dict[str, Any]:
        """The loader's state, with the rank and rank count it is the position of."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "epoch": self.epoch,
            "loader": self.loader.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on where ``state`` left this rank's stream; only on the rank count that saved it."""
        if int(state["world_size"]) != self.world_size or int(state["rank"]) != self.rank:
            raise ResilientFlowsError(
                f"loader {self.name!r}: the checkpoint holds the stream positions of {state['world_size']} rank(s) "
                f"and this member runs on {self.world_size}: an iterable dataset's position is per rank and does "
                f"not reshard; resume on {state['world_size']} rank(s), or give ctx.loader a map-style dataset "
                "(len() and [i]), whose position resumes on any rank count"
            )
        self.epoch = int(state["epoch"])
        self.loader.load_state_dict(state["loader"])
