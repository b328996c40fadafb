"""Reader for the Standard Workload Format (SWF) of the Parallel Workloads Archive.

One job per line, 18 whitespace-separated numbers, ``-1`` for unknown; ``;`` starts a comment, and
header comments of the form ``; Key: value`` describe the log (``MaxNodes``, ``UnixStartTime``).
Fields keep the archive's meaning and its ``-1``: the reader does not guess, the simulator decides
what a missing value means for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from resilient_flows.errors import InvalidJobError

MISSING = -1


@dataclass(frozen=True, slots=True)
class SwfJob:
    """One line of an SWF file, field for field in the archive's order; ``-1`` where unknown.

    Times are seconds (``submit_time`` relative to the header's ``UnixStartTime``), memory is
    kilobytes per processor, and ``queue``/``partition`` are the log's own numbering.
    """

    job_number: int
    submit_time: float
    wait_time: float
    run_time: float
    allocated_processors: int
    average_cpu_time: float
    used_memory: float
    requested_processors: int
    requested_time: float
    requested_memory: float
    status: int
    user_id: int
    group_id: int
    executable: int
    queue: int
    partition: int
    preceding_job: int
    think_time: float

    @property
    def processors(self) -> int:
        """Processors the job ran on: allocated if known, else requested, else -1.

        Logs that only record the request (or only the allocation) are common; for a job that ran,
        the allocation is the truth and the request the next best.
        """
        if self.allocated_processors > 0:
            return self.allocated_processors
        return self.requested_processors if self.requested_processors > 0 else MISSING

    @property
    def usable(self) -> bool:
        """Whether a simulator can replay it: it ran for some time on a known number of processors."""
        return self.run_time > 0 and self.processors > 0


_FIELDS = tuple(f.name for f in fields(SwfJob))
_INTEGER = {name for name, kind in SwfJob.__annotations__.items() if kind == "int"}


@dataclass(frozen=True)
class SwfTrace:
    """The jobs of one SWF file in file order, and its ``Key: value`` header comments.

    A key repeated in the header (several ``Note:`` lines) keeps every value, one per line.
    """

    path: Path
    jobs: tuple[SwfJob, ...]
    header: dict[str, str] = field(default_factory=dict)

    @property
    def max_nodes(self) -> int | None:
        """Size of the machine from ``MaxNodes`` (else ``MaxProcs``), None if the header has neither."""
        for key in ("MaxNodes", "MaxProcs"):
            value = self.header.get(key, "").strip()
            if value.lstrip("-").isdigit() and int(value) > 0:
                return int(value)
        return None

    @property
    def unusable(self) -> int:
        """Jobs with no run time or no processor count: a simulator must skip them, and say how many."""
        return sum(not job.usable for job in self.jobs)


def read_swf(path: str | Path) -> SwfTrace:
    """Read an SWF file.

    Raises
    ------
    InvalidJobError
        On the first line that is not 18 numbers, naming the file, the line number and the field,
        so that a hand-edited trace can be fixed where it broke rather than replayed half-read.
    FileNotFoundError
        If ``path`` does not exist.
    """
    path = Path(path)
    jobs: list[SwfJob] = []
    header: dict[str, str] = {}
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            text = line.strip()
            if not text:
                continue
            if text.startswith(";"):
                key, sep, value = text[1:].partition(":")
                if sep and key.strip() and " " not in key.strip():
                    key, value = key.strip(), value.strip()
                    header[key] = f"{header[key]}\n{value}" if key in header else value
                continue
            jobs.append(_parse_job(text, path, number))
    return SwfTrace(path=path, jobs=tuple(jobs), header=header)


def _parse_job(text: str, path: Path, number: int) -> SwfJob:
    tokens = text.split()
    if len(tokens) != len(_FIELDS):
        raise InvalidJobError(f"{path}:{number}: expected {len(_FIELDS)} fields, got {len(tokens)}: {text[:80]!r}")
    values: dict[str, Any] = {}  # an int for each field of _INTEGER, a float for the others
    for position, (name, token) in enumerate(zip(_FIELDS, tokens, strict=True), start=1):
        try:
            value = float(token)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise InvalidJobError(f"{path}:{number}: field {position} ({name}) is {token!r}, not a number")
        if name in _INTEGER:
            if not value.is_integer():
                raise InvalidJobError(f"{path}:{number}: field {position} ({name}) is {token!r}, not a whole number")
            value = int(value)
        values[name] = value
    return SwfJob(**values)
