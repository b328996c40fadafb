"""Fault in the host memory a restore is about to fill, on another core, while it verifies.

A restart restores into tensors that were just allocated and never touched: most of the time of
copying a checkpoint into them goes to the kernel handing out and zeroing a page at every first
write, not to the copy. ``madvise(MADV_POPULATE_WRITE)`` does that work up front without
changing a byte of the memory (pages already there are left as they are), so it can run while
the checkpoint is still being verified, before the state may be touched. Best effort: where the
call is missing (Linux before 5.14, other systems) or refused, the copy faults the pages itself.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
from collections.abc import Callable, Iterable

import torch

#: Linux's value; Python exposes the constant only from 3.13 on.
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
#: Smaller regions are left to the copy: the call would cost more than the faults it saves.
MIN_BYTES = 1 << 20


def _madvise() -> Callable[[int, int, int], int] | None:
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.madvise
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    call.restype = ctypes.c_int
    return call


_MADVISE = _madvise()


def host_regions(tensors: Iterable[torch.Tensor]) -> list[tuple[int, int]]:
    """``(address, bytes)`` of the whole pages inside each contiguous host tensor big enough to matter."""
    found = []
    for tensor in tensors:
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            continue
        start = tensor.data_ptr()
        first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (start + tensor.numel() * tensor.element_size()) // mmap.PAGESIZE * mmap.PAGESIZE
        if end - first >= MIN_BYTES:
            found.append((first, end - first))
    return found


class Prefault:
    """Populates the host memory of ``tensors`` in a background thread until :meth:`stop`.

    Stopping skips what is left and waits for the thread, so nothing touches the state's memory
    after the restore returns; the tensors are held until then, so their memory stays theirs.
    """

    def __init__(self, tensors: Iterable[torch.Tensor]) -> None:
        self._tensors = list(tensors)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        regions = host_regions(self._tensors)
        if _MADVISE is not None and regions:
            self._thread = threading.Thread(target=self._run, args=(_MADVISE, regions), name="rf-prefault", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._tensors.clear()

    def _run(self, madvise: Callable[[int, int, int], int], regions: list[tuple[int, int]]) -> None:
        # Last first: the copy starts at the first target and faults in what it reaches first itself,
        # so the two work on different pages instead of waiting on the same ones.
        for address, nbytes in reversed(regions):
            if self._stop.is_set() or madvise(address, nbytes, MADV_POPULATE_WRITE) != 0:
                return  # stopped, or refused (EINVAL from an old kernel): the copy faults pages in itself
