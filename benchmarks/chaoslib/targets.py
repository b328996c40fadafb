"""What a fault may strike now: the attempts that beat in the run's ``heartbeats/``, with the nodes
and checkpoints its ``events.jsonl`` gives them, read as the log grows.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaoslib.procs import Proc, read_proc


def running_members(run_dir: Path) -> dict[str, tuple[int, int]]:
    """member -> (attempt, pid) of the attempts that beat now (``heartbeats/``; analytics and retries
    waiting out their backoff excluded)."""
    found = {}
    with contextlib.suppress(FileNotFoundError):
        for path in (run_dir / "heartbeats").iterdir():
            if "@" in path.name:
                continue
            with contextlib.suppress(OSError, ValueError):
                record = json.loads(path.read_bytes())
                attempt, pid = record.get("attempt"), record.get("pid")
                if isinstance(attempt, int) and isinstance(pid, int):  # a retry in its backoff has no attempt yet
                    found[path.name] = (attempt, pid)
    return found


class EventTail:
    """The events of a run as they are written: each call to :meth:`read` parses the lines
    appended since the last, so that a fault looking for its target every half second does not
    read the whole log again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._offset = 0
        self._lock = threading.Lock()

    def read(self) -> list[dict[str, Any]]:
        with self._lock:
            with contextlib.suppress(FileNotFoundError), self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
                complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written is read next time
                self._offset += len(complete)
                for raw in complete.splitlines():
                    with contextlib.suppress(ValueError):
                        self.events.append(json.loads(raw))
            return list(self.events)


@dataclass(frozen=True)
class Attempt:
    """A running attempt, seen from outside: its member, number, process (rank 0's), and nodes."""

    member: str
    attempt: int
    proc: Proc
    hosts: tuple[str, ...]
    checkpoints: int  # checkpoints it committed so far


def running_attempts(run_dir: Path, events: list[dict[str, Any]]) -> list[Attempt]:
    """The attempts that beat now and whose process lives, with the nodes their ``started`` event
    names (``hosts`` for a member spanning nodes, else ``host``)."""
    started: dict[tuple[str, int], tuple[float, tuple[str, ...]]] = {}
    commits: dict[str, list[float]] = {}
    for e in events:
        if e["kind"] == "started" and e.get("member") is not None:
            hosts = tuple(e.get("hosts") or [e.get("host")])
            started[(e["member"], e["attempt"])] = (e["time"], hosts)
        elif e["kind"] == "checkpointed":
            commits.setdefault(e.get("member"), []).append(e["time"])
    found = []
    for name, (attempt, pid) in running_members(run_dir).items():
        proc = read_proc(pid)
        if (name, attempt) not in started or proc is None or proc.state == "Z":
            continue
        since, hosts = started[(name, attempt)]
        found.append(Attempt(name, attempt, proc, hosts, sum(t >= since for t in commits.get(name, []))))
    return sorted(found, key=lambda a: a.member)
