"""The run's block ledger: an append-only JSON-lines file of what every runner started.

Runners append and a later runner reads; a runner killed mid-line leaves a torn line, which the
next writer closes before its own line and every reader skips, so one crash never glues two
records together or hides the rest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from resilient_flows.capped import LINE_CAP, CappedLines, parse_json
from resilient_flows.rundir._layout import RunLayout


def append_record(layout: RunLayout, record: dict[str, Any]) -> None:
    """Append one record, after a newline if the last writer was killed mid-line."""
    line = json.dumps(record) + "\n"
    fd = os.open(layout.blocks, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_records(layout: RunLayout) -> Iterator[dict[str, Any]]:
    """Every complete record in file order; torn and oversized lines are skipped."""
    for line in CappedLines(layout.blocks, LINE_CAP, "runner ledger"):
        try:
            record = parse_json(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record
