"""Durable writes on POSIX file systems: a file renamed into place, and the rename itself.

Kept free of torch: the runner, the command line and compute nodes that only checkpoint use it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "write_atomically", "write_durably"]


def fsync_dir(path: Path) -> None:
    """Make renames inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, text: str) -> None:
    """Write, fsync and rename: readers see the old content or the new, never a torn file."""
    _replace(path, text, fsync=True)


def write_atomically(path: Path, text: str) -> None:
    """Write and rename, without the fsync: readers never see a torn file, but a crash of the node
    may lose it. For advice that a critical path writes and that its readers can do without."""
    _replace(path, text, fsync=False)


def _replace(path: Path, text: str, fsync: bool) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as f:
        f.write(text)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
