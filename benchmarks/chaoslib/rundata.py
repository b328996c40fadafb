"""What a run left on disk, parsed once: the analysis reads this, never the live run directory
(whose tmpfs is gone by then), so that it can also be tested on made-up events.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunData:
    """What a run left on disk, parsed (read before its tmpfs goes)."""

    names: list[str]
    digests: dict[str, str]
    events: list[dict[str, Any]]
    torn_events: int
    metrics: dict[str, list[tuple[int, int, float]]]  # member -> (step, attempt, time) per line
    torn_metrics: int
    parsl_mib: float  # Parsl's logs and scripts: a flooding log shows here
    spanning: set[str] = field(default_factory=set)  # members whose ranks span nodes


def parse_lines(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON lines of ``path`` and how many lines do not parse (torn)."""
    records, torn = [], 0
    with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
        for raw in f:
            try:
                records.append(json.loads(raw))
            except ValueError:
                torn += 1
    return records, torn


def read_run(run_dir: Path) -> RunData:
    planned = json.loads((run_dir / "plan.json").read_text())["members"]
    names = [member["name"] for member in planned]
    spanning = {member["name"] for member in planned if int(member.get("nodes") or 1) > 1}
    digests, metrics, torn_metrics = {}, {}, 0
    for name in names:
        directory = run_dir / "members" / name
        with contextlib.suppress(OSError, ValueError, KeyError):
            digests[name] = json.loads((directory / "result.json").read_text())["digest"]
        lines, torn = parse_lines(directory / "metrics.jsonl")
        metrics[name] = [(int(r["step"]), int(r["attempt"]), float(r["time"])) for r in lines]
        torn_metrics += torn
    events, torn_events = parse_lines(run_dir / "events.jsonl")
    parsl_mib = directory_mib(run_dir / "parsl")
    return RunData(names, digests, events, torn_events, metrics, torn_metrics, parsl_mib, spanning)


def directory_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def members_span_s(data: RunData) -> float:
    """From the first member's start to the last member's end."""
    starts = [e["time"] for e in data.events if e["kind"] == "started"]
    ends = [e["time"] for e in data.events if e["kind"] == "finished"]
    return max(ends) - min(starts) if starts and ends else 0.0


def attempt_jobs(data: RunData) -> dict[tuple[str, int], int]:
    """(member, attempt) -> the Slurm job of the block it started on: of the ``block_started``
    events of its block number (reused by later Parsl instances), the last to start before it."""
    blocks: dict[str, list[tuple[float, int]]] = {}
    for e in data.events:
        if e["kind"] == "block_started" and str(e.get("job_id", "")).isdigit():
            blocks.setdefault(str(e["block"]), []).append((float(e["start"]), int(e["job_id"])))
    out = {}
    for e in data.events:
        if e["kind"] == "started" and e.get("member") is not None and e.get("block") is not None:
            candidates = [(start, job) for start, job in blocks.get(str(e["block"]), []) if start <= e["time"] + 1.0]
            if candidates:
                out[(e["member"], e["attempt"])] = max(candidates)[1]
    return out
