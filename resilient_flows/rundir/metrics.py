"""A member's metrics log: a line per step, appended in batches, never torn.

The views read it (:mod:`resilient_flows.workflow.status`); its place in the run directory is
:attr:`~resilient_flows.rundir.layout.TaskLayout.metrics`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

from resilient_flows.errors import is_storage_full

__all__ = ["MetricsLog"]

logger = logging.getLogger(__name__)


class MetricsLog:
    """Appends a member's per-step metrics lines to its metrics log, in batches.

    A write per step costs a short step (0.3 ms) several percent; lines are therefore held here
    and written at most every ``FLUSH_S`` (the runner's view of progress lags by up to that) and at
    every ``flush`` (before each checkpoint), each batch in one ``write`` on an ``O_APPEND``
    descriptor. A killed member thus never leaves a torn line, and every step up to its newest
    checkpoint is on disk; steps after it are logged again by the resumed attempt.
    """

    FLUSH_S = 0.25

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lines: list[str] = []
        self._flushed = time.monotonic()
        self._fd: int | None = None
        self._unwritten = b""
        self._templates: dict[tuple[str, ...], str] = {}

    def append(self, record: dict[str, int | float]) -> None:
        """One step's numbers; formatted through a template per key set, as ``json.dumps`` would write them."""
        values = tuple(record.values())
        if all(map(math.isfinite, values)):
            keys = tuple(record)
            template = self._templates.get(keys)
            if template is None:
                fields = ", ".join(json.dumps(key).replace("%", "%%") + ": %r" for key in keys)
                template = self._templates[keys] = "{" + fields + "}\n"
            self._lines.append(template % values)
        else:  # NaN and infinities as json writes them
            self._lines.append(json.dumps(record) + "\n")
        if time.monotonic() - self._flushed >= self.FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Write the held lines. On a full file system they are kept, whatever part got in is cut
        back, and the next flush writes them again: a line is never torn, only late."""
        self._flushed = time.monotonic()
        if not self._lines and not self._unwritten:
            return
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        data, self._lines = self._unwritten + "".join(self._lines).encode(), []
        size = os.fstat(self._fd).st_size
        try:
            rest = data
            while rest:
                rest = rest[os.write(self._fd, rest) :]
        except OSError as exc:
            if not is_storage_full(exc):
                raise
            # this file has no other writer: cut back the part of a line that got in, so that a kill
            # before the next flush leaves no torn line, and write all of it again later
            os.ftruncate(self._fd, size)
            logger.warning("%s: file system full, %d bytes of metrics held back", self.path, len(data))
            self._unwritten = data
            return
        self._unwritten = b""

    def close(self) -> None:
        self.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
