"""The console every command prints through, and the ``--json`` documents they print instead."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from resilient_flows.strictjson import dumps_strict

if TYPE_CHECKING:
    from resilient_flows.rundir import DamageLog


#: The width of what goes to a pipe or a log file, unless ``COLUMNS`` says: lines left unwrapped.
PIPE_WIDTH = 200


def console(stderr: bool = False) -> Console:
    """A terminal gets tables fitted to its width; a pipe or a log file gets unwrapped lines, or
    ``COLUMNS`` of them where the user set it (``COLUMNS=80 resilient-flows status RUN | less``)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, width=None if stream.isatty() else _pipe_width(), highlight=False)


def _pipe_width() -> int:
    columns = os.environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH


def print_document(document: dict[str, Any]) -> None:
    """Print a ``--json`` document on stdout, alone: strict JSON that any parser reads (a number
    that is not finite, such as a diverged loss, is null), never through rich, which would add markup."""
    sys.stdout.write(dumps_strict(document, indent=2) + "\n")


def warn(message: str) -> None:
    """A warning on stderr, so that stdout stays the table or the document."""
    console(stderr=True).print(f"[bold yellow]warning:[/] {escape(message)}", soft_wrap=True)


def warn_damage(run_dir: str | os.PathLike, damage: DamageLog) -> None:
    """Say on stderr what a view passed over as damaged, a line per file."""
    for found in damage.found():
        warn(found.describe(run_dir))
