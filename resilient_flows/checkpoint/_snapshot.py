"""Copy the pieces this rank writes into one reusable host arena, now or behind the next step.

Allocating fresh host memory for every checkpoint costs page faults that make the copy about ten
times slower than a copy into memory already touched, so the arena is allocated once and reused
while the state's layout stays the same (it changes, for instance, when an optimizer creates its
state on the first step). On a CUDA machine the arena is pinned and device tensors are copied on a
side stream, so the copies run at PCIe speed and do not queue behind the training stream's kernels.

Order of operations the caller guarantees (the contract of :class:`Snapshot`):

1. ``start`` is called with the live leaves. Leaves marked *eager* are copied before it returns;
   the others are copied on a background thread (``overlap``) or also before it returns.
2. The caller does not mutate a deferred leaf until ``wait_copied`` has returned (the engine
   enforces this with an optimizer step pre-hook).
3. The arena is not reused until the writer has finished with it (``release``).

The arena also serves the flush to the next tier: once the writer is done, the flusher may
``lend`` it, as long as no newer save has taken it. A save ``acquire``-ing it meanwhile takes it
back at the next chunk boundary (the flusher polls ``wanted``), and the flusher reads the rest
from the lower tier's file instead. So a flush never delays a save by more than one chunk, and
never reads the disk when the checkpoint is still in memory.
"""

from __future__ import annotations

import mmap
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from resilient_flows.checkpoint._boxes import Box, piece_of
from resilient_flows.checkpoint._shardfile import ShardEntry
from resilient_flows.checkpoint._tree import Leaf
from resilient_flows.checkpoint._writeplan import WriteItem


class HostArena:
    """One contiguous uint8 host buffer laid out as a shard's data section.

    Who may touch it is one small state machine under a condition variable: a save holds it
    (``acquire``) until the writer has written the first tier (``release``); after that it still
    holds that checkpoint, identified by the ``generation`` its ``acquire`` returned, and the
    flusher may read it (``lend`` .. ``give_back``) until the next ``acquire`` bumps the generation.
    """

    def __init__(self, pin_memory: bool) -> None:
        self.pin_memory = pin_memory
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self._layout: tuple[ShardEntry, ...] = ()
        self._views: list[torch.Tensor] = []
        self.allocations = 0
        self.generation = 0
        self._cond = threading.Condition()
        self._busy = False  # a save fills it, or the writer writes from it
        self._lent = False  # the flusher reads from it
        self._wanted = False  # a save waits for the flusher to give it back

    def acquire(self) -> int:
        """Take the arena for a new checkpoint; its generation.

        Waits for the writer to finish with the previous checkpoint (backpressure), then for the
        flusher to give it back, which it does within one chunk.
        """
        with self._cond:
            while self._busy:
                self._cond.wait()
            self._busy = self._wanted = True
            while self._lent:
                self._cond.wait()
            self._wanted = False
            self.generation += 1
            return self.generation

    def release(self, generation: int) -> None:
        """The writer is done with checkpoint ``generation``; a stale call (after a newer
        ``acquire``) changes nothing, so that an error path may call it unconditionally."""
        with self._cond:
            if generation == self.generation:
                self._busy = False
                self._cond.notify_all()

    def lend(self, generation: int) -> bool:
        """For the flusher: True, and the arena is lent, if it still holds checkpoint ``generation``."""
        with self._cond:
            if self._busy or generation != self.generation:
                return False
            self._lent = True
            return True

    @property
    def wanted(self) -> bool:
        """A save waits for the flusher to give the arena back."""
        return self._wanted

    def give_back(self) -> None:
        with self._cond:
            self._lent = False
            self._cond.notify_all()

    @property
    def nbytes(self) -> int:
        return self.buffer.numel()

    def views(self, entries: Sequence[ShardEntry]) -> list[torch.Tensor]:
        """Typed views shaped like the entries, one each; reallocates only if the layout changed."""
        layout = tuple(entries)
        if layout != self._layout:
            total = sum(e.nbytes for e in layout)
            self.buffer, self._views = torch.empty(0, dtype=torch.uint8), []  # free the old arena first
            self.buffer = _allocate(total, self.pin_memory)
            self._views, offset = [], 0
            for e in layout:
                self._views.append(self.buffer[offset : offset + e.nbytes].view(e.dtype).view(e.shape))
                offset += e.nbytes
            self._layout = layout
            self.allocations += 1
        return self._views

    def touch(self) -> None:
        """Fault in every page of the arena (pinned memory already is)."""
        if not self.pin_memory and self.nbytes:
            self.buffer[:: mmap.PAGESIZE].zero_()


def _allocate(nbytes: int, pin_memory: bool) -> torch.Tensor:
    """Pinned memory for CUDA copies; otherwise an anonymous map, page-aligned for direct I/O."""
    if pin_memory or nbytes == 0:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin_memory)
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8)


@dataclass
class CopyTask:
    """Copy the box ``item.box`` of ``leaf`` (this rank's part of it: ``held``) into ``dst``."""

    item: WriteItem
    leaf: Leaf
    held: Box
    dst: torch.Tensor
    eager: bool

    def source(self) -> torch.Tensor:
        return piece_of(self.leaf, self.item.box, self.held)


class CopyWorker:
    """One long-lived thread for deferred copies: starting a thread per checkpoint costs more."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="rf-snapshot", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()


class Snapshot:
    """The copy of one checkpoint into the arena, possibly still running."""

    def __init__(self, tasks: Sequence[CopyTask], overlap: bool, worker: CopyWorker) -> None:
        self._copied = threading.Event()
        self._error: BaseException | None = None
        self._stream, self._ready = _side_stream(tasks)
        eager = [t for t in tasks if t.eager or not overlap]
        deferred = [t for t in tasks if not t.eager and overlap]
        self._copy(eager)
        if deferred:
            worker.submit(lambda: self._background(deferred))
        else:
            self._copied.set()

    def _copy(self, tasks: Sequence[CopyTask]) -> None:
        """Copy host tensors here; queue device tensors on the side stream behind ``_ready``."""
        if self._stream is None or self._ready is None:  # both or neither: there is no device tensor
            for t in tasks:
                t.dst.copy_(t.source())
            return
        with torch.cuda.device(self._stream.device), torch.cuda.stream(self._stream):
            self._stream.wait_event(self._ready)
            for t in tasks:
                t.dst.copy_(t.source(), non_blocking=True)
        self._stream.synchronize()

    def _background(self, tasks: Sequence[CopyTask]) -> None:
        try:
            self._copy(tasks)
        except BaseException as exc:  # reported through wait_copied, never lost in a thread
            self._error = exc
        finally:
            self._copied.set()

    def wait_copied(self) -> None:
        """Block until every piece is in the arena; re-raise a failed copy."""
        self._copied.wait()
        if self._error is not None:
            raise self._error


def _side_stream(tasks: Sequence[CopyTask]) -> tuple[torch.cuda.Stream | None, torch.cuda.Event | None]:
    """A per-device copy stream, and an event marking where the training stream stands now."""
    devices = {t.leaf.device for t in tasks if isinstance(t.leaf, torch.Tensor) and t.leaf.device.type == "cuda"}
    if not devices:
        return None, None
    if len(devices) > 1:
        raise ValueError(f"a checkpointed state spans several GPUs {sorted(map(str, devices))}; use one per rank")
    (device,) = devices
    if device.index not in _STREAMS:
        _STREAMS[device.index] = torch.cuda.Stream(device)
    stream = _STREAMS[device.index]
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(device))
    return stream, ready


_STREAMS: dict[int, torch.cuda.Stream] = {}
