"""What every benchmark's ``main`` shares, so that a benchmark keeps only what it measures.

Each benchmark runs at one of three sizes, ``--quick`` (under a minute or so, for a check by
hand or in CI), the default, and ``--full``, and writes its figures with ``--json PATH``; the
document's keys are the benchmark's own, because the README and the tests read them. This module
gives the options, the size chosen, the console, the medians over rounds, a scratch directory
under ``./bench-results``, the phase clock, the figures with their units, the JSON file and the
exit status. Judging ratios and printing tables is :mod:`report`'s job.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

__all__ = [
    "Clock",
    "console",
    "failed",
    "median_time",
    "medians",
    "options",
    "parse_size",
    "rotated",
    "rounds",
    "rounds_of",
    "scratch",
    "size_of",
    "spread",
    "timed",
    "with_units",
    "write_json",
]

T = TypeVar("T")

MiB = 1 << 20
GiB = 1 << 30


def options(doc: str, quick: str, full: str) -> tuple[argparse.ArgumentParser, Any]:
    """The parser, described by the doc string's first paragraph, with ``--quick`` and ``--full``
    exclusive of each other; and their group, for a benchmark's own exclusive choice (``--size``)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help=quick)
    sizes.add_argument("--full", action="store_true", help=full)
    return parser, sizes


def size_of(args: argparse.Namespace) -> str:
    """``quick``, ``full`` or ``default``: the key of a benchmark's table of sizes."""
    return "quick" if args.quick else "full" if args.full else "default"


def parse_size(text: str) -> int:
    """``--size``'s bytes, written ``256MiB`` or ``1GiB`` (the units in which states are compared)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(MiB|GiB)\s*", text, re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(f"size must look like 256MiB or 1GiB, got {text!r}")
    return int(float(match.group(1)) * (GiB if match.group(2).lower() == "gib" else MiB))


def console(width: int = 120) -> Console:
    """A console as wide as the terminal, or ``width`` in a log, where rich's 80 would wrap the tables."""
    return Console(width=None if sys.stdout.isatty() else width, highlight=False)


def medians(rows: list[Mapping[str, float]], warmup: int = 0) -> dict[str, float]:
    """Each figure's median over the rounds after the first ``warmup`` (which allocate and import)."""
    return {key: statistics.median(row[key] for row in rows[warmup:]) for key in rows[0]}


def rounds(n: int, measure: Callable[[], Mapping[str, float]], warmup: int = 0) -> dict[str, float]:
    """Each figure's median over ``n`` rounds of ``measure``, run after ``warmup`` rounds that are dropped."""
    return medians([measure() for _ in range(warmup + n)], warmup)


def median_time(fn: Callable[[], object], n: int) -> float:
    """The median of ``n`` timings of ``fn``: one slow call on a shared machine does not move it."""
    return statistics.median(timed(fn) for _ in range(n))


def rotated(variants: Sequence[T], round_: int) -> list[T]:
    """The variants in a different order each round, so that drift on a shared machine spreads evenly."""
    shift = round_ % len(variants)
    return [*variants[shift:], *variants[:shift]]


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` took, its result dropped: a round's figure."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def spread(values: Iterable[float], middle: float) -> float:
    """The median distance from ``middle``: how far one round strays, robust to a stray round."""
    return statistics.median(abs(value - middle) for value in values)


#: Where a benchmark's files go by default: beside the run, on the file system it measures.
RESULTS = Path("bench-results")


@contextlib.contextmanager
def scratch(prefix: str, base: Path | None = None, fallback: Path | None = RESULTS) -> Iterator[Path]:
    """A fresh directory under ``base``, else ``fallback`` (None: the system's temporary directory),
    removed afterwards with its parent if this run made that, so that repeated runs leave nothing."""
    parent = base or fallback
    made_parent = parent is not None and not parent.exists()
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=parent)).absolute()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if made_parent:
            with contextlib.suppress(OSError):  # another run may be using it
                root.parent.rmdir()


def rounds_of(parser: argparse.ArgumentParser, requested: int | None, default: int) -> int:
    """``--rounds``, or the size's default: at least one, since a median of none is no figure."""
    rounds = requested or default
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    return rounds


class Clock:
    """Seconds since the run started, printed with each phase so that a slow one shows as it runs."""

    def __init__(self, out: Console) -> None:
        self.console = out
        self.started = time.perf_counter()
        self.marks: dict[str, float] = {}

    def phase(self, name: str) -> None:
        self.marks[name] = time.perf_counter()
        self.console.print(f"[dim]{self.elapsed():5.0f} s: {name}")

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def durations(self) -> dict[str, float]:
        """Each phase's seconds, up to the next phase's start (the last phase is a mark, not timed)."""
        names = list(self.marks)
        return {a: self.marks[b] - self.marks[a] for a, b in itertools.pairwise(names)}


def with_units(figures: Mapping[str, Any], labels: Mapping[str, tuple[str, str, str]]) -> dict[str, dict[str, Any]]:
    """The figures labelled ``key: (section, unit, label)``, as the JSON documents write them."""
    return {
        key: {"value": value, "unit": labels[key][1], "label": labels[key][2]}
        for key, value in figures.items()
        if key in labels
    }


def write_json(path: Path, document: Mapping[str, Any], indent: int = 1, allow_nan: bool = True) -> None:
    """The document at ``path``, its folder made: a run's figures are not lost to a missing folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=indent, allow_nan=allow_nan) + "\n")


def failed(verdicts: Mapping[str, Any]) -> bool:
    """Whether a target was missed: verdicts are booleans, or checks whose ``result`` may be ``FAIL``."""
    return any(v is False or (isinstance(v, Mapping) and v.get("result") == "FAIL") for v in verdicts.values())
