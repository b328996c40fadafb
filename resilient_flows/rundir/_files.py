"""The run directory's JSON files, read and written the one way its readers can rely on.

A run directory lies on a shared file system, written by the runner and by members on other
nodes and read by views that may run at any moment: a write is renamed into place after an
fsync, so a reader sees the old file or the new one, never a torn one; a read is capped by the
kind of file (a stray huge file is refused, not loaded), and a file that is not JSON, or not
the object its kind is, is a :class:`~resilient_flows.errors.DamagedFileError` that names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from resilient_flows.capped import read_json_capped
from resilient_flows.durable import write_atomically, write_durably
from resilient_flows.errors import DamagedFileError, FileTooLargeError


def read_json(path: Path, cap: int, what: str) -> Any:
    """The document in ``path``: ``FileNotFoundError`` when there is none, ``FileTooLargeError``
    over ``cap``, ``DamagedFileError`` (a ``ValueError``) naming ``what`` and the file when it is
    not JSON (being written by a writer that does not rename, or damaged), nested too deep, or not
    a regular file (see :func:`~resilient_flows.capped.open_regular`)."""
    try:
        return read_json_capped(path, cap, what)
    except (FileTooLargeError, DamagedFileError):
        raise
    except ValueError as exc:  # UnicodeDecodeError too
        raise DamagedFileError(path, what, f"not JSON ({exc})") from None


def read_object(path: Path, cap: int, what: str) -> dict[str, Any]:
    """:func:`read_json` of a file whose writer writes an object (a record, a spec, a result):
    anything else is ``DamagedFileError``, not a value for its reader to trip over later."""
    document = read_json(path, cap, what)
    if not isinstance(document, dict):
        raise DamagedFileError(path, what, f"not a JSON object (a {type(document).__name__})")
    return document


def write_json(path: Path, document: Any, indent: int | None = None, fsync: bool = True) -> None:
    """Write ``document`` atomically, and durably unless ``fsync`` is false (advice on a critical
    path, see :func:`~resilient_flows.durable.write_atomically`); values JSON lacks (paths, numpy
    scalars) as text."""
    text = json.dumps(document, indent=indent, default=str)
    if fsync:
        write_durably(path, text)
    else:
        write_atomically(path, text)
