"""The console every command prints through."""

from __future__ import annotations

import sys

from rich.console import Console


def console(stderr: bool = False) -> Console:
    """A terminal gets tables fitted to its width; a pipe or a log file gets unwrapped lines."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, width=None if stream.isatty() else 200, highlight=False)
