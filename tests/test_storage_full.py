"""A shared file system that fills up for a while: members wait it out instead of failing.

Real file systems: a small tmpfs (root, as in CI) filled with a ballast file, freed later.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from test_faults import small_filesystem  # noqa: F401 (a fixture)

from resilient_flows.errors import STORAGE_FULL, Failure, StorageFullError, is_storage_full
from resilient_flows.rundir._events import EventLog, read_events
from resilient_flows.rundir._metrics import MetricsLog
from resilient_flows.training import MemberSpec, run_member
from resilient_flows.training.boundary import _runtime as boundary_runtime


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` up to its last byte; the ballast file."""
    ballast = directory / "ballast"
    with ballast.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert is_storage_full(exc)
    return ballast


def test_metrics_are_held_back_on_a_full_file_system_and_never_torn(small_filesystem: Path) -> None:  # noqa: F811
    log = MetricsLog(small_filesystem / "metrics.jsonl")
    ballast = fill(small_filesystem)
    for step in range(200):
        log.append({"step": step, "loss": step / 7})
    log.flush()  # nothing fits: held, no error
    ballast.unlink()
    log.close()
    lines = (small_filesystem / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(200))


def test_an_event_waits_for_space(small_filesystem: Path) -> None:  # noqa: F811
    events = EventLog(small_filesystem)
    ballast = fill(small_filesystem)  # not a page left for the log's first line
    threading.Timer(1.0, ballast.unlink).start()
    started = time.monotonic()
    events.emit("submitted", "a")
    events.emit("started", "a", attempt=1)
    assert time.monotonic() - started >= 0.9
    assert [e["kind"] for e in read_events(small_filesystem)] == ["submitted", "started"]


def test_an_event_writer_killed_while_the_file_system_is_full_leaves_no_torn_line(
    small_filesystem: Path,  # noqa: F811
) -> None:
    log = small_filesystem / "events.jsonl"
    first = {"time": 0.0, "kind": "submitted", "member": "a", "pad": ""}
    first["pad"] = "x" * (4096 - 10 - len(json.dumps(first)) - 1)
    log.write_text(json.dumps(first) + "\n")
    assert log.stat().st_size == 4096 - 10  # the last page has 10 bytes left: a line would be split there
    ballast = fill(small_filesystem)
    victim = f"EventLog({str(small_filesystem)!r}).emit('started', 'victim', attempt=1, note='y' * 100)"
    writer = subprocess.Popen([sys.executable, "-c", f"from resilient_flows.rundir._events import EventLog\n{victim}"])
    time.sleep(1.5)  # it waits for room
    writer.kill()
    writer.wait()
    ballast.unlink()
    EventLog(small_filesystem).emit("finished", "a")
    assert all(json.loads(line) for line in log.read_text().splitlines())
    assert [(e["kind"], e["member"]) for e in read_events(small_filesystem)] == [("submitted", "a"), ("finished", "a")]


def test_a_runner_starts_parsl_once_the_full_run_directory_has_room(
    small_filesystem: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A runner resumed while the shared tier is full: Parsl's first files cannot be written. Once
    it runs, the lines its log cannot take while the tier is full again are dropped, unreported."""
    import io

    import parsl
    from parsl.config import Config
    from rich.console import Console

    from resilient_flows.sites import SiteFile
    from resilient_flows.sites._parsl import close_parsl_logs, parsl_file_logs
    from resilient_flows.workflow._parsl_instance import load_parsl
    from resilient_flows.workflow._runner import _site_config

    run_dir = small_filesystem / "run"
    run_dir.mkdir()
    ballast = fill(small_filesystem)
    threading.Timer(3.0, ballast.unlink).start()
    out = io.StringIO()
    started = time.monotonic()

    def without_blocks() -> Config:  # the interchange is what must start; a pool would only linger
        config = _site_config(SiteFile.open("local"), run_dir, 0, 0)
        config.executors[0].provider.init_blocks = 0
        return config

    config = without_blocks()
    dfk, _ = load_parsl(config, without_blocks, Console(file=out))
    try:
        assert time.monotonic() - started >= 2.5
        assert "waiting for space" in out.getvalue() and "No space left on device" in out.getvalue()
        assert dfk.executors["local"].interchange_proc.poll() is None  # it runs
        capsys.readouterr()
        ballast = fill(small_filesystem)
        for i in range(2000):  # past the log's buffer: every line written is refused
            logging.getLogger("parsl").info("line %d of a full file system", i)
        ballast.unlink()
        logging.getLogger("parsl").info("a line once there is room")
        assert "Logging error" not in capsys.readouterr().err
        logs = parsl_file_logs(config.run_dir)
        logs[0].flush()
        assert "a line once there is room" in Path(logs[0].baseFilename).read_text()
    finally:
        logs = parsl_file_logs(config.run_dir)
        dfk.cleanup()
        parsl.clear()
        close_parsl_logs(logs)  # as the runner does: Parsl's cleanup leaves its log open


def test_a_member_trains_through_a_full_file_system_and_ends_like_an_uninterrupted_run(
    tmp_path: Path,
    small_filesystem: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(boundary_runtime, "STORAGE_RETRY_S", 0.1)
    spec = MemberSpec(name="m", workload="userworkload:train", params={}, steps=3000)
    run_dir = small_filesystem / "run"
    run_dir.mkdir()
    full = threading.Event()

    def fill_after_a_few_checkpoints() -> None:
        while sum(e["kind"] == "checkpointed" for e in read_events(run_dir)) < 5:
            time.sleep(0.01)
        ballast = fill(small_filesystem)
        full.set()
        time.sleep(1.5)
        ballast.unlink()

    filler = threading.Thread(target=fill_after_a_few_checkpoints)
    filler.start()
    result = run_member(spec.to_dict(), str(run_dir))
    filler.join()
    assert full.is_set()
    reference = run_member(replace(spec).to_dict(), str(tmp_path / "reference"))
    assert result["digest"] == reference["digest"]
    steps = [json.loads(line)["step"] for line in (run_dir / "members/m/metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(3000))
    checkpointed = [e["step"] for e in read_events(run_dir) if e["kind"] == "checkpointed"]
    assert checkpointed[-1] == 2999 and len(checkpointed) == 300


def test_storage_full_is_told_apart_from_other_failures() -> None:
    assert is_storage_full(OSError(28, "No space left on device"))
    assert is_storage_full(StorageFullError("x"))
    assert not is_storage_full(OSError(5, "Input/output error"))
    quota = Failure.of(OSError(122, "Disk quota exceeded"), "writing x failed").within("flush of step 3")
    assert (quota.kind, quota.errno, str(quota)) == (
        STORAGE_FULL,
        122,
        "flush of step 3: writing x failed: [Errno 122] Disk quota exceeded",
    )
    assert Failure.of(OSError(5, "Input/output error"), "writing x failed").kind == "io"
    assert Failure.of(ValueError("checksum mismatch"), "writing x failed").kind == "error"
