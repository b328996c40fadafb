"""Reading what a member's attempts printed (``logs/attempt-<n>[.rank-<r>].log``, see
:meth:`~resilient_flows.rundir.TaskLayout.attempt_log`).

The files are the user's own output, of any size: they are streamed, never read whole, and a view
that shows their end (``status``) reads at most :data:`TAIL_CAP` bytes from the end. Like every
file of a run directory they are input: only regular files are listed and opened, no link is
followed (:func:`~resilient_flows.capped.open_regular`).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from resilient_flows.capped import open_regular
from resilient_flows.rundir._layout import TaskLayout

#: Bytes read from the end of a log to find its last lines.
TAIL_CAP = 64 * 1024
#: Bytes copied at a time.
_CHUNK = 64 * 1024
_NAME = re.compile(r"attempt-([1-9][0-9]{0,8})(?:\.rank-([1-9][0-9]{0,8}))?\.log")
#: What a line that says nothing holds: blanks, or a traceback's column marks.
_MARKS = " \t^~"
#: The line a traceback starts with.
TRACEBACK = "Traceback (most recent call last):"


def attempt_logs(layout: TaskLayout) -> dict[int, dict[int, Path]]:
    """Every attempt's logs: attempt -> rank -> path, attempts and ranks in order. Regular files
    only; none when the member has no ``logs`` directory (or it is not a directory)."""
    found: dict[int, dict[int, Path]] = {}
    try:
        if not stat.S_ISDIR(os.lstat(layout.logs).st_mode):
            return {}
        entries = list(os.scandir(layout.logs))
    except OSError:
        return {}
    for entry in entries:
        match = _NAME.fullmatch(entry.name)
        if match is None or not entry.is_file(follow_symlinks=False):
            continue
        found.setdefault(int(match[1]), {})[int(match[2] or 0)] = Path(entry.path)
    return {a: dict(sorted(found[a].items())) for a in sorted(found)}


def copy_log(path: Path, out: BinaryIO, start: int = 0) -> int:
    """Write the log's bytes from ``start`` to its current end to ``out``; the offset reached."""
    with open_regular(path, "attempt log") as f:
        f.seek(start)
        while chunk := f.read(_CHUNK):
            out.write(chunk)
            start += len(chunk)
    out.flush()
    return start


def tail_lines(path: Path, count: int, cap: int = TAIL_CAP) -> list[str]:
    """The log's last ``count`` lines that say something, from its last ``cap`` bytes at most
    (whole lines only); decoded, undecodable bytes replaced. Blank lines, and a
    traceback's lines of ``^`` and ``~`` that mark a column of the line above, are left out."""
    with open_regular(path, "attempt log") as f:
        start = max(0, f.seek(0, os.SEEK_END) - cap)
        f.seek(start)
        data = f.read(cap)
    if start > 0:  # the first line is cut where the read began: it is left out
        data = data.partition(b"\n")[2]
    lines = [line.rstrip() for line in data.decode(errors="replace").splitlines() if line.strip(_MARKS)]
    return lines[-count:] if count > 0 else []


def failure_tail(logs: dict[int, Path], count: int) -> tuple[Path, list[str]] | None:
    """Where a failed attempt's logs (rank -> path) show how it failed, and those last ``count``
    lines: the first rank whose end holds a traceback (on several ranks, the one that failed,
    not the ones that saw it fail), else rank 0's end. None without logs."""
    if not logs:
        return None
    path = next((p for p in logs.values() if _has_traceback(p)), next(iter(logs.values())))
    return path, tail_lines(path, count)


def _has_traceback(path: Path) -> bool:
    try:
        with open_regular(path, "attempt log") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_CAP))
            return TRACEBACK.encode() in f.read(TAIL_CAP)
    except (OSError, ValueError):
        return False


def follow_log(
    path: Path, out: BinaryIO, ended: Callable[[], bool], sleep: Callable[[float], None], poll_s: float = 0.5
) -> None:
    """Copy the log to ``out`` as it grows, like ``tail -f``, until ``ended()`` says its attempt
    is over; what it wrote before its end is copied too."""
    offset = copy_log(path, out)
    while True:
        over = ended()  # asked before the last read: nothing written before the end is missed
        offset = copy_log(path, out, offset)
        if over:
            return
        sleep(poll_s)
