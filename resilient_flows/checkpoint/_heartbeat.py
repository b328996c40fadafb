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
users' jobs wrote: it opens only regular files (never a FIFO, device or symlink), owned by the
job's user, of at most :data:`MAX_BYTES`, and :class:`HeartbeatReader` bounds the time a whole
poll's reads may take.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import stat
import statistics
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from resilient_flows.capped import open_regular, parse_json
from resilient_flows.errors import DamagedFileError

logger = logging.getLogger(__name__)

FILENAME = "checkpoint-heartbeat.json"
FORMAT = "resilient-flows-heartbeat/1"
COMMENT_PREFIX = "rf-heartbeat:"
#: A heartbeat is a few hundred bytes; a reader refuses anything much larger.
MAX_BYTES = 64 * 1024
#: The period is the median of this many latest gaps between commits.
PERIOD_GAPS = 5
#: The most characters of a file's own values that a reader's messages repeat.
_SHOWN = 80


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
        self.path = checkpoint_heartbeat_path(directory)
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


def checkpoint_heartbeat_path(tier: str | os.PathLike) -> Path:
    """Where the heartbeat of the shared tier ``tier`` lies."""
    return Path(tier) / FILENAME


def read_checkpoint_heartbeat(path: str | os.PathLike, *, owner: int | None = None) -> CheckpointHeartbeat:
    """Read and check a heartbeat file; ``ValueError`` (or ``OSError``) says what is wrong with it.

    The reader may be a preemption agent running as root and the path a user's choice, so the file
    is looked at before it is opened and opened so that nothing but a small regular file is read:
    see :func:`_read_untrusted`. With ``owner`` (a uid), a file that another user owns, or that
    anyone may write, is refused: only the job's owner speaks for the job.
    """
    path = Path(path)
    data = _read_untrusted(path, owner)
    try:
        raw = parse_json(data)
    except ValueError as exc:  # a deep nest of brackets too
        raise ValueError(f"{path}: not JSON ({_shown(exc)})") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file")
    return CheckpointHeartbeat(
        step=_whole(path, raw, "step"),
        committed=_time(path, raw, "committed"),
        period=_optional_seconds(path, raw, "period"),
        restore=_optional_seconds(path, raw, "restore"),
        written=_time(path, raw, "written"),
        host=str(raw.get("host", ""))[:_SHOWN],
        pid=_whole(path, raw, "pid"),
    )


def _read_untrusted(path: Path, owner: int | None) -> bytes:
    """The bytes of the regular file ``path``, at most :data:`MAX_BYTES`.

    It is opened as every file others may have written is
    (:func:`~resilient_flows.capped.open_regular`): a device is never opened (an open alone can act,
    as ``/dev/watchdog``'s does), a FIFO cannot block, a symlink is not followed, what is checked
    is what is opened, and the descriptor is not inherited by the commands the agent runs.
    """
    try:
        f = open_regular(path, "heartbeat")
    except DamagedFileError as exc:
        raise ValueError(f"{path}: {exc.problem}, so no heartbeat") from None
    with f:
        _check(path, os.fstat(f.fileno()), owner)
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{path}: larger than {MAX_BYTES} bytes, not a heartbeat")
    return data


def _check(path: Path, st: os.stat_result, owner: int | None) -> None:
    if owner is not None and st.st_uid != owner:
        raise ValueError(f"{path}: owned by uid {st.st_uid}, not by the job's owner (uid {owner})")
    if owner is not None and st.st_mode & stat.S_IWOTH:
        raise ValueError(f"{path}: anyone may write it, so it speaks for no one")
    if st.st_size > MAX_BYTES:
        raise ValueError(f"{path}: larger than {MAX_BYTES} bytes, not a heartbeat")


def _shown(value: object) -> str:
    """A user's value in a message: its repr, cut short (a heartbeat may hold 64 KiB of anything)."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


class HeartbeatReader:
    """Reads many heartbeats at once, waiting for them at most ``deadline`` seconds in all.

    Heartbeats lie on shared file systems, where one hung server blocks a read for minutes, at
    paths their jobs chose. Reads run on daemon threads: ``workers`` of them to begin with (one by
    default: threads contend for the interpreter's lock, and on a fast file system one reads
    fastest), and one more each time every thread has spent :attr:`SLOW_S` on its current read
    while reads remain (a slow or hung server), up to ``max_threads``. What is not read by the
    deadline is left out of the answer, and the caller takes it as "no heartbeat". A path whose
    read from an earlier call has not returned is not read again, so that one hung directory holds
    one thread, not one per call.
    """

    #: A thread given nothing to read for this long ends (another starts at the next call).
    IDLE_S = 30.0
    #: A read this long makes the reader start another thread for the reads left.
    SLOW_S = 0.05

    def __init__(self, deadline: float, *, workers: int = 1, max_threads: int = 16) -> None:
        self.deadline = deadline
        self.workers = workers
        self.max_threads = max_threads
        self._cond = threading.Condition()
        self._batch: _Batch | None = None
        self._slots: list[_Slot] = []  # one per thread: what it reads now

    def read(self, wanted: Mapping[str, tuple[str, int | None]]) -> dict[str, CheckpointHeartbeat | Exception]:
        """``{key: (path, owner)}`` -> ``{key: heartbeat, or why not}``; keys not read in time are absent."""
        end = time.monotonic() + self.deadline
        with self._cond:
            reading = {slot.path for slot in self._slots} - {None}
            stuck = {key: path for key, (path, _) in wanted.items() if path in reading}
            batch = _Batch([(key, path, owner) for key, (path, owner) in wanted.items() if key not in stuck])
            self._batch = batch
            self._cond.notify_all()
            while len(self._slots) - len(reading) < self.workers and self._spawn():
                pass
        while not batch.done.wait(max(0.0, min(self.SLOW_S, end - time.monotonic()))):
            if time.monotonic() >= end:
                break
            self._relieve(batch)
        late = {key: TimeoutError(f"{path}: an earlier read of it has not returned") for key, path in stuck.items()}
        return {**late, **batch.close()}

    def _relieve(self, batch: _Batch) -> None:
        """One more thread, if every thread is slow on its read and reads are left."""
        now = time.monotonic()
        with self._cond:
            if batch.left() and all(slot.path is not None and now - slot.since >= self.SLOW_S for slot in self._slots):
                self._spawn()

    def _spawn(self) -> bool:
        """Start a thread (the caller holds the condition); False at ``max_threads``."""
        if len(self._slots) >= self.max_threads:
            return False
        slot = _Slot()
        self._slots.append(slot)
        threading.Thread(target=self._work, args=(slot,), name="rf-heartbeat-reader", daemon=True).start()
        return True

    def _work(self, slot: _Slot) -> None:
        seen: _Batch | None = None
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda seen=seen: self._batch is not seen, timeout=self.IDLE_S):
                    self._slots.remove(slot)  # a reader no one asks any more (its agent is gone) holds no threads
                    return
                batch = self._batch
                if batch is None:  # never: wait_for saw a new batch, and a batch is never taken back
                    continue
                seen = batch
            while (item := batch.take()) is not None:
                slot.since = time.monotonic()
                key, slot.path, owner = item
                try:
                    result: CheckpointHeartbeat | Exception = read_checkpoint_heartbeat(slot.path, owner=owner)
                except Exception as exc:  # any failure is this file's, reported as the reason for it
                    result = exc
                slot.path = None
                batch.put(key, result)


class _Slot:
    """What a reader thread reads now (None between reads), and since when: a thread stuck on a
    path is not asked to read it again, and one slow on it gets help."""

    path: str | None = None
    since: float = 0.0


class _Batch:
    """One call's reads: handed out one at a time, answered until :meth:`close`."""

    def __init__(self, items: list[tuple[str, str, int | None]]) -> None:
        self.items = items
        self.results: dict[str, CheckpointHeartbeat | Exception] = {}
        self.done = threading.Event()
        self._next = 0
        self._open = True
        self._lock = threading.Lock()
        if not items:
            self.done.set()

    def take(self) -> tuple[str, str, int | None] | None:
        with self._lock:
            if not self._open or self._next == len(self.items):
                return None
            self._next += 1
            return self.items[self._next - 1]

    def left(self) -> bool:
        with self._lock:
            return self._open and self._next < len(self.items)

    def put(self, key: str, result: CheckpointHeartbeat | Exception) -> None:
        with self._lock:
            if self._open:
                self.results[key] = result
                if len(self.results) == len(self.items):
                    self.done.set()

    def close(self) -> dict[str, CheckpointHeartbeat | Exception]:
        with self._lock:
            self._open = False
            return dict(self.results)


def _whole(path: Path, raw: dict, name: str) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{path}: {name} must be a whole number >= 0, got {_shown(value)}")
    return value


def _time(path: Path, raw: dict, name: str) -> float:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{path}: {name} must be a Unix time, got {_shown(value)}")
    return float(value)


def _optional_seconds(path: Path, raw: dict, name: str) -> float | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{path}: {name} must be seconds > 0 or null, got {_shown(value)}")
    return float(value)
