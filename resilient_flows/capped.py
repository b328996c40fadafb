"""The one safe reader of run- and checkpoint-directory files (:mod:`resilient_flows.rundir` exports it).

Those files lie on shared file systems that other jobs, users and crashes write to, so what they
hold is input, not something this process just wrote. Every read of such a file goes through here:

- only a regular file is read (:func:`open_regular`): a symbolic link is not followed (it may lead
  out of the run, to any file the reader may read, or in a loop), a FIFO is not waited on (it would
  block its reader for good), a device is never opened; anything else is
  :class:`~resilient_flows.errors.DamagedFileError`, which the views record as damage;
- with the cap of its kind: a stray file of gigabytes (a log renamed over a manifest, a runaway
  writer) is refused with :class:`~resilient_flows.errors.FileTooLargeError`, naming it and the
  cap, after reading at most one byte more than the cap;
- JSON nested at most :data:`MAX_DEPTH` deep (:func:`parse_json`): deeper nesting would exhaust the
  parser's stack, and a ``RecursionError`` is never let out.

Append-only logs (the event log, metrics logs, the runners' ledger) grow without bound and
are read as a stream of lines instead (:class:`CappedLines`): each line is capped, and a longer one
is skipped with a warning without ever being held whole.

Nothing here imports torch: the runner and the command line read these files.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from stat import S_ISDIR, S_ISFIFO, S_ISLNK, S_ISREG, S_ISSOCK
from typing import Any, BinaryIO

from resilient_flows.errors import DamagedFileError, FileTooLargeError

__all__ = [
    "CONTROL_CAP",
    "DOCUMENT_CAP",
    "LINE_CAP",
    "MANIFEST_CAP",
    "MAX_DEPTH",
    "PLAN_CAP",
    "CappedLines",
    "open_regular",
    "parse_json",
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
#: How deeply a document may nest arrays and objects: far more than any writer here nests (a
#: manifest, five levels; a user's result, a few more), far less than the parser's recursion limit.
MAX_DEPTH = 64

#: Opened without following a symbolic link, without blocking, never as the controlling terminal,
#: and not inherited by the commands a reader starts.
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
#: A document larger than this is looked at before it is decoded (see :func:`parse_json`), and
#: a file larger than this by its first so many bytes before it is read whole.
_HEAD = 64 * 1024
#: Blanks JSON allows before a document, and the bytes one may start with (Python also writes
#: ``NaN`` and ``Infinity``).
_BLANK = re.compile(rb"[ \t\r\n]*")
_STARTS = frozenset(bytes([b]) for b in b'{["-0123456789tfnNI')
#: An escape within a string; a string once escapes are out; what is not a bracket or a quote.
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
#: What each byte adds to the nesting depth.
_NESTING = tuple(1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256))


def open_regular(path: str | os.PathLike, what: str) -> BinaryIO:
    """``path`` opened for reading, if it is a regular file; :class:`DamagedFileError` naming
    ``what`` if it is anything else, ``FileNotFoundError`` if there is none.

    What the name is is looked at before it is opened, so that a device is never opened (an open
    alone can act); it is opened without following a symbolic link (one may lead anywhere on the
    machine, or in a loop) and without blocking (a FIFO would block its reader for good), and the
    descriptor is checked to be the file looked at.
    """
    try:
        seen = os.lstat(path)
        if not S_ISREG(seen.st_mode):
            raise DamagedFileError(path, what, _kind(seen.st_mode))
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # on its path, or a link put in its place since the lstat
            raise DamagedFileError(path, what, "behind a symbolic link, not followed") from None
        raise
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino) or not S_ISREG(opened.st_mode):
        os.close(fd)
        raise DamagedFileError(path, what, "replaced while it was opened")
    return os.fdopen(fd, "rb")


def read_capped(path: str | os.PathLike, cap: int, what: str, expect_json: bool = False) -> bytes:
    """The bytes of ``path``; FileTooLargeError, naming ``what`` and the cap, when it has more than ``cap``.

    The file is opened with :func:`open_regular` (anything but a regular file is
    :class:`DamagedFileError`), and its size is looked at first, so that an oversized file costs
    one ``fstat``; a file that grows meanwhile is still read no further than one byte past the cap.
    With ``expect_json``, a large file whose first byte that is not blank cannot start a JSON
    document is ``ValueError`` by its first bytes, without reading the rest (a file of zeros, a
    log renamed over a manifest). The bytes are read into one buffer, not copied.
    """
    with open_regular(path, what) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        if size > cap:
            raise FileTooLargeError(path, cap, what)
        if expect_json and size > _HEAD:
            _check_start(os.pread(fd, _HEAD, 0))
        data = os.pread(fd, size + 1, 0)
        if len(data) > size:  # it grew meanwhile
            data += os.pread(fd, cap + 1 - len(data), len(data))
    if len(data) > cap:
        raise FileTooLargeError(path, cap, what)
    return data


def read_json_capped(path: str | os.PathLike, cap: int, what: str) -> Any:
    """The JSON document in ``path``, read with :func:`read_capped` and parsed with
    :func:`parse_json`; ``ValueError`` when it is not JSON, or nested too deep. A large file
    whose start cannot start JSON is refused before the rest of it is read."""
    return parse_json(read_capped(path, cap, what, expect_json=True))


def parse_json(data: bytes) -> Any:
    """The JSON document ``data``; ``ValueError`` saying why when it is not one this reader takes.

    Two things are refused before the parser sees them. A large document whose first byte that is
    not blank cannot start JSON (a file of zeros, a log renamed over a manifest): decoding it would
    first copy all of it into text for nothing (a small one is left to the parser, whose message
    says more). A document nested deeper than
    :data:`MAX_DEPTH`: the parser recurses once per level, and a nest of brackets a few thousand
    deep exhausts its stack, or that of whatever walks the document next; the depth is counted
    without recursion, and without a copy of the document unless it holds escapes.
    """
    if len(data) > _HEAD:
        _check_start(data)
    if _too_deep(data):
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
    try:
        return json.loads(data)
    except RecursionError:  # unreachable below MAX_DEPTH; never a traceback if it is reached
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep") from None


def _check_start(data: bytes) -> None:
    """ValueError if the first byte of ``data`` that is not blank cannot start a JSON document."""
    blank = _BLANK.match(data)
    start = 0 if blank is None else blank.end()  # never None: it matches the empty string
    if start < len(data) and data[start : start + 1] not in _STARTS:
        raise ValueError(f"it starts with {data[start : start + 1]!r}, which no JSON document does")


def _too_deep(data: bytes) -> bool:
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:  # the common case: a few brackets in all
        return False
    if b"\\" in data:  # escapes out, so that each quote left opens or closes a string
        data = _ESCAPE.sub(b"", data)
    brackets = _STRING.sub(b"", data.translate(None, _NOT_STRUCTURE))  # brackets within strings out
    left = brackets
    for _ in range(MAX_DEPTH):  # each pass takes (at least) the innermost level of pairs out, in C
        left = left.replace(b"[]", b"").replace(b"{}", b"")
        if b"[" not in left and b"{" not in left:  # shallow enough (any closer left over is the parser's)
            return False
    return max(itertools.accumulate(map(_NESTING.__getitem__, brackets)), default=0) > MAX_DEPTH


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, as a problem: ``a FIFO, not a regular file``."""
    if S_ISLNK(mode):
        return "a symbolic link, not followed"
    for test, name in ((S_ISFIFO, "a FIFO"), (S_ISDIR, "a directory"), (S_ISSOCK, "a socket")):
        if test(mode):
            return f"{name}, not a regular file"
    return "a device, not a regular file"


class CappedLines:
    """The complete lines of an append-only file from byte ``offset`` on, each at most ``cap`` bytes.

    Iterating yields each complete line without its newline. A longer line is skipped, read in
    blocks and never held whole: ``oversized`` is told its number and why (a reader that reports
    damage), else it is logged as a warning. A last line without its newline (still being written,
    or torn by a killed writer) is left for the next reader. :attr:`offset` follows the iteration:
    it is where the next reader of new lines starts; :attr:`line` is the number of the line just
    passed, counted from ``line``, the number of lines before ``offset``. A file that does not exist
    yet has no lines (logs are created by their first writer); nor has one that is not a regular
    file (see :func:`open_regular`): ``refused`` is told why, else it is logged as a warning.
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
        refused: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.cap = cap
        self.what = what
        self.offset = offset
        self.line = line
        self.oversized = oversized
        self.refused = refused

    def __iter__(self) -> Iterator[bytes]:
        try:
            f = open_regular(self.path, self.what)
        except FileNotFoundError:
            return
        except DamagedFileError as exc:
            if self.refused is not None:
                self.refused(exc.problem)
            else:
                logger.warning("%s", exc)
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
                        self._skipped(start, self.line, f"its {length} bytes are over the cap of {self.cap}")
                    else:
                        yield b"".join((*pending, part)) if pending else part
                    pending, held = [], 0
                held += len(rest)
                if held <= self.cap:
                    pending.append(rest)
                else:
                    pending = []
            if held > self.cap:  # the last line, unfinished, is over the cap already: say so now
                self._skipped(self.offset, self.line + 1, unfinished_over_cap(self.cap))

    def _skipped(self, start: int, number: int, problem: str) -> None:
        if self.oversized is not None:
            self.oversized(number, problem)
            return
        logger.warning("%s %s: skipped the line at byte %d: %s", self.what, self.path, start, problem)


def unfinished_over_cap(cap: int) -> str:
    """The problem of a last line that is not finished yet and already longer than ``cap``."""
    return f"unfinished, and already over the cap of {cap} bytes"
