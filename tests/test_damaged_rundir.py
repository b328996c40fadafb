"""Views of a damaged run directory: every damaged line and file is a warning that names it and a
count in the view (and in its ``--json`` document), never a traceback; ``preempt`` and ``clone``
refuse members that are finished or unknown, and leave nothing behind."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, python_env
from test_views import append, make_run

from resilient_flows.capped import LINE_CAP
from resilient_flows.cli import main
from resilient_flows.rundir import DamageLog, EventTail, MetricsReader, read_events
from resilient_flows.training import MemberSpec, ParentSpec, register_member
from resilient_flows.workflow._status import StatusTracker, member_statuses


def event(kind: str, member: str = "a", **fields: object) -> str:
    return json.dumps({"time": 1.0, "kind": kind, "member": member, **fields}) + "\n"


#: A line over the cap, that would be an event if it were read.
HUGE = json.dumps({"kind": "warning", "pad": "x" * LINE_CAP})

#: An event log whose lines 2 to 6 are damaged, each in another way.
DAMAGED_EVENTS = (
    event("started", attempt=1)
    + '{"time": 2.0, "kind": "failed", "member": "a", "err\x00r": "x"\n'  # 2: a corrupted `failed` line
    + "[1, 2]\n"  # 3: JSON, not an event
    + event("checkpointed")  # 4: no step
    + event("started", attempt="two")  # 5: a number that is not one
    + HUGE
    + "\n"  # 6: over the line cap
    + event("failed", error="WorkerLost: gone")
)


def test_damaged_event_lines_are_recorded_by_number_and_why(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text(DAMAGED_EVENTS)
    damage = DamageLog()
    assert [e["kind"] for e in read_events(tmp_path, damage)] == ["started", "failed"]
    (found,) = damage.found()
    assert sorted(found.lines) == [2, 3, 4, 5, 6]
    assert found.lines[2].startswith("not JSON") and found.lines[3] == "not a JSON object (a list)"
    assert found.lines[4] == "a checkpointed event without step" and found.lines[5] == "its attempt is not a number"
    assert found.lines[6] == f"its {len(HUGE)} bytes are over the cap of {LINE_CAP}"
    assert found.describe(tmp_path) == "5 damaged lines in events.jsonl (lines 2, 3, 4, 5, 6), skipped"
    assert list(read_events(tmp_path)) == list(read_events(tmp_path, DamageLog()))  # the same events either way


def test_a_tail_numbers_the_lines_of_later_updates_and_records_each_once(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(event("submitted") + "{oops\n" + event("started", attempt=1))
    damage = DamageLog()
    tail = EventTail(tmp_path, damage)
    assert len(tail.new()) == 2
    with path.open("a") as f:
        f.write(event("checkpointed", step=3) + "not json either\n" + '{"time": 3.0, "kind": "fin')  # being written
    assert [e["kind"] for e in tail.new()] == ["checkpointed"] and tail.new() == []
    (found,) = damage.found()
    assert sorted(found.lines) == [2, 5]


def test_damaged_metrics_lines_are_numbered_when_followed_and_when_read_from_the_end(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    good = [json.dumps({"step": i, "attempt": 1, "loss": 1.0 / (i + 1)}) + "\n" for i in range(300)]
    path.write_text("".join(good[:100]) + '{"step": "x"}\n' + "".join(good[100:]) + "garbage\n" + '{"loss": 1}\n')
    damage = DamageLog()
    reader = MetricsReader(path, damage)
    reader.peek()  # the end only: the two damaged lines there, numbered by counting the lines before them
    assert reader.last == json.loads(good[-1])
    assert damage.found()[0].lines == {302: "not JSON (Expecting value: line 1 column 1 (char 0))", 303: "no step"}
    reader.read_curve()  # every line: the one in the middle too
    assert sorted(damage.found()[0].lines) == [101, 302, 303] and len(reader.curve) == 300


def test_the_runner_s_tracker_logs_each_damaged_line_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_dir, members = make_run(tmp_path, 2, running=1)
    with (run_dir / "events.jsonl").open("a") as f:
        f.write("{torn by a crash\n")
    tracker = StatusTracker(run_dir)  # no DamageLog given: the runner's, which logs
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            tracker.update(members)
    assert caplog.text.count("skipped line 6: not JSON") == 1  # after 2 x (submitted, started), finished
    assert sorted(tracker.damage.found()[0].lines) == [6]


def damaged_run(tmp_path: Path) -> tuple[Path, list[tuple[str, int]]]:
    """Four members: m-1's `failed` line is corrupted, m-3's result truncated, m-0's newest metrics line damaged."""
    run_dir, members = make_run(tmp_path, 4, running=2)
    append(run_dir, [{"time": 5.0, "kind": "failed", "member": "m-1", "error": "WorkerLost: x", "cause": "lost"}])
    events = (run_dir / "events.jsonl").read_text().splitlines(keepends=True)
    events[-1] = events[-1][:30] + "\x00\n"
    (run_dir / "events.jsonl").write_text("".join(events))
    (run_dir / "members/m-3/result.json").write_text('{"member": "m-3", "st')
    with (run_dir / "members/m-0/metrics.jsonl").open("a") as f:
        f.write('{"step": "ten"}\n')
    return run_dir, members


def test_status_of_a_damaged_run_warns_and_counts_instead_of_failing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir, _ = damaged_run(tmp_path)
    assert main(["status", str(run_dir)]) == 1  # two members still run
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "m-3" in out
    *damage, advice = err.splitlines()
    assert damage == [
        "warning: 1 damaged line in events.jsonl (line 11), skipped",
        "warning: 1 damaged line in members/m-0/metrics.jsonl (line 11), skipped",
        "warning: members/m-3/result.json: not JSON (Unterminated string starting at: line 1 column 19 (char 18)); "
        "ignored",
    ]
    assert advice.startswith("warning: no runner holds this run")


def test_status_json_is_one_versioned_document_with_the_damage(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir, members = damaged_run(tmp_path)
    assert main(["status", "--json", str(run_dir)]) == 1
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert (document["version"], document["workflow"], document["site"], document["done"]) == (1, "r", "local", False)
    assert [m["name"] for m in document["members"]] == [name for name, _ in members]
    m0, m1, _, m3 = document["members"]
    assert (m0["state"], m0["steps_done"], m0["steps"], m0["loss"]) == ("running", 10, 50, 0.1)  # the line before
    assert (m1["failures"], m3["state"], m3["test_accuracy"]) == (0, "finished", None)
    assert [(d["file"], [line["line"] for line in d["lines"]]) for d in document["damage"]] == [
        ("events.jsonl", [11]),
        ("members/m-0/metrics.jsonl", [11]),
        ("members/m-3/result.json", []),
    ]
    assert document["damage"][2]["problem"].startswith("not JSON") and document["stages"] == []
    assert len(err.splitlines()) == 4 and all(line.startswith("warning: ") for line in err.splitlines())


def test_status_json_has_the_stages_rows(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from resilient_flows.workflow import plan_workflow
    from resilient_flows.workflow._recorded_plan import create_run_dir
    from resilient_flows.workflow.schema import load_workflow

    source = tmp_path / "wf.yaml"
    source.write_text(
        "name: st\nstages:\n  - {name: sim, loop: 'resilient_flows.examples.heat:simulate', every: 5}\n"
        "members:\n  - {name: wl, workload: mlp-digits, steps: 5, after: [sim]}\n"
    )
    run_dir = create_run_dir(tmp_path / "run", plan_workflow(load_workflow(source), build_site=False), "")
    (run_dir / "events.jsonl").write_text(
        event("stage_started", "sim", attempt=1, time=1.0)
        + event("stage_started", "sim")  # damaged: no attempt
        + event("stage_finished", "sim", attempt=1, time=4.5)
    )
    assert main(["status", "--json", str(run_dir)]) == 1  # wl has not run
    document = json.loads(capsys.readouterr().out)
    assert document["stages"] == [
        {
            "name": "sim",
            "state": "finished",
            "attempts": 1,
            "failures": 0,
            "checkpoint": None,
            "seconds": 3.5,
            "logs": [],  # this run's stage printed nothing: no attempt of it really ran
            "log": None,
        }
    ]
    assert document["damage"][0]["lines"] == [{"line": 2, "problem": "a stage_started event without attempt"}]
    assert document["members"][0]["state"] == "planned" and document["members"][0]["steps_done"] == 0


def test_lineage_of_a_damaged_run_warns_and_its_json_parses(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir, _ = damaged_run(tmp_path)
    register_member(run_dir, MemberSpec("m-0.c1", "mlp-digits", {}, steps=50, parent=ParentSpec("m-0", "r1")))
    (run_dir / "members/m-0.c1/seed.json").write_text('{"step": 9}')  # no transport: not what a fork writes
    assert main(["lineage", str(run_dir)]) == 0
    out, err = capsys.readouterr()
    assert "m-0.c1" in out and "waiting for its state" in out and "Traceback" not in err
    assert "members/m-0.c1/seed.json: without its step or transport; ignored" in err
    assert main(["lineage", "--json", str(run_dir)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["version"] == 1
    clone = document["members"][-1]
    assert clone["parent"] == {"member": "m-0", "request": "r1", "overrides": {}} and clone["seed"] is None
    assert (clone["state"], clone["steps_done"], document["members"][0]["parent"]) == ("planned", 0, None)
    assert [d["file"] for d in document["damage"]][-1] == "members/m-3/result.json"


def test_a_damaged_plan_is_one_line_and_status_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=1)
    (run_dir / "plan.json").write_text('{"site": "local", "work')
    for command in ("status", "lineage", "preempt"):
        assert main([command, str(run_dir), *(["m-0"] if command == "preempt" else [])]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "plan.json: unreadable (run plan" in err, err


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"name": "m-0.c1", "wor', "not JSON (Unterminated string"),
        ('{"name": "m-0.c1"}', "not a member spec (MemberSpec.__init__() missing 2 required positional arguments"),
    ],
)
def test_a_damaged_clone_spec_leaves_the_clone_out_of_the_views_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture, text: str, problem: str
) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=2)
    assert main(["clone", str(run_dir), "m-0"]) == 0
    (run_dir / "members/m-0.c1/spec.json").write_text(text)
    capsys.readouterr()
    for command in (["status", "--all"], ["lineage"]):
        assert main([*command, str(run_dir)]) == (1 if command[0] == "status" else 0)
        out, err = capsys.readouterr()
        assert "m-0.c1" not in out and "m-1" in out
        assert err.startswith(f"warning: members/m-0.c1/spec.json: {problem}")
        assert err.split("\n")[0].endswith("; ignored")
    assert main(["clone", str(run_dir), "m-0.c1"]) == 2  # acting on it: one line
    assert capsys.readouterr().err.startswith("error: member spec ")


def test_member_statuses_pass_a_damaged_result_over_only_when_asked_to(tmp_path: Path) -> None:
    run_dir, members = make_run(tmp_path, 2, running=1)
    (run_dir / "members/m-1/result.json").write_text("[]")
    damage = DamageLog()
    assert member_statuses(run_dir, members, damage=damage)["m-1"].result is None
    assert damage.found()[0].problem == "not a JSON object (a list)"
    (run_dir / "members/m-1/result.json").write_text('{"step": 49}')  # rewritten whole: repaired
    assert member_statuses(run_dir, members, damage=damage)["m-1"].result == {"step": 49} and not damage


# ---------------------------------------------------------------------- requests to members


def test_preempt_refuses_finished_and_unknown_members_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir, _ = make_run(tmp_path, 3, running=1)  # m-1 and m-2 finished
    assert main(["preempt", str(run_dir), "m-1"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: member 'm-1' has finished: only a running member can be preempted"
    assert main(["preempt", str(run_dir), "nope"]) == 2
    assert "has no member 'nope'; its members: m-0, m-1, m-2" in capsys.readouterr().err
    assert not list(run_dir.glob("members/*/control.json")) and not (run_dir / "members/nope").exists()
    assert main(["preempt", str(run_dir), "m-0"]) == 0
    assert "will commit a checkpoint and stop" in capsys.readouterr().out
    assert json.loads((run_dir / "members/m-0/control.json").read_text())["action"] == "preempt"


def test_preempt_reaches_a_clone_registered_after_planning(tmp_path: Path) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=2)
    assert main(["clone", str(run_dir), "m-0"]) == 0
    assert main(["preempt", str(run_dir), "m-0.c1"]) == 0
    assert (run_dir / "members/m-0.c1/control.json").is_file()


def test_clone_refuses_the_same_members_as_preempt_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir, _ = make_run(tmp_path, 3, running=1)
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    assert main(["clone", str(run_dir), "m-1"]) == 2
    assert capsys.readouterr().err.strip() == "error: member 'm-1' has finished: only a running member can be cloned"
    assert main(["clone", str(run_dir), "nope"]) == 2
    assert "has no member 'nope'; its members: m-0, m-1, m-2" in capsys.readouterr().err
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before


# ---------------------------------------------------------------------- files that are no files

#: Views of one damaged run directory, each to one dict: what it returned (or raised) and what it
#: printed. Views are commands, or what no command reaches cheaply: the lease (as the lease guard
#: reads it), ``resume`` up to where Parsl would start, a checkpoint heartbeat (as the preemption
#: agent reads it), the dashboard's document and details.
VIEW_FUNCTIONS = r"""
import contextlib, io, json, sys
from pathlib import Path

def lease(run):
    from resilient_flows.rundir import holding_runner, read_lease
    return 0 if read_lease(run) is None and holding_runner(run) is None else 1

def heartbeat(run):
    from resilient_flows.checkpoint import read_checkpoint_heartbeat
    try:
        read_checkpoint_heartbeat(Path(run, "members/m-0/checkpoints/checkpoint-heartbeat.json"))
    except ValueError as exc:  # no heartbeat, and why: what the agent logs
        print(exc, file=sys.stderr)
        return 1
    return 0

def resume(run):
    import resilient_flows.workflow._runner as runner
    from resilient_flows.cli import main
    held = runner._run_held
    runner._run_held = lambda *args: 0  # where Parsl would start: the plan, members, results, site and lease are read
    try:
        return main(["resume", run])
    finally:
        runner._run_held = held

def document(run):
    from resilient_flows.workflow.dashboard import RunModel
    model = RunModel(run)
    model.update()
    shown = json.dumps([model.document(), *(model.member(name) for name in model.member_names())])
    for found in model.damage.found():
        print("warning:", found.describe(run), file=sys.stderr)
    return 1 if "secret" in shown else 0

def run_view(view, run):
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if isinstance(view, str):
                code = globals()[view](run)
            else:
                from resilient_flows.cli import main
                code = main(view)
    except (Exception, SystemExit) as exc:  # not the test's own timeout, which must end the test
        code = f"{type(exc).__name__}: {exc}"
    return {"view": view, "code": code, "out": out.getvalue(), "err": err.getvalue()}
"""

#: The views in a process of their own, each with a deadline; then the process's peak memory.
VIEWS_PROCESS = (
    VIEW_FUNCTIONS
    + r"""
import signal

def hung(*_):
    raise TimeoutError("hung")

signal.signal(signal.SIGALRM, hung)
for view in json.loads(sys.argv[1]):
    signal.alarm(30)
    result = run_view(view, sys.argv[2])
    signal.alarm(0)
    print(json.dumps(result), flush=True)
peak = [line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:")]
print(json.dumps({"peak_kib": int(peak[0].split()[1])}), flush=True)
"""
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of two members (m-0 running, m-1 finished) whose m-0 committed steps 2 and 4 (and its
    checkpoint heartbeat), and that no runner holds: every file the views read, written by the
    library's writers."""
    from test_checkpoint_views import save_steps

    base = tmp_path_factory.mktemp("pristine")
    run_dir, _ = make_run(base, 2, running=1)
    save_steps(run_dir / "members/m-0/checkpoints", (2, 4))
    return run_dir


def _damage(run_dir: Path, name: str, kind: str) -> None:
    """Put ``kind`` where the run's file ``name`` is."""
    path = run_dir / name
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)  # a reader that opened it plainly would wait for a writer for good
    elif kind == "link-out":
        outside = run_dir.parent / "outside.json"  # JSON of a kind every reader takes
        outside.write_text('{"secret": "not the run\'s"}\n')
        path.symlink_to(outside)
    elif kind == "link-loop":
        path.symlink_to(path.name)
    elif kind == "sparse":
        path.touch()
        os.truncate(path, 200 << 20)  # 200 MB of zeros, none on disk
    else:
        path.write_text("[" * 100_000 + "]" * 100_000 + "\n")


STATUS, JSON, LINEAGE, REPORT = ["status"], ["status", "--json"], ["lineage"], ["dashboard", "--report"]
LIST, VERIFY, EXPORT = ["checkpoints", "list"], ["checkpoints", "verify"], ["checkpoints", "export"]

#: Each file, and the views that read it.
READERS = {
    "events.jsonl": (STATUS, JSON, LINEAGE, REPORT, "document"),
    "members/m-0/metrics.jsonl": (STATUS, JSON, REPORT, "document"),
    "members/m-1/result.json": (STATUS, JSON, LINEAGE, REPORT, "document", "resume"),
    "members/m-0/spec.json": (STATUS, LINEAGE, REPORT, "document", "resume"),
    "members/m-0/checkpoints/checkpoint-heartbeat.json": (REPORT, "document", "heartbeat"),
    "members/m-0/checkpoints/step-00000004/manifest.json": (LIST, VERIFY, EXPORT, "document"),
    "members/m-0/checkpoints/latest": (LIST,),  # read by no one: a tier is found by its step directories
    "runner.json": (STATUS, JSON, "lease", "resume"),
}


def _argv(view: list[str] | str, run_dir: Path) -> list[str] | str:
    if isinstance(view, str):
        return view
    if view == EXPORT:
        return [*view, str(run_dir), "m-0", "--out", str(run_dir.parent / "out.safetensors")]
    if view == REPORT:
        return ["dashboard", str(run_dir), "--report", str(run_dir.parent / "report")]
    return [*view, str(run_dir)]


def run_views(run_dir: Path, views: list[list[str] | str]) -> list[dict]:
    """What each view did, run in this process (the test's timeout stops a view that hangs)."""
    namespace: dict[str, Any] = {}
    exec(VIEW_FUNCTIONS, namespace)
    return [namespace["run_view"](view, str(run_dir)) for view in views]


def run_views_apart(run_dir: Path, views: list[list[str] | str]) -> tuple[list[dict], int]:
    """What each view did, and the peak memory of the process that ran them all, in bytes."""
    command = [sys.executable, "-c", VIEWS_PROCESS, json.dumps(views), str(run_dir)]
    with tempfile.TemporaryFile() as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=python_env(), cwd=REPO)
        deadline = threading.Timer(240, child.kill)  # each view has 30 s; this is for the process itself
        deadline.start()
        child.wait()
        deadline.cancel()
        out.seek(0)
        lines = out.read().decode().splitlines()
    assert child.returncode == 0, "\n".join(lines)
    # The process's own high-water mark (VmHWM): its rusage would also hold the parent's at the
    # exec of a vfork (a pytest worker of many tests' memory), which the kernel carries over.
    (peak,) = [json.loads(line)["peak_kib"] for line in lines if line.startswith('{"peak_kib"')]
    return [json.loads(line) for line in lines if line.startswith('{"view"')], peak * 1024


@pytest.mark.parametrize("kind", ["fifo", "link-out", "link-loop", "sparse", "nested"])
@pytest.mark.parametrize("name", list(READERS))
def test_a_file_that_is_no_such_file_is_one_warning_in_every_view(
    pristine: Path, tmp_path: Path, name: str, kind: str
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(pristine, run_dir, symlinks=True)
    _damage(run_dir, name, kind)
    views = READERS[name]
    argvs = [_argv(view, run_dir) for view in views]
    # A sparse file's views in a process of their own, whose peak memory says none read it whole;
    # the others here, without a process's start and imports.
    results, peak = run_views_apart(run_dir, argvs) if kind == "sparse" else (run_views(run_dir, argvs), 0)
    assert [r["view"] for r in results] == argvs  # none hung
    for view, result in zip(views, results, strict=True):
        printed = result["out"] + result["err"]
        assert result["code"] in (0, 1, 2), result  # not an exception, nor a view that hung
        assert "Traceback" not in printed and "secret" not in printed, result
        if name.endswith("latest") or view == "lease" or (name.endswith("manifest.json") and view == "document"):
            continue  # nothing reads `latest`; no lease is no runner; a checkpoint's problem is in its row
        if view == "resume" and not name.endswith("spec.json"):
            continue  # a lease that is no lease is taken over, a result that is no result resumed
        if view == JSON:
            assert Path(name).name in json.dumps(json.loads(result["out"])["damage"]), result
            continue
        shown = name.removeprefix("members/m-0/checkpoints/")  # a checkpoint's files: as in its tier
        if view in (LIST, VERIFY):  # the newest checkpoint is invalid: its row and the exit's reason say why
            assert result["code"] == 1 and shown in printed, result
        else:  # one warning, naming the file
            assert len([line for line in result["err"].splitlines() if shown in line]) == 1, result
    if kind == "sparse":
        assert peak < 500 << 20


def test_status_reads_the_event_log_once_and_says_its_damage_once(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=1)
    (run_dir / "events.jsonl").unlink()
    (run_dir / "events.jsonl").mkdir()
    for command in (["status"], ["status", "--json"]):
        assert main([*command, str(run_dir)]) == 1
        damage, advice = capsys.readouterr().err.splitlines()
        assert damage == "warning: events.jsonl: a directory, not a regular file; ignored"
        assert advice.startswith("warning: no runner holds this run")
