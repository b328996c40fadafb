"""Damage found while reading a run directory: the files and lines a view passed over.

A run directory lives on a shared file system for days, written by many processes: a node that
crashes mid-write, a full disk or an edit by hand leaves a line or a file that its writer never
wrote. A view must still show the rest, and must say what it passed over: a damaged ``failed``
line read as "no failure" without a word is worse than a crash. Readers given a
:class:`DamageLog` record each damaged line (by its number) or file there; the view reports it,
in words (:meth:`Damage.describe`) or in its ``--json`` document (:meth:`Damage.document`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Line numbers a description names before it says how many more there are.
SHOWN_LINES = 10


@dataclass(frozen=True)
class Damage:
    """One damaged file: its damaged lines (number -> what is wrong, numbers from 1), or
    ``problem``, what is wrong with the whole of it."""

    path: Path
    lines: dict[int, str]
    problem: str | None = None

    def describe(self, root: str | os.PathLike) -> str:
        """One line for a person: ``2 damaged lines in events.jsonl (lines 14, 80), skipped``, or
        ``members/a/result.json: not JSON (...); ignored``."""
        name = _relative(self.path, root)
        if self.problem is not None:
            return f"{name}: {self.problem}; ignored"
        numbers = sorted(self.lines)
        shown = ", ".join(map(str, numbers[:SHOWN_LINES]))
        more = f" and {len(numbers) - SHOWN_LINES} more" if len(numbers) > SHOWN_LINES else ""
        plural = "s" if len(numbers) > 1 else ""
        return f"{len(numbers)} damaged line{plural} in {name} (line{plural} {shown}{more}), skipped"

    def document(self, root: str | os.PathLike) -> dict[str, Any]:
        """For ``--json``: the file relative to ``root``, each damaged line with its problem, or the file's."""
        return {
            "file": _relative(self.path, root),
            "lines": [{"line": n, "problem": self.lines[n]} for n in sorted(self.lines)],
            "problem": self.problem,
        }


class DamageLog:
    """What readers of one run directory passed over; each line and file is kept once, however
    often it is read again (a view that polls).

    ``warn``: log each the first time it is found, for a process whose log is where its user
    looks (the runner); a command that reports the damage itself leaves it off.
    """

    def __init__(self, warn: bool = False) -> None:
        self.warn = warn
        self._lines: dict[Path, dict[int, str]] = {}
        self._files: dict[Path, str] = {}

    def line(self, path: str | os.PathLike, number: int, problem: str) -> None:
        """Line ``number`` of ``path`` was skipped because of ``problem``."""
        lines = self._lines.setdefault(Path(path), {})
        if self.warn and number not in lines:
            logger.warning("%s: skipped line %d: %s", path, number, problem)
        lines[number] = problem

    def file(self, path: str | os.PathLike, problem: str) -> None:
        """The whole of ``path`` was passed over because of ``problem``."""
        if self.warn and self._files.get(Path(path)) != problem:
            logger.warning("%s: passed over: %s", path, problem)
        self._files[Path(path)] = problem

    def repaired(self, path: str | os.PathLike) -> None:
        """``path`` was read well since (rewritten whole): it is no longer damaged."""
        self._files.pop(Path(path), None)

    def found(self) -> list[Damage]:
        """Every damaged file, in the order of their paths."""
        paths = sorted({*self._lines, *self._files})
        return [Damage(p, dict(self._lines.get(p, {})), self._files.get(p)) for p in paths]

    def documents(self, root: str | os.PathLike) -> list[dict[str, Any]]:
        """Every damaged file for a ``--json`` document, named relative to ``root`` (see :meth:`Damage.document`)."""
        return [damage.document(root) for damage in self.found()]

    def __bool__(self) -> bool:
        return bool(self._lines or self._files)


def _relative(path: Path, root: str | os.PathLike) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
