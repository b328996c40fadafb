"""A job's checkpoint heartbeat: what a preemption agent needs to know about it, in one small file.

A scheduler that preempts a job throws away the work since the job's newest checkpoint; to choose
victims well it must know when that was. Rank 0 of every :class:`Checkpointer` writes
``checkpoint-heartbeat.json`` next to the shared tier's checkpoints after each commit there (the
shared tier is what a requeued job, perhaps on other nodes, restores from). The file is replaced
atomically (written beside, then renamed), so a reader sees the old heartbeat or the new one,
never half of one. It is not fsynced: after a crash of the node an empty or stale file is
possible, which a reader takes as "no heartbeat", the conservative reading.

Under Slurm, rank 0 also records the heartbeat's path in its own job's comment
(``rf-heartbeat:<path>``, with ``scontrol update``, allowed for one's own jobs), once, where the
job has no comment of its own: that is how the agent finds it without knowing the job's files.
Set ``RESILIENT_FLOWS_PUBLISH_HEARTBEAT=0`` to keep the comment untouched. A member that a Parsl
pilot job runs (``PARSL_WORKER_BLOCK_ID`` is set) publishes nothing: that job is the pilot's,
shared by several members, whose co-scheduling is the workflow runner's.

The file holds JSON only and a reader checks every field, because the agent reads files that
users' jobs wrote.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import statistics
import subprocess
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["COMMENT_PREFIX", "FILENAME", "FORMAT", "CheckpointHeartbeat", "HeartbeatWriter", "read_heartbeat"]

logger = logging.getLogger(__name__)

FILENAME = "checkpoint-heartbeat.json"
FORMAT = "resilient-flows-heartbeat/1"
COMMENT_PREFIX = "rf-heartbeat:"
#: A heartbeat is a few hundred bytes; a reader refuses anything much larger.
MAX_BYTES = 64 * 1024
#: The period is the median of this many latest gaps between commits.
PERIOD_GAPS = 5


@dataclass(frozen=True)
class CheckpointHeartbeat:
    """The newest checkpoint a requeued job would resume from, and what resuming costs.

    ``committed``: Unix time of the newest commit to the shared tier, of step ``step``.
    ``period``: seconds between the latest commits (None until there are two). ``restore``:
    seconds this job's last restore took; before any restore, the time its latest checkpoint took
    to reach the shared tier, a stand-in of the same size. ``written``: when the file was written.
    """

    step: int
    committed: float
    period: float | None
    restore: float | None
    written: float
    host: str
    pid: int
    format: str = FORMAT


class HeartbeatWriter:
    """Rank 0's heartbeat: the file, and (under Slurm) the job comment that points to it."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILENAME
        self.restore_s: float | None = None
        self._commits: deque[float] = deque(maxlen=PERIOD_GAPS + 1)
        self._published = False
        self._lock = threading.Lock()

    def committed(self, step: int, persist_latency: float) -> None:
        """Step ``step`` was just committed to the shared tier, ``persist_latency`` s after its save."""
        now = time.time()
        with self._lock:
            self._commits.append(now)
            gaps = [b - a for a, b in zip(self._commits, list(self._commits)[1:], strict=False)]
            beat = CheckpointHeartbeat(
                step=step,
                committed=now,
                period=statistics.median(gaps) if gaps else None,
                restore=self.restore_s if self.restore_s is not None else persist_latency,
                written=now,
                host=socket.gethostname(),
                pid=os.getpid(),
            )
            try:
                _write_atomically(self.path, json.dumps(asdict(beat)))
            except OSError as exc:
                logger.warning("cannot write the checkpoint heartbeat %s: %s", self.path, exc)
                return
            if not self._published:
                self._published = True
                threading.Thread(
                    target=_publish_in_slurm_comment, args=(self.path,), name="rf-heartbeat", daemon=True
                ).start()


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _publish_in_slurm_comment(path: Path) -> None:
    """Point this Slurm job's comment at the heartbeat, unless the job has a comment of its own."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job or os.environ.get("RESILIENT_FLOWS_PUBLISH_HEARTBEAT") == "0" or "PARSL_WORKER_BLOCK_ID" in os.environ:
        return
    comment = f"{COMMENT_PREFIX}{path.resolve()}"
    try:
        current = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%k"], capture_output=True, text=True, timeout=20, check=True
        ).stdout.strip()
        if current not in ("", "(null)") and not current.startswith(COMMENT_PREFIX):
            logger.warning("Slurm job %s has a comment of its own; the heartbeat %s is not published", job, path)
            return
        if current != comment:
            subprocess.run(
                ["scontrol", "update", f"JobId={job}", f"Comment={comment}"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            )
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("cannot publish the checkpoint heartbeat in Slurm job %s's comment: %s", job, exc)


def read_heartbeat(path: str | os.PathLike) -> CheckpointHeartbeat:
    """Read and check a heartbeat file; ``ValueError`` (or ``OSError``) says what is wrong with it."""
    path = Path(path)
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{path}: larger than {MAX_BYTES} bytes, not a heartbeat")
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file")
    beat = CheckpointHeartbeat(
        step=_whole(path, raw, "step"),
        committed=_time(path, raw, "committed"),
        period=_optional_seconds(path, raw, "period"),
        restore=_optional_seconds(path, raw, "restore"),
        written=_time(path, raw, "written"),
        host=str(raw.get("host", "")),
        pid=_whole(path, raw, "pid"),
    )
    return beat


def _whole(path: Path, raw: dict, name: str) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{path}: {name} must be a whole number >= 0, got {value!r}")
    return value


def _time(path: Path, raw: dict, name: str) -> float:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{path}: {name} must be a Unix time, got {value!r}")
    return float(value)


def _optional_seconds(path: Path, raw: dict, name: str) -> float | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{path}: {name} must be seconds > 0 or null, got {value!r}")
    return float(value)
