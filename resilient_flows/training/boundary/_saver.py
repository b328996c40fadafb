"""How a step boundary saves and commits: the interface a loop's checkpointing offers it, and the
one over our :class:`~resilient_flows.checkpoint.Checkpointer`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from resilient_flows.checkpoint import Checkpointer, TrainState

#: Runs when a checkpoint commits in a tier: ``(tier, step)``.
OnCommit = Callable[[Any, int], None]


class Saver(Protocol):
    """A loop's checkpointing, as its step boundary drives it. ``save`` and ``wait`` raise
    :class:`~resilient_flows.errors.StorageFullError` when a checkpoint failed on a full file
    system; the boundary decides whether training goes on."""

    #: The step of the last save asked for (None: none since the restored state, or it failed).
    last_saved: int | None
    #: Whether each save is announced (a ``checkpointed`` event) by the saver's own plugin, which
    #: also sees the saves a framework starts itself.
    reports_saves: bool

    @property
    def stall(self) -> float:
        """Seconds the last save stalled training."""
        ...

    def save(
        self, step: int, *, persist: bool | None = None, on_commit: OnCommit | None = None, cached: bool = False
    ) -> None:
        """Start a checkpoint of ``step``: ``persist`` to every tier, ``on_commit`` as it commits
        in each, ``cached`` kept in memory (a clone on this node reads it next)."""
        ...

    def wait(self) -> None:
        """Return once every checkpoint started is committed."""
        ...

    def prepare(self, step: int) -> None:
        """The state has its final layout after ``step``: get ready for the first save."""
        ...


class CheckpointSaver:
    """:class:`Saver` of a :class:`TrainState` (set by the loop once it declared one) through a Checkpointer."""

    reports_saves = False

    def __init__(self, checkpointer: Checkpointer, *, overlap: bool = False) -> None:
        self.checkpointer = checkpointer
        self.overlap = overlap
        self.state: TrainState | None = None
        self.last_saved: int | None = None

    @property
    def stall(self) -> float:
        return self.checkpointer.stats.last_stall

    def save(
        self, step: int, *, persist: bool | None = None, on_commit: OnCommit | None = None, cached: bool = False
    ) -> None:
        try:
            self.checkpointer.save(
                step, self.state, overlap=self.overlap, persist=persist, on_commit=on_commit, cached=cached
            )
        finally:  # a full file system raises an earlier checkpoint's failure: this one is queued
            self.last_saved = step

    def wait(self) -> None:
        self.checkpointer.wait()

    def prepare(self, step: int) -> None:
        if self.last_saved != step:  # a save of this step allocated the arena already
            self.checkpointer.prepare(self.state)
