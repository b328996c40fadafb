"""The few collectives the engine needs, over mpi4py, torch.distributed, or a single process.

Background threads run collectives while the training thread may run its own on the user's
communicator (gradient all-reduce). Collectives of two threads on one communicator may interleave
differently on different ranks and deadlock, so every background thread gets its own duplicate
(``MPI_Comm_dup`` / ``new_group``), created collectively in the Checkpointer's constructor.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch

#: Largest single broadcast: below the 2 GiB that 32-bit MPI counts allow.
BCAST_BYTES = 1 << 30

T = TypeVar("T")


@runtime_checkable
class Comm(Protocol):
    """A group of ranks that all call each collective in the same order."""

    rank: int
    size: int

    def allgather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, indexed by rank, on every rank."""
        ...

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """``root``'s ``obj`` on every rank."""
        ...

    def bcast_buffer(self, buffer: torch.Tensor, root: int) -> None:
        """Fill the contiguous CPU tensor ``buffer`` on every rank with ``root``'s, in place."""
        ...

    def exchange(self, sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]]) -> None:
        """Point to point: send each ``(rank, tensor)`` of ``sends`` and fill each of ``recvs`` from
        its rank, all at once (so that a ring of ranks sending to their neighbours cannot
        deadlock). Every rank that a rank sends to calls this with the matching receive; empty
        tensors are not sent (both sides know their sizes)."""
        ...

    def dup(self) -> Comm:
        """A new communicator over the same ranks (collective)."""
        ...

    def free(self) -> None:
        """Release a communicator made by ``dup`` (collective)."""
        ...

    def release(self) -> None:
        """Let go of a group the user tore down, so that it is destroyed now, not in the
        interpreter's teardown, where a gloo group's destructor can abort the process."""
        ...

    def group_ranks(self) -> list[int]:
        """The global ``torch.distributed`` rank of each rank of this group, in order."""
        ...

    def alive(self) -> bool:
        """False once the user tore the communication down (``destroy_process_group``, ``MPI_Finalize``)."""
        ...


class SingleProcess:
    """The world of one rank: collectives are identities."""

    rank = 0
    size = 1

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return obj

    def bcast_buffer(self, buffer: torch.Tensor, root: int) -> None:
        pass

    def exchange(self, sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]]) -> None:
        if sends or recvs:
            raise ValueError("a single process has no other rank to exchange data with")

    def dup(self) -> SingleProcess:
        return self

    def free(self) -> None:
        pass

    def release(self) -> None:
        pass

    def group_ranks(self) -> list[int]:
        import torch.distributed as dist

        return [dist.get_rank() if dist.is_available() and dist.is_initialized() else 0]

    def alive(self) -> bool:
        return True


class MPIComm:
    """An ``mpi4py.MPI.Comm``. Object collectives pickle, but only between our own ranks.

    MPICH and Open MPI busy-wait in blocking collectives. A background thread waiting there for
    a slower rank would burn the core that training needs, so each collective first waits for
    every rank in a non-blocking barrier polled every millisecond.
    """

    POLL_SECONDS = 0.001

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def _arrive(self) -> None:
        if self.size > 1:
            request = self._comm.Ibarrier()
            while not request.Test():
                time.sleep(self.POLL_SECONDS)

    def allgather(self, obj: Any) -> list[Any]:
        self._arrive()
        return self._comm.allgather(obj)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        self._arrive()
        return self._comm.bcast(obj, root=root)

    def bcast_buffer(self, buffer: torch.Tensor, root: int) -> None:
        data = buffer.view(torch.uint8).numpy()  # bytes: any dtype, no copy
        for start in range(0, len(data), BCAST_BYTES):  # MPI-3 counts are 32-bit
            self._comm.Bcast(data[start : start + BCAST_BYTES], root=root)

    def exchange(self, sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]]) -> None:
        """Each tensor must be under 2 GiB (32-bit MPI counts); polled like the collectives."""
        requests = [self._comm.Irecv(t.view(torch.uint8).numpy(), source=rank) for rank, t in recvs]
        requests += [self._comm.Isend(t.view(torch.uint8).numpy(), dest=rank) for rank, t in sends]
        from mpi4py import MPI

        while not MPI.Request.Testall(requests):
            time.sleep(self.POLL_SECONDS)

    def dup(self) -> MPIComm:
        return MPIComm(self._comm.Dup())

    def free(self) -> None:
        self._comm.Free()

    def release(self) -> None:
        pass  # MPI_Finalize freed every communicator

    def group_ranks(self) -> list[int]:
        """Taken to be the communicator's own ranks: launchers number MPI and torch ranks alike."""
        return list(range(self.size))

    def alive(self) -> bool:
        from mpi4py import MPI

        return not MPI.Is_finalized()


_RELEASED = object()  # what a released TorchComm holds instead of its group: any collective fails


class TorchComm:
    """A ``torch.distributed`` process group (``None``: the default group). Uses gloo for objects."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        # Any: a ProcessGroup, None (the default group), or _RELEASED, which torch rejects on purpose
        self._group: Any = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def allgather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        self._dist.all_gather_object(out, obj, group=self._group)
        return out

    def bcast(self, obj: Any, root: int = 0) -> Any:
        box = [obj]
        self._dist.broadcast_object_list(box, src=self._global(root), group=self._group)
        return box[0]

    def bcast_buffer(self, buffer: torch.Tensor, root: int) -> None:
        if buffer.numel():  # as bytes: gloo has no bfloat16 or bool
            self._dist.broadcast(buffer.view(torch.uint8), src=self._global(root), group=self._group)

    def exchange(self, sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]]) -> None:
        dist, group = self._dist, self._group
        sends, recvs = [(r, t) for r, t in sends if t.numel()], [(r, t) for r, t in recvs if t.numel()]
        works = [dist.irecv(t.view(torch.uint8), src=self._global(rank), group=group) for rank, t in recvs]
        works += [dist.isend(t.view(torch.uint8), dst=self._global(rank), group=group) for rank, t in sends]
        for work in works:
            work.wait()

    def _global(self, rank: int) -> int:
        """torch.distributed names the root of a collective by its rank in the default group."""
        return rank if self._group is None else self._dist.get_global_rank(self._group, rank)

    def dup(self) -> TorchComm:
        ranks = self.group_ranks()
        # Over the whole world every rank takes part, as new_group wants by default. Local
        # synchronisation (only the members meet) is for subgroups: with it, creating groups one
        # after another over all ranks of a busy world was seen to leave rank 0 waiting forever.
        local = len(ranks) < self._dist.get_world_size()
        group = self._dist.new_group(ranks=ranks, backend="gloo", use_local_synchronization=local)
        return TorchComm(group)

    def free(self) -> None:
        self._dist.destroy_process_group(self._group)

    def release(self) -> None:
        self._group = _RELEASED

    def group_ranks(self) -> list[int]:
        return self._dist.get_process_group_ranks(self._group or self._dist.group.WORLD)

    def alive(self) -> bool:
        return self._dist.is_initialized()


def as_comm(comm: Any) -> Comm:
    """Accept ``None``, an mpi4py communicator, a torch.distributed group, or a ready ``Comm``."""
    if comm is None:
        return SingleProcess()
    if isinstance(comm, SingleProcess | MPIComm | TorchComm):
        return comm
    if hasattr(comm, "Get_rank") and hasattr(comm, "Dup"):
        return MPIComm(comm)
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed support
        dist = None
    if dist is not None and dist.is_available() and isinstance(comm, dist.ProcessGroup):
        return TorchComm(comm)
    raise TypeError(
        f"comm must be None, an mpi4py communicator or a torch.distributed ProcessGroup, got {type(comm).__name__}"
    )


def first_problem(problems: Iterable[T | None]) -> T | None:
    """The first non-empty problem of an allgather: what every rank reports when one failed."""
    return next((p for p in problems if p), None)
