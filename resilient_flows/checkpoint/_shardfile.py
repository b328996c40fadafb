"""Shard files: safetensors written in one streaming pass, hashed as they are written.

The ``safetensors`` library writes from tensors but neither fsyncs nor hashes, and reading a
gigabyte back to hash it would double the I/O. The format is small (a little-endian u64 header
length, a JSON header, then the raw bytes), so we write it ourselves straight from the staging
arena, hashing each chunk (xxh3-64, ~10 GiB/s) on its way to the disk. Every piece keeps its real
shape, so ``safetensors.torch.load_file`` on a shard gives correctly shaped tensors.

Two checksums: one per piece, so that a rank restoring part of a checkpoint verifies exactly what
it reads; one of the whole file, so that a copy to another tier or a full scan verifies a shard
without interpreting it. A flush to the next tier from the host arena that the shard was written
from hashes nothing: those bytes were hashed on their way to the first tier. Bytes it has to read
back from a file instead are verified against the piece checksums before they are committed.
Reading maps the file and checks a piece's checksum before its bytes are used, so that a flipped
or missing byte is reported as corruption and never reaches the training state.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import mmap
import os
import queue
import stat
import struct
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import xxhash

from resilient_flows.capped import parse_json
from resilient_flows.checkpoint._dtypes import SAFETENSORS_DTYPES
from resilient_flows.errors import CorruptCheckpointError

#: torch dtypes and their safetensors names.
DTYPE_CODES: dict[torch.dtype, str] = {getattr(torch, name): code for code, name in SAFETENSORS_DTYPES.items()}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}

CHUNK = 16 << 20
#: Write chunk of a flush from the host arena: a save waiting for the arena waits for one of them.
SEND_CHUNK = 4 << 20
PAGE = 4096
#: Chunk of a piece hashed and then copied while it is still in the CPU cache.
COPY_CHUNK = 1 << 20


@dataclass(frozen=True)
class ShardEntry:
    """One piece as laid out in a shard's data section."""

    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class ShardRecord:
    """What the manifest knows of a shard file, enough to verify it without trusting it."""

    file: str
    nbytes: int
    xxh3_64: str
    header_bytes: int
    header_xxh3_64: str

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "bytes": self.nbytes,
            "xxh3_64": self.xxh3_64,
            "header": [self.header_bytes, self.header_xxh3_64],
        }

    @classmethod
    def from_json(cls, data: dict) -> ShardRecord:
        size, digest = data["header"]
        return cls(str(data["file"]), int(data["bytes"]), str(data["xxh3_64"]), int(size), str(digest))


def header_bytes(entries: Sequence[ShardEntry], metadata: dict[str, str]) -> bytes:
    """The safetensors header for ``entries`` packed back to back, padded so data starts on a page.

    Padding with spaces is part of the format; a page-aligned data section can be written with
    direct I/O.
    """
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for entry in entries:
        nbytes = entry.nbytes
        header[entry.key] = {
            "dtype": DTYPE_CODES[entry.dtype],
            "shape": list(entry.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(len(text) + 8) % PAGE)
    return struct.pack("<Q", len(text)) + text


def write_shard(
    path: Path, head: bytes, entries: Sequence[ShardEntry], data: torch.Tensor, cached: bool = False
) -> tuple[ShardRecord, dict[str, str]]:
    """Write ``head`` (from :func:`header_bytes`) and ``data`` (a uint8 CPU tensor holding
    ``entries`` back to back) durably to ``path``.

    Returns the file's record and each entry's xxh3-64 by key. The file is written under a
    temporary name, fsynced, then renamed: a reader sees either no shard or a complete one. The
    directory entry is made durable by the caller's commit. ``cached`` writes through the page
    cache instead of with direct I/O, for a shard that another process on this node reads right
    away (a clone).
    """
    digest = xxhash.xxh3_64()
    tmp = path.with_name(path.name + ".tmp")
    view = data.numpy().data
    aligned = data.data_ptr() % PAGE == 0 and not cached
    hasher = _PieceHasher(entries)
    nbytes = _write_durably(tmp, head, _hashed_chunks(view, hasher), digest, aligned=aligned)
    os.replace(tmp, path)
    record = ShardRecord(path.name, nbytes, digest.hexdigest(), len(head), xxhash.xxh3_64_hexdigest(head))
    return record, hasher.finish()


class _PieceHasher:
    """Each entry's xxh3-64, from a shard's data section fed in order in chunks of any size.

    ``first`` skips the entries before it: bytes fed before its start are ignored, so a reader
    resuming mid-file can start at any offset at or before that entry.
    """

    def __init__(self, entries: Sequence[ShardEntry], first: int = 0) -> None:
        bounds, offset = [], 0
        for entry in entries:
            bounds.append((entry.key, offset, offset + entry.nbytes))
            offset += entry.nbytes
        self._pending = iter(bounds[first:])
        self._current = next(self._pending, None)
        self._digest = xxhash.xxh3_64()
        self._digests: dict[str, str] = {}

    def update(self, start: int, chunk: memoryview) -> None:
        """Hash ``chunk``: the data section's bytes from offset ``start`` on."""
        stop = start + len(chunk)
        while self._current is not None and self._current[1] < stop:
            key, begin, end = self._current
            with chunk[max(begin, start) - start : min(end, stop) - start] as part:
                self._digest.update(part)
            if end > stop:
                return
            self._next(key)

    def finish(self) -> dict[str, str]:
        """Every entry's checksum by key; entries not fed (empty ones at the end) hash nothing."""
        while self._current is not None:
            self._next(self._current[0])
        return self._digests

    def _next(self, key: str) -> None:
        self._digests[key] = self._digest.hexdigest()
        self._digest.reset()
        self._current = next(self._pending, None)


def _hashed_chunks(view: memoryview, hasher: _PieceHasher) -> Iterator[memoryview]:
    """``view`` in write chunks, each hashed per entry just before it is written, while it is
    still in the cache."""
    for start in range(0, len(view), CHUNK):
        chunk = view[start : start + CHUNK]
        hasher.update(start, chunk)
        yield chunk


def copy_shard(src: Path, dst: Path, record: ShardRecord) -> None:
    """Copy a committed shard to another tier, verifying it on the way and fsyncing the copy.

    A reader thread fills page-aligned buffers (with direct I/O where possible) while this thread
    hashes and writes the previous one, so reading the node-local copy and writing the shared one
    overlap instead of adding up.
    """
    size = src.stat().st_size
    if size != record.nbytes:
        raise CorruptCheckpointError(f"{src} has {size} bytes, the manifest says {record.nbytes}; not copying it")
    tmp = dst.with_name(dst.name + ".tmp")
    digest = xxhash.xxh3_64()
    with _ChunkReader(src) as chunks:
        copied = _write_durably(tmp, b"", chunks, digest, aligned=True)
    if copied != record.nbytes or digest.hexdigest() != record.xxh3_64:
        tmp.unlink()
        raise CorruptCheckpointError(f"{src} changed since it was committed; not copying it to {dst.parent}")
    os.replace(tmp, dst)


class MemoryLease(Protocol):
    """The host arena as :func:`send_shard` borrows it: given back as soon as ``wanted``."""

    @property
    def wanted(self) -> bool: ...

    def give_back(self) -> None: ...


def send_shard(
    dst: Path,
    head: bytes,
    entries: Sequence[ShardEntry],
    data: torch.Tensor,
    record: ShardRecord,
    pieces: Mapping[str, str],
    src: Path,
    lease: MemoryLease,
) -> int:
    """Write the shard that was written from ``head`` and ``data`` to ``dst``, from memory; the
    bytes that came from memory.

    ``data`` is read only while ``lease`` is held: once it is ``wanted`` (a newer save), the
    lease is given back at the next chunk boundary and the rest comes from ``src``, the same
    shard in a lower tier, verified against the piece checksums ``pieces`` before the copy is
    renamed into place. Bytes from memory are not hashed again: they are the bytes whose
    checksums ``record`` and ``pieces`` hold.
    """
    tmp = dst.with_name(dst.name + ".tmp")
    stream = _MemoryThenFile(data.numpy().data, len(head), entries, src, lease)
    try:
        if len(head) + data.numel() != record.nbytes or xxhash.xxh3_64_hexdigest(head) != record.header_xxh3_64:
            raise CorruptCheckpointError(f"the host copy of {record.file} does not match its record; not flushing it")
        copied = _write_durably(tmp, head, stream, None, aligned=data.data_ptr() % PAGE == 0)
    finally:
        lease.give_back()
    problem = stream.problem(pieces)
    if copied != record.nbytes or problem is not None:
        tmp.unlink()
        problem = problem or f"{src} changed since it was committed"
        raise CorruptCheckpointError(f"{problem}; not copying it to {dst.parent}")
    os.replace(tmp, dst)
    return stream.from_memory


class _MemoryThenFile:
    """A shard's data section in write chunks: from memory while the lease holds, then from the file.

    Switching at data offset ``x``, it reads the file from the start of the entry holding ``x``
    (hashing the bytes before ``x`` without yielding them), so that every entry it yields any
    byte of from the file is hashed whole.
    """

    def __init__(
        self, view: memoryview, head_bytes: int, entries: Sequence[ShardEntry], src: Path, lease: MemoryLease
    ) -> None:
        self._view, self._head_bytes, self._entries, self._src, self._lease = view, head_bytes, entries, src, lease
        self._hasher: _PieceHasher | None = None
        self.from_memory = head_bytes

    def __iter__(self) -> Iterator[memoryview]:
        for start in range(0, len(self._view), SEND_CHUNK):
            if self._lease.wanted:
                self._lease.give_back()
                yield from self._from_file(start)
                return
            chunk = self._view[start : start + SEND_CHUNK]
            self.from_memory += len(chunk)
            yield chunk
        self._lease.give_back()  # written: a save may take the arena during the fsync

    def _from_file(self, x: int) -> Iterator[memoryview]:
        first, begin = _entry_at(self._entries, x)
        self._hasher = _PieceHasher(self._entries, first)
        offset = self._head_bytes + begin - begin % PAGE  # the header is whole pages: still aligned
        size = self._src.stat().st_size
        if size != self._head_bytes + len(self._view):
            raise CorruptCheckpointError(f"{self._src} has {size} bytes, not {self._head_bytes + len(self._view)}")
        with _ChunkReader(self._src, offset) as chunks:
            for chunk in chunks:
                start = offset - self._head_bytes
                offset += len(chunk)
                self._hasher.update(start, chunk)
                if start + len(chunk) > x:
                    with chunk[max(0, x - start) :] as part:
                        yield part

    def problem(self, pieces: Mapping[str, str]) -> str | None:
        """What the bytes read from the file fail, if anything."""
        if self._hasher is None:
            return None
        bad = sorted(key for key, found in self._hasher.finish().items() if pieces.get(key) != found)
        return f"{self._src}: entries {bad} changed since it was committed" if bad else None


def _entry_at(entries: Sequence[ShardEntry], x: int) -> tuple[int, int]:
    """The index and start of the first entry with bytes at or after data offset ``x``."""
    offset = 0
    for index, entry in enumerate(entries):
        if offset + entry.nbytes > x:
            return index, offset
        offset += entry.nbytes
    return len(entries), offset


class _ChunkReader:
    """Iterate over a file's contents in page-aligned chunks read ahead by a background thread."""

    DEPTH = 3

    def __init__(self, path: Path, offset: int = 0) -> None:
        """Read from ``offset`` on: a multiple of the page size, as direct I/O needs."""
        self._fd = _open(path, os.O_RDONLY | os.O_NONBLOCK, direct=True)
        os.lseek(self._fd, offset, os.SEEK_SET)
        self._free: queue.SimpleQueue[mmap.mmap | None] = queue.SimpleQueue()
        self._full: queue.SimpleQueue[tuple[mmap.mmap, int] | BaseException] = queue.SimpleQueue()
        for _ in range(self.DEPTH):
            self._free.put(mmap.mmap(-1, CHUNK))
        self._thread = threading.Thread(target=self._read, name="rf-readahead", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while (buffer := self._free.get()) is not None:
                try:
                    count = os.readv(self._fd, [buffer])
                except OSError as exc:  # O_DIRECT accepted at open but not at read: read buffered
                    if exc.errno != errno.EINVAL:
                        raise
                    _drop_direct(self._fd)
                    count = os.readv(self._fd, [buffer])
                self._full.put((buffer, count))
                if count == 0:
                    return
        except BaseException as exc:  # handed to the consumer, never lost in a thread
            self._full.put(exc)

    def __iter__(self) -> Iterator[memoryview]:
        while True:
            item = self._full.get()
            if isinstance(item, BaseException):
                raise item
            buffer, count = item
            if count == 0:
                return
            with memoryview(buffer) as view, view[:count] as chunk:
                yield chunk
            self._free.put(buffer)

    def __enter__(self) -> _ChunkReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._free.put(None)
        self._thread.join()
        os.close(self._fd)


def _write_durably(
    path: Path, head: bytes, chunks: Iterable[memoryview], digest: xxhash.xxh3_64 | None, aligned: bool
) -> int:
    """Write ``head`` and then ``chunks`` to ``path``, fsync it, hash every byte into ``digest``
    (unless None); the size written.

    Where the file system allows it, ``head`` is whole pages and the chunks are page-aligned
    memory, the data goes to the disk with ``O_DIRECT``: buffered writes would copy every byte into
    the page cache and leave the kernel to write it back, costing the training process memory
    bandwidth and a core's time on a small node. From the first chunk that is not a whole number
    of pages (the file's tail) on, writes go through the page cache.
    """
    fd = _open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, direct=aligned and len(head) % PAGE == 0)
    try:
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & getattr(os, "O_DIRECT", 0))
        if digest is not None:
            digest.update(head)
        if direct and head:
            with mmap.mmap(-1, len(head)) as page_aligned, memoryview(page_aligned) as staged:
                staged[:] = head
                _write_all(fd, staged)
        else:
            _write_all(fd, head)
        written = len(head)
        for chunk in chunks:
            if digest is not None:
                digest.update(chunk)
            bulk = len(chunk) - len(chunk) % PAGE if direct else len(chunk)
            with chunk[:bulk] as pages:
                try:
                    _write_all(fd, pages)
                except OSError as exc:  # some FUSE/NFS mounts accept O_DIRECT at open, not at write
                    if not direct or exc.errno != errno.EINVAL:
                        raise
                    _drop_direct(fd)
                    direct = False
                    os.lseek(fd, written, os.SEEK_SET)
                    _write_all(fd, pages)
            if bulk < len(chunk):
                _drop_direct(fd)
                direct = False
                with chunk[bulk:] as tail:
                    _write_all(fd, tail)
            written += len(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    return written


def _open(path: Path, flags: int, direct: bool) -> int:
    """Open with ``O_DIRECT`` when asked and the file system has it, else without."""
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, flags | os.O_DIRECT, 0o644)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: this file system has no direct I/O
                raise
    return os.open(path, flags, 0o644)


def _open_shard(path: Path) -> int:
    """A descriptor of the shard file ``path``; CorruptCheckpointError when it is missing or not a
    regular file. Opened without blocking: a FIFO in a shard's place must not hang its reader."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{path.name} is missing") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptCheckpointError(f"{path.name} is not a regular file")
    return fd


def _drop_direct(fd: int) -> None:
    """Switch ``fd`` from direct to buffered I/O."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    with memoryview(data) as view:
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])


class MappedShard:
    """A memory-mapped shard; ``piece(key, ...)`` are zero-copy views, each verified before use.

    Nothing is read at opening beyond the header, so that a rank restoring a few boxes of a large
    shard reads only those. :meth:`verify` checks the whole file against its record.
    """

    def __init__(self, path: Path, record: ShardRecord) -> None:
        self.path = path
        self.record = record
        fd = _open_shard(path)
        try:
            size = os.fstat(fd).st_size
            if size != record.nbytes:
                raise CorruptCheckpointError(f"{path.name} has {size} bytes, the manifest says {record.nbytes}")
            self._map = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        found = xxhash.xxh3_64_hexdigest(self._map[: record.header_bytes])
        if found != record.header_xxh3_64:
            self.close()
            raise CorruptCheckpointError(
                f"{path.name}: its header fails its checksum (xxh3-64 {found}, expected {record.header_xxh3_64})"
            )
        try:
            (hlen,) = struct.unpack("<Q", self._map[:8])
            header = parse_json(self._map[8 : 8 + hlen])  # a nest too deep is ValueError
            self._entries: dict[str, dict[str, Any]] = {k: v for k, v in header.items() if k != "__metadata__"}
        except (struct.error, ValueError, AttributeError) as exc:
            self.close()
            raise CorruptCheckpointError(f"{path.name} has an unreadable header ({exc})") from None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only on purpose: views are only read
            self._bytes: torch.Tensor | None = torch.frombuffer(self._map, dtype=torch.uint8)
        self._base = 8 + hlen
        self._verified: set[str] = set()
        self._ahead: set[str] = set()  # entries asked to be read ahead

    def verify(self) -> None:
        """Hash the whole file; raises CorruptCheckpointError when it differs from its record."""
        digest = xxhash.xxh3_64()
        with memoryview(self._map) as view:
            for chunk in _chunks(view):
                digest.update(chunk)
                chunk.release()
        if digest.hexdigest() != self.record.xxh3_64:
            raise CorruptCheckpointError(
                f"{self.path.name} fails its checksum (xxh3-64 {digest.hexdigest()}, expected {self.record.xxh3_64})"
            )

    def piece(
        self, key: str, dtype: torch.dtype, shape: tuple[int, ...], xxh3_64: str, into: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The piece ``key``, checked against the manifest's dtype, shape and checksum.

        With ``into`` (contiguous host memory of the piece's shape and dtype, that nobody uses
        before the piece is verified), it is also copied there, chunk by chunk right after each
        chunk is hashed, while the chunk is still in the CPU cache: one pass over the bytes
        instead of two. On a checksum failure ``into`` holds some of the bad piece.
        """
        entry = self._entries.get(key)
        if entry is None or entry.get("dtype") != DTYPE_CODES[dtype] or entry.get("shape") != list(shape):
            raise CorruptCheckpointError(f"{self.path.name} has no {DTYPE_CODES[dtype]}{list(shape)} entry {key!r}")
        begin, end = entry["data_offsets"]
        nbytes = math.prod(shape) * dtype.itemsize
        first = self._base + begin
        if end - begin != nbytes or first % dtype.itemsize or self._base + end > len(self._map):
            raise CorruptCheckpointError(f"{self.path.name}: entry {key!r} has bad data offsets {begin}..{end}")
        if self._bytes is None:
            raise ValueError(f"{self.path.name}: a piece read after close()")
        flat = self._bytes[first : first + nbytes]
        if key not in self._verified or into is not None:
            if key not in self._ahead:
                self._prefetch(first, nbytes)
            found = _hash_copying(flat, into.view(-1).view(torch.uint8)) if into is not None else _hash(flat)
            if found != xxh3_64:
                raise CorruptCheckpointError(
                    f"{self.path.name}: entry {key!r} fails its checksum (xxh3-64 {found}, expected {xxh3_64})"
                )
            self._verified.add(key)
        return flat.view(dtype).view(shape)

    def release(self, key: str) -> None:
        """Unmap the pages of entry ``key`` from this process; the page cache keeps them.

        Mapped file pages count in a process's resident memory once touched; a reader going
        through a large shard piece by piece (an export) drops each piece when done with it.
        """
        entry = self._entries.get(key)
        if entry is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        begin, end = (self._base + offset for offset in entry["data_offsets"])
        page = begin - begin % mmap.PAGESIZE
        if end > page:
            with contextlib.suppress(OSError, ValueError):
                self._map.madvise(mmap.MADV_DONTNEED, page, min(len(self._map), end) - page)

    def read_ahead(self, key: str) -> None:
        """Have the kernel start reading entry ``key`` from disk, to be hashed while the one
        before it is (an unknown key is left to :meth:`piece` to report)."""
        entry = self._entries.get(key)
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if key in self._ahead or not isinstance(offsets, list) or len(offsets) != 2:
            return
        begin, end = offsets
        if isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= len(self._map) - self._base:
            self._ahead.add(key)
            self._prefetch(self._base + begin, end - begin)

    def _prefetch(self, first: int, nbytes: int) -> None:
        """Ask the kernel to read the piece ahead, in large requests rather than page by page."""
        page = first - first % mmap.PAGESIZE
        if nbytes and hasattr(mmap, "MADV_WILLNEED"):
            with contextlib.suppress(OSError):
                self._map.madvise(mmap.MADV_WILLNEED, page, min(len(self._map), first + nbytes) - page)

    def close(self) -> None:
        self._bytes = None
        with contextlib.suppress(BufferError):  # a view is still alive: the map closes with it
            self._map.close()

    def __enter__(self) -> MappedShard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _hash(data: torch.Tensor) -> str:
    return xxhash.xxh3_64_hexdigest(data.numpy().data) if data.numel() else xxhash.xxh3_64_hexdigest(b"")


def _hash_copying(src: torch.Tensor, dst: torch.Tensor) -> str:
    """The xxh3-64 of the bytes ``src``, copied to ``dst`` in cache-sized chunks as they are hashed."""
    digest = xxhash.xxh3_64()
    for start in range(0, src.numel(), COPY_CHUNK):
        chunk = src[start : start + COPY_CHUNK]
        digest.update(chunk.numpy().data)
        dst[start : start + COPY_CHUNK].copy_(chunk)
    return digest.hexdigest()


def _chunks(view: memoryview) -> Iterator[memoryview]:
    for start in range(0, len(view), CHUNK):
        yield view[start : start + CHUNK]
