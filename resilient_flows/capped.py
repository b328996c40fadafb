"""Reading run- and checkpoint-directory files with a cap on their size.

Those files lie on shared file systems that other jobs, users and crashes write to, so what they
hold is input, not something this process just wrote: a stray file of gigabytes (a log renamed over
a manifest, a runaway writer) must not be read whole into memory. Every read of such a file goes
through here with the cap of its kind, and a larger file is refused with
:class:`~resilient_flows.errors.FileTooLargeError`, naming it and the cap, after reading at most one
byte more than the cap.

Append-only logs (the event log, metrics logs, the runners' ledger) grow without bound and
are read as a stream of lines instead (:class:`CappedLines`): each line is capped, and a longer one
is skipped with a warning without ever being held whole.

Nothing here imports torch: the runner and the command line read these files.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from stat import S_ISREG
from typing import Any

from resilient_flows.errors import FileTooLargeError

__all__ = [
    "CONTROL_CAP",
    "DOCUMENT_CAP",
    "LINE_CAP",
    "MANIFEST_CAP",
    "PLAN_CAP",
    "CappedLines",
    "read_capped",
    "read_json_capped",
]

logger = logging.getLogger(__name__)

_MiB = 1 << 20

#: A checkpoint's manifest: it lists every piece of every array, so a model of thousands of tensors
#: sharded over thousands of ranks has one of a hundred MiB. The writer refuses to commit a larger one.
MANIFEST_CAP = 256 * _MiB
#: A run's plan: the workflow and every planned member's spec.
PLAN_CAP = 64 * _MiB
#: A member's spec, its result, and the report its command wrote: a user's dict, with room for lists.
DOCUMENT_CAP = 16 * _MiB
#: Requests, markers and records of a few fields: control and clone orders, seeds, hand-offs,
#: heartbeats, attempt counters, framework checkpoint references, the runner lock.
CONTROL_CAP = _MiB
#: One line of an append-only log (an event, a step's metrics, a runner's ledger record).
LINE_CAP = _MiB


def read_capped(path: str | os.PathLike, cap: int, what: str) -> bytes:
    """The bytes of ``path``; FileTooLargeError, naming ``what`` and the cap, when it has more than ``cap``.

    The size is looked at first, so that an oversized file costs one ``fstat``; a file that grows
    meanwhile is still read no further than one byte past the cap. Only a regular file is read: a
    FIFO put in a file's place would block its reader for good (it is opened without blocking,
    then refused), a device never ends.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        stat = os.fstat(fd)
        if not S_ISREG(stat.st_mode):
            raise OSError(errno.EINVAL, f"{what} is not a regular file", os.fspath(path))
        size = stat.st_size
        if size > cap:
            raise FileTooLargeError(path, cap, what)
        data = f.read(size + 1)
        if len(data) > size:  # it grew meanwhile
            data += f.read(cap + 1 - len(data))
    if len(data) > cap:
        raise FileTooLargeError(path, cap, what)
    return data


def read_json_capped(path: str | os.PathLike, cap: int, what: str) -> Any:
    """The JSON document in ``path``, read with :func:`read_capped`; ``ValueError`` when it is not JSON."""
    return json.loads(read_capped(path, cap, what))


class CappedLines:
    """The complete lines of an append-only file from byte ``offset`` on, each at most ``cap`` bytes.

    Iterating yields each complete line without its newline. A longer line is skipped, read in
    blocks and never held whole: ``oversized`` is told its number and why (a reader that reports
    damage), else it is logged as a warning. A last line without its newline (still being written,
    or torn by a killed writer) is left for the next reader. :attr:`offset` follows the iteration:
    it is where the next reader of new lines starts; :attr:`line` is the number of the line just
    passed, counted from ``line``, the number of lines before ``offset``. A file that does not exist
    yet has no lines (logs are created by their first writer).
    """

    #: Bytes read at a time.
    BLOCK = _MiB

    def __init__(
        self,
        path: str | os.PathLike,
        cap: int,
        what: str,
        offset: int = 0,
        line: int = 0,
        oversized: Callable[[int, str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.cap = cap
        self.what = what
        self.offset = offset
        self.line = line
        self.oversized = oversized

    def __iter__(self) -> Iterator[bytes]:
        try:
            f = self.path.open("rb")
        except FileNotFoundError:
            return
        with f:
            f.seek(self.offset)
            pending: list[bytes] = []  # the start of the line being read, unless it is over the cap
            held = 0  # bytes of that line so far
            while block := f.read(self.BLOCK):
                *complete, rest = block.split(b"\n")
                for part in complete:
                    length = held + len(part)
                    start, self.offset = self.offset, self.offset + length + 1
                    self.line += 1
                    if length > self.cap:
                        self._skipped(start, length)
                    else:
                        yield b"".join((*pending, part)) if pending else part
                    pending, held = [], 0
                held += len(rest)
                if held <= self.cap:
                    pending.append(rest)
                else:
                    pending = []

    def _skipped(self, start: int, length: int) -> None:
        if self.oversized is not None:
            self.oversized(self.line, f"its {length} bytes are over the cap of {self.cap}")
            return
        logger.warning(
            "%s %s: skipped the line at byte %d: its %d bytes are over the cap of %d",
            self.what,
            self.path,
            start,
            length,
            self.cap,
        )
