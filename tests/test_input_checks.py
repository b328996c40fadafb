"""What run and checkpoint directories hold is input: a manifest's shard names cannot lead out of
their step directory, and every file is read within the size cap of its kind (logs line by line).

Oversized files are sparse: one byte over their cap costs no disk, and a reader that read one
whole would still take seconds and hundreds of MiB."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from trainkit import Problem, replicated_digest

from resilient_flows.capped import (
    CONTROL_CAP,
    DOCUMENT_CAP,
    LINE_CAP,
    MANIFEST_CAP,
    MAX_DEPTH,
    PLAN_CAP,
    CappedLines,
    parse_json,
    read_capped,
    read_json_capped,
)
from resilient_flows.checkpoint import Checkpointer, CheckpointError, scan
from resilient_flows.checkpoint import _manifest as manifest_module
from resilient_flows.checkpoint._manifest import read_manifest, write_manifest
from resilient_flows.clone._lineage import lineage_tree
from resilient_flows.errors import DamagedFileError, FileTooLargeError, WorkflowError
from resilient_flows.integrations.pathstore import REF_FORMAT, PathStore, read_ref
from resilient_flows.rundir import _planfile as plan_file_module
from resilient_flows.rundir import count_attempt, member_dir
from resilient_flows.rundir._control import read_clone_orders, read_stop_request
from resilient_flows.rundir._events import EventLog, EventTail, read_events
from resilient_flows.rundir._heartbeat import read_attempt_heartbeat
from resilient_flows.rundir._metrics import MetricsReader
from resilient_flows.training._command import _finish
from resilient_flows.training._members import read_spec, register_member, registered_members
from resilient_flows.training._spec import MemberSpec, ParentSpec
from resilient_flows.workflow import load_workflow
from resilient_flows.workflow._blocks import BlockLedger, RunnerLock
from resilient_flows.workflow._plan import plan_workflow
from resilient_flows.workflow._recorded_plan import create_run_dir, read_plan
from resilient_flows.workflow._status import MemberStatus

SHARD = "shard-00000-of-00001.safetensors"


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict[int, str]]:
    """Steps 2 and 4 committed in one tier, with the digest of the state each one holds."""
    problem = Problem()
    digests = {}
    with Checkpointer(tmp_path / "ckpt", keep=5) as ck:
        for s in range(1, 5):
            problem.step(s)
            if s % 2 == 0:
                ck.save(s, problem.state)
                digests[s] = replicated_digest(problem.state)
    return tmp_path / "ckpt", digests


def assert_restores_step_2(directory: Path, digests: dict[int, str], reason: str) -> None:
    """Restore skips step 4 for ``reason`` and takes step 2 bit for bit; both scans call 4 invalid."""
    fresh = Problem(seed=5)
    with Checkpointer(directory) as ck:
        assert ck.restore(fresh.state) == 2
        (skipped,) = ck.skipped
    assert skipped.step == 4 and re.search(reason, skipped.reason), skipped.reason
    assert replicated_digest(fresh.state) == digests[2]
    for verify in (True, False):
        assert [i.step for i in scan(directory, verify=verify) if not i.valid] == [4]


def oversize(path: Path, cap: int, head: bytes = b"") -> Path:
    """A sparse file of one byte over ``cap``, starting with ``head``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head)
    os.truncate(path, cap + 1)
    return path


def too_large(path: Path, cap: int) -> str:
    return re.escape(f"{path} is larger than its cap of {cap >> 20} MiB")


# ------------------------------------------------------------------------------------ shard names


@pytest.mark.parametrize(
    "name",
    [
        "../x",
        "/etc/passwd",
        "shard-0-of-1.safetensors/../../x",
        "model.safetensors",
        "shard-00001-of-00002.safetensors",  # the right pattern, but not shard 0 of 1
    ],
)
def test_a_manifest_naming_a_shard_outside_the_format_is_refused(saved: tuple[Path, dict[int, str]], name: str) -> None:
    directory, digests = saved
    path = directory / "step-00000004" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["shards"][0]["file"] = name
    path.write_text(json.dumps(manifest))
    reason = re.escape(f"step-00000004/manifest.json: malformed manifest (ValueError: shards[0].file is {name!r}")
    assert_restores_step_2(directory, digests, reason)


def test_a_shard_linked_from_outside_its_step_directory_is_refused(
    saved: tuple[Path, dict[int, str]], tmp_path: Path
) -> None:
    directory, digests = saved
    shard = directory / "step-00000004" / SHARD
    outside = tmp_path / "elsewhere.safetensors"
    shard.rename(outside)  # the very bytes the manifest expects: only where they lie is wrong
    shard.symlink_to(outside)
    assert_restores_step_2(directory, digests, f"step-00000004/{SHARD} is a symbolic link out of its step directory")


def test_a_shard_linked_within_its_step_directory_is_read(saved: tuple[Path, dict[int, str]]) -> None:
    directory, digests = saved
    shard = directory / "step-00000004" / SHARD
    shard.rename(shard.with_name("moved"))
    shard.symlink_to("moved")
    fresh = Problem(seed=5)
    with Checkpointer(directory) as ck:
        assert ck.restore(fresh.state) == 4 and not ck.skipped
    assert replicated_digest(fresh.state) == digests[4]


# ------------------------------------------------------------------------------------ size caps


def test_an_oversized_manifest_is_skipped_for_the_previous_checkpoint(saved: tuple[Path, dict[int, str]]) -> None:
    directory, digests = saved
    path = oversize(directory / "step-00000004" / "manifest.json", MANIFEST_CAP)
    assert_restores_step_2(directory, digests, too_large(path, MANIFEST_CAP))


def test_the_writer_refuses_a_manifest_that_readers_would_refuse(
    saved: tuple[Path, dict[int, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    step_dir = saved[0] / "step-00000004"
    manifest = read_manifest(step_dir)
    before = (step_dir / "manifest.json").read_bytes()
    manifest.skeleton = {**manifest.skeleton, "note": "x" * (2 << 20)}
    monkeypatch.setattr(manifest_module, "MANIFEST_CAP", 1 << 20)
    with pytest.raises(CheckpointError, match="over the 1 MiB that readers accept"):
        write_manifest(step_dir, manifest)
    assert (step_dir / "manifest.json").read_bytes() == before


def test_a_run_whose_plan_resume_would_refuse_is_not_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_workflow(load_workflow(REPO / "workflows" / "quickstart.yaml"), build_site=False)
    monkeypatch.setattr(plan_file_module, "PLAN_CAP", 1 << 10)
    with pytest.raises(WorkflowError, match=r"members is over the \d+ MiB a run may have"):
        create_run_dir(tmp_path / "run", plan, "")
    assert not (tmp_path / "run").exists()


def clone_lineage(run: Path) -> str:
    register_member(run, MemberSpec("b", "w", {}, parent=ParentSpec("a", "r1")))
    return str(lineage_tree(run).children[0].children[0].label)


def remove_reference(run: Path) -> None:
    PathStore(run / "store").remove(run / "a.ckpt")


#: Files whose readers refuse an oversized one: (path in the run directory, cap, first bytes, reader).
REFUSED: dict[str, tuple[str, int, bytes, Callable[[Path], Any]]] = {
    "member spec": ("members/a/spec.json", DOCUMENT_CAP, b"", lambda run: read_spec(run, "a")),
    "registered member spec": ("members/a/spec.json", DOCUMENT_CAP, b"", registered_members),
    "attempt counter": ("members/a/attempts", CONTROL_CAP, b"", lambda run: count_attempt(member_dir(run, "a"))),
    "run plan": ("plan.json", PLAN_CAP, b"", read_plan),
    "member result": (
        "members/a/result.json",
        DOCUMENT_CAP,
        b"",
        lambda run: MemberStatus("a", 10).refresh(member_dir(run, "a"), follow=False),
    ),
    "checkpoint reference": (
        "a.ckpt",
        DOCUMENT_CAP,
        json.dumps({"format": REF_FORMAT}).encode(),
        lambda run: read_ref(run / "a.ckpt"),
    ),
    "reference directories": ("store/refdirs", CONTROL_CAP, b"", remove_reference),
}


@pytest.mark.parametrize("kind", REFUSED)
def test_an_oversized_file_is_refused_naming_it_and_its_cap(tmp_path: Path, kind: str) -> None:
    where, cap, head, read = REFUSED[kind]
    path = oversize(tmp_path / where, cap, head)
    with pytest.raises((FileTooLargeError, WorkflowError), match=too_large(path, cap)):
        read(tmp_path)


#: Files whose readers pass over one they cannot use (being rewritten, not JSON): (path, cap, reader, result).
PASSED_OVER: dict[str, tuple[str, int, Callable[[Path], Any], Any]] = {
    "control request": (
        "members/a/control.json",
        CONTROL_CAP,
        lambda run: read_stop_request(member_dir(run, "a")),
        None,
    ),
    "clone order": (
        "members/a/clone-order.r1.json",
        CONTROL_CAP,
        lambda run: read_clone_orders(member_dir(run, "a")),
        [],
    ),
    "heartbeat": ("heartbeats/a", CONTROL_CAP, lambda run: read_attempt_heartbeat(run / "heartbeats" / "a"), None),
    "runner lock": ("runner.json", CONTROL_CAP, lambda run: RunnerLock(run).acquire(), None),
    "clone seed": ("members/b/seed.json", CONTROL_CAP, clone_lineage, "[bold]b[/]  (waiting for its state; unchanged)"),
}


@pytest.mark.parametrize("kind", PASSED_OVER)
def test_an_oversized_file_is_passed_over_where_its_reader_is_tolerant(tmp_path: Path, kind: str) -> None:
    where, cap, read, expected = PASSED_OVER[kind]
    register_member(tmp_path, MemberSpec("a", "w", {}))
    oversize(tmp_path / where, cap)
    assert read(tmp_path) == expected


def test_an_oversized_command_report_leaves_the_result_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = MemberSpec("a", "", {})
    register_member(tmp_path, spec)
    path = oversize(member_dir(tmp_path, "a") / "command-result.json", DOCUMENT_CAP)
    assert _finish(spec, str(tmp_path), 1, EventLog(tmp_path)) == {"member": "a", "attempts": 1, "exit_status": 0}
    assert re.search(too_large(path, DOCUMENT_CAP), caplog.text), caplog.text


# ------------------------------------------------------------------------------------ log lines


def lines(*records: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


#: A line over the cap, that would parse if it were read.
HUGE = json.dumps({"kind": "huge", "step": 0, "pad": "x" * LINE_CAP}).encode() + b"\n"


def test_an_oversized_event_is_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first, second = {"time": 1.0, "kind": "submitted", "member": "a"}, {"time": 2.0, "kind": "started", "member": "a"}
    (tmp_path / "events.jsonl").write_bytes(lines(first) + HUGE + lines(second))
    assert list(read_events(tmp_path)) == [first, second]
    tail = EventTail(tmp_path)
    assert tail.new() == [first, second] and tail.new() == []
    assert f"event log {tmp_path / 'events.jsonl'}: skipped the line at byte {len(lines(first))}" in caplog.text


def test_an_oversized_metrics_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(lines({"step": 1, "loss": 0.5}) + HUGE + lines({"step": 2, "loss": 0.25}))
    reader = MetricsReader(path)
    reader.update()
    reader.read_curve()
    assert reader.curve == {1: 0.5, 2: 0.25} and reader.last == {"step": 2, "loss": 0.25}
    path.write_bytes(lines({"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25, "pad": "x" * 3 * LINE_CAP}))
    reader = MetricsReader(path)
    reader.peek()  # the newest line is over the cap: not read from the end
    assert reader.last is None


def test_an_oversized_ledger_line_is_skipped(tmp_path: Path) -> None:
    earlier = [{"time": 1.0, "runner": 1, "executor": "x", "block": "0"}, {"time": 2.0, "runner": 1, "interchange": 5}]
    (tmp_path / "blocks.jsonl").write_bytes(lines(earlier[0]) + HUGE + lines(earlier[1]))
    assert BlockLedger(tmp_path, runner=2).previous() == earlier


@pytest.mark.parametrize("block", [3, 8, 1 << 20])
def test_capped_lines_follow_a_growing_file_in_blocks_of_any_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(CappedLines, "BLOCK", block)
    path = tmp_path / "log"
    path.write_bytes(b"one\n" + b"x" * 11 + b"\n" + b"y" * 10 + b"\n\ntwo\nthr")
    reader = CappedLines(path, 10, "log")
    assert list(reader) == [b"one", b"y" * 10, b"", b"two"] and reader.offset == 32  # the line being written waits
    with path.open("ab") as f:
        f.write(b"ee\n")
    assert list(reader) == [b"three"] and reader.offset == path.stat().st_size
    assert list(CappedLines(tmp_path / "absent", 10, "log")) == []


def test_read_capped_reads_a_file_at_its_cap_and_stops_one_byte_past_it(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_capped(path, 100, "file") == b"x" * 100
    with pytest.raises(FileTooLargeError, match=re.escape(f"file {path} is larger than its cap of 99 bytes")):
        read_capped(path, 99, "file")
    with pytest.raises(DamagedFileError, match="stream /dev/zero is a device, not a regular file"):  # never ends
        read_capped("/dev/zero", 4096, "stream")


def test_a_fifo_in_a_files_place_is_refused_at_once(tmp_path: Path) -> None:
    """Whoever can write the run directory could otherwise block a member at its step boundary."""
    fifo = tmp_path / "control.json"
    os.mkfifo(fifo)
    with pytest.raises(DamagedFileError, match=r"control request \S+ is a FIFO, not a regular file"):
        read_capped(fifo, 1024, "control request")


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda path: os.mkfifo(path), "a FIFO, not a regular file"),
        (lambda path: path.symlink_to(path.name), "a symbolic link, not followed"),  # a loop
        (lambda path: path.symlink_to(path.with_name("real")), "a symbolic link, not followed"),
        (lambda path: path.mkdir(), "a directory, not a regular file"),
    ],
)
def test_a_log_that_is_no_regular_file_has_no_lines_and_says_why(
    tmp_path: Path, make: Callable[[Path], Any], problem: str
) -> None:
    (tmp_path / "real").write_text('{"step": 1}\n')
    path = tmp_path / "log"
    make(path)
    refused: list[str] = []
    lines = CappedLines(path, 100, "log", refused=refused.append)
    assert list(lines) == [] and refused == [problem] and lines.offset == 0
    with pytest.raises(DamagedFileError, match=re.escape(f"log {path} is {problem}")):
        read_json_capped(path, 100, "log")


def test_an_unfinished_line_already_over_the_cap_is_said_at_once(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"one\n" + b"x" * 11)
    told: list[tuple[int, str]] = []
    reader = CappedLines(path, 10, "log", oversized=lambda number, why: told.append((number, why)))
    assert list(reader) == [b"one"] and reader.offset == 4  # the line is still left for later readers
    assert told == [(2, "unfinished, and already over the cap of 10 bytes")]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ('{"a": "[[[[[[[[", "b": [[[1]]]}', {"a": "[[[[[[[[", "b": [[[1]]]}),  # brackets in strings do not nest
        ('["\\\\", "\\"[[[[", ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "]", None),  # escapes
        ("[" * MAX_DEPTH + "]" * MAX_DEPTH, None),  # as deep as allowed
        (" " * 70_000 + "[1]", [1]),  # blanks before a large document
    ],
)
def test_json_as_deep_as_allowed_is_read(text: str, parsed: Any) -> None:
    assert parse_json(text.encode()) == (json.loads(text) if parsed is None else parsed)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"[" * 100_000 + b"]" * 100_000, f"nested more than {MAX_DEPTH} levels deep"),
        (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), f"nested more than {MAX_DEPTH} levels deep"),
        (b'{"a": "\\\\"' + b", [" * 100 + b"]" * 100 + b"}", f"nested more than {MAX_DEPTH} levels deep"),
        (b"\0" * 100_000, "it starts with b'\\x00', which no JSON document does"),
    ],
)
def test_json_too_deep_or_not_starting_as_json_is_refused_before_it_is_parsed(data: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_json(data)
