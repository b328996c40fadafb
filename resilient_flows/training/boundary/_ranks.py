"""How a member's ranks agree at a step boundary: all stop, fork and retune at the same step, or
none does. A loop brings its own collectives (our communicator, or a framework's strategy)."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from resilient_flows.training.boundary._requests import Request

T = TypeVar("T")


class Ranks(Protocol):
    """The collectives a step boundary needs, over the member's ranks."""

    rank: int
    size: int

    def first_request(self, request: Request | None) -> Request | None:
        """The request of the first rank that has one, the same on every rank."""
        ...

    def broadcast(self, value: T) -> T:
        """Rank 0's ``value`` on every rank."""
        ...


class CommRanks:
    """:class:`Ranks` over a checkpoint communicator (mpi4py, a torch process group, or one rank)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size

    def first_request(self, request: Request | None) -> Request | None:
        if self.size == 1:
            return request
        return next((r for r in self.comm.allgather(request) if r is not None), None)

    def broadcast(self, value: T) -> T:
        return value if self.size == 1 else self.comm.bcast(value)
