"""Views of large runs: tables and plots grouped by family, a status tracker whose work follows what
changed, and a command line that starts without torch or Parsl."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from resilient_flows.cli import main
from resilient_flows.rundir import _metrics as metrics_module
from resilient_flows.rundir import end_lease, run_layout
from resilient_flows.rundir._metrics import MetricsReader
from resilient_flows.workflow import _status as status_module
from resilient_flows.workflow._blocks import RunnerLock
from resilient_flows.workflow._families import STATES, describe_families, family_of, family_stats
from resilient_flows.workflow._plan import plan_workflow
from resilient_flows.workflow._plots import BEST_DRAWN, LEGEND_FAMILIES, loss_figure, plot_losses
from resilient_flows.workflow._recorded_plan import create_run_dir
from resilient_flows.workflow._report import status_table
from resilient_flows.workflow._status import MemberStatus, StatusTracker
from resilient_flows.workflow.schema import load_workflow

REPO = Path(__file__).resolve().parents[1]

#: A 200-member run: per family, (members, {state: count}).
FAMILIES = {
    "cnn": (150, {"finished": 100, "running": 30, "queued": 10, "retrying": 6, "failed": 4}),
    "mlp": (50, {"finished": 45, "preempted": 3, "failed": 2}),
}


def render(renderable: Any) -> str:
    console = Console(file=io.StringIO(), width=240, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def table_rows(text: str) -> list[list[str]]:
    """The body rows of rendered tables, as lists of stripped cells."""
    return [[c.strip() for c in line.strip("│ ").split("│")] for line in text.splitlines() if line.startswith("│")]


def synthetic_statuses(tmp_path: Path, families: dict[str, tuple[int, dict[str, int]]] = FAMILIES) -> dict:
    """Members whose losses are known: member k of a family has newest loss (k + 1) / 1000 and has
    trained k + 1 of 100 steps; failed and retrying members failed once."""
    statuses = {}
    for family, (count, states) in families.items():
        names = [state for state, n in states.items() for _ in range(n)]
        assert len(names) == count
        for k, state in enumerate(names):
            s = MemberStatus(f"{family}-{k}", 100, state=state, family=family)
            s.metrics = MetricsReader(tmp_path / "none")
            s.metrics.last = {"step": k, "loss": (k + 1) / 1000}
            if state in ("failed", "retrying"):
                s.failures, s.errors = 1, [f"WorkerLost: {s.name}"]
            statuses[s.name] = s
    return statuses


def test_family_of_uses_the_recorded_family_else_the_name() -> None:
    assert family_of("cnn-12") == "cnn"
    assert family_of("cnn-12.c1.c3") == "cnn"  # a clone of a clone of cnn-12
    assert family_of("solo") == "solo" and family_of("run2") == "run2"
    assert family_of("pbt-3.c1", "pbt") == "pbt" and family_of("x-1", "grid") == "grid"


def test_family_stats_count_states_steps_and_losses_exactly(tmp_path: Path) -> None:
    assert set(STATES) == {"planned", *status_module._STATE_AFTER.values()}  # every state has its column
    cnn, mlp = family_stats(synthetic_statuses(tmp_path).values())
    assert (cnn.family, cnn.members, mlp.family, mlp.members) == ("cnn", 150, "mlp", 50)
    assert {k: v for k, v in cnn.states.items() if v} == FAMILIES["cnn"][1]
    assert {k: v for k, v in mlp.states.items() if v} == FAMILIES["mlp"][1]
    assert (cnn.steps_done, cnn.steps_total) == (sum(range(1, 151)), 15000)
    assert (mlp.steps_done, mlp.steps_total) == (sum(range(1, 51)), 5000)
    assert cnn.best_loss == 0.001 and cnn.median_loss == pytest.approx(0.0755)  # median of 1..150, /1000
    assert mlp.best_loss == 0.001 and mlp.median_loss == pytest.approx(0.0255)
    assert (cnn.failures, mlp.failures) == (10, 2)


def test_the_grouped_table_has_a_row_per_family_the_best_and_the_troubled(tmp_path: Path) -> None:
    text = render(status_table(synthetic_statuses(tmp_path), "big run"))
    rows = table_rows(text)
    header = next(line for line in text.splitlines() if "family" in line)
    columns = [c.strip() for c in header.strip("┃ ").split("┃")]
    assert columns == [
        "family",
        "members",
        "queued",
        "running",
        "retrying",
        "preempted",
        "failed",
        "finished",
        "steps",
        "best loss",
        "median loss",
        "failures",
    ]
    assert rows[0] == ["cnn", "150", "10", "30", "6", "0", "4", "100", "11325/15000", "0.001", "0.0755", "10"]
    assert rows[1] == ["mlp", "50", "0", "0", "0", "3", "2", "45", "1275/5000", "0.001", "0.0255", "2"]
    best = [row[0] for row in rows[2:7]]
    assert best == ["cnn-0", "mlp-0", "cnn-1", "mlp-1", "cnn-2"]  # lowest loss first, ties by name
    troubled = rows[7:]
    expected = [f"cnn-{k}" for k in range(140, 150)] + ["mlp-48", "mlp-49"]
    assert [row[0] for row in troubled] == expected
    assert troubled[0][1] == "retrying" and troubled[-1][1] == "failed" and troubled[-1][-1] == "WorkerLost: mlp-49"
    assert "12 member(s) failed or retrying" in text and "best 5 members" in text


def test_twenty_members_or_fewer_keep_a_row_per_member(tmp_path: Path) -> None:
    statuses = synthetic_statuses(tmp_path, {"a": (20, {"running": 20})})
    rows = table_rows(render(status_table(statuses, "small")))
    assert [row[0] for row in rows] == [f"a-{k}" for k in range(20)]
    big = synthetic_statuses(tmp_path, {"a": (21, {"running": 21})})
    assert len(table_rows(render(status_table(big, "big", all_members=True)))) == 21
    assert table_rows(render(status_table(big, "big")))[0][:3] == ["a", "21", "21"]


def write_curves(tmp_path: Path, statuses: dict[str, MemberStatus], steps: int = 60) -> None:
    """Give each member a metrics file: a decaying loss, lower for later members."""
    for k, s in enumerate(statuses.values()):
        path = tmp_path / "metrics" / f"{s.name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [
            {"step": i, "attempt": 1, "time": 1000.0 + i, "loss": 1.0 / (1 + i) / (1 + k % 7)} for i in range(steps)
        ]
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        s.metrics = MetricsReader(path)
        s.metrics.peek()
        s.since = 1000.0


def test_the_grouped_plot_draws_families_best_members_and_a_timeline(tmp_path: Path) -> None:
    statuses = synthetic_statuses(tmp_path)
    write_curves(tmp_path, statuses)
    statuses["cnn-0"].timeline += [(1010.0, "failed"), (1012.0, "resumed"), (1015.0, "lost")]
    statuses["mlp-1"].timeline += [(1020.0, "preempted")]
    figure = loss_figure(statuses, "big run")
    losses, timeline = figure.axes
    entries = [t.get_text() for t in losses.get_legend().get_texts()]
    assert entries[:2] == ["cnn (150)", "mlp (50)"]
    assert len(entries) == 2 + BEST_DRAWN and all(e.startswith("best: ") for e in entries[2:])
    kinds = [t.get_text() for t in timeline.get_legend().get_texts()]
    assert kinds == ["failed (1)", "lost (1)", "preempted (1)", "resumed (1)"]
    plot_losses(statuses, tmp_path / "report" / "loss.png", "big run")
    assert (tmp_path / "report" / "loss.png").stat().st_size > 10_000


def test_the_plot_legend_stays_bounded_with_many_families(tmp_path: Path) -> None:
    families = {f"f{i}": (3, {"running": 3}) for i in range(30)}
    statuses = synthetic_statuses(tmp_path, families)
    write_curves(tmp_path, statuses)
    entries = [t.get_text() for t in loss_figure(statuses, "many").axes[0].get_legend().get_texts()]
    assert len(entries) == LEGEND_FAMILIES + 1 + BEST_DRAWN
    assert entries[LEGEND_FAMILIES] == f"+ {30 - LEGEND_FAMILIES} more families"


def test_validate_summarises_members_per_family(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text(
        "name: big\nmembers:\n"
        "  - {name: cnn, workload: cnn-digits, steps: 10, count: 200}\n"
        "  - {name: pair, workload: mlp-digits, steps: 10, seeds: [3, 4]}\n"
        "  - {name: solo, workload: mlp-digits, steps: 10}\n"
    )
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{path}: valid; 203 member(s) on site local",
        "  cnn: 200 members (cnn-0 .. cnn-199)",
        "  pair: 2 members (pair-0, pair-1)",
        "  solo: 1 member",
    ]
    assert describe_families([("x-0", ""), ("x-1", ""), ("x-1.c1", ""), ("y", "")]) == [
        "x: 3 members (x-0 .. x-1.c1)",
        "y: 1 member",
    ]


# ---------------------------------------------------------------------- run directories from files


def make_run(tmp_path: Path, count: int, running: int) -> tuple[Path, list[tuple[str, int]]]:
    """A run of ``count`` members of 50 steps: the first ``running`` ones at step 9, the rest finished."""
    source = tmp_path / "wf.yaml"
    source.write_text(f"name: r\nmembers:\n  - {{name: m, workload: mlp-digits, steps: 50, count: {count}}}\n")
    plan = plan_workflow(load_workflow(source), build_site=False)
    run_dir = create_run_dir(tmp_path / "run", plan, source.read_text())
    events = []
    for k, spec in enumerate(plan.members):
        last = 9 if k < running else 49
        events += [{"time": 1.0, "kind": "submitted", "member": spec.name}, started(spec.name)]
        metrics = [{"step": i, "attempt": 1, "time": 2.0 + i, "loss": 1.0 / (1 + i + k)} for i in range(last + 1)]
        (run_dir / "members" / spec.name / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
        if k >= running:
            result = {"member": spec.name, "step": 49, "loss": metrics[-1]["loss"], "test_accuracy": 0.9}
            (run_dir / "members" / spec.name / "result.json").write_text(json.dumps(result))
            events.append({"time": 60.0, "kind": "finished", "member": spec.name, "step": 49})
    append(run_dir, events)
    return run_dir, [(m.name, m.steps) for m in plan.members]


def started(name: str) -> dict[str, Any]:
    return {"time": 2.0, "kind": "started", "member": name, "attempt": 1}


def append(run_dir: Path, events: list[dict[str, Any]], name: str = "events.jsonl") -> None:
    with (run_dir / name).open("a") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)


def test_status_groups_above_twenty_members_and_all_lists_every_one(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir, members = make_run(tmp_path, 25, running=3)
    assert main(["status", str(run_dir)]) == 1  # three members still run
    rows = table_rows(capsys.readouterr().out)
    assert rows[0] == ["m", "25", "3", "22", "1130/1250", "0.01351", "0.01613", "0"]  # 1/74, 1/62
    assert [row[0] for row in rows[1:]] == ["m-24", "m-23", "m-22", "m-21", "m-20"]
    assert main(["status", "--all", str(run_dir)]) == 1
    rows = table_rows(capsys.readouterr().out)
    assert [row[0] for row in rows] == [name for name, _ in members]
    assert rows[0][:3] == ["m-0", "running", "10/50"] and rows[-1][:3] == ["m-24", "finished", "50/50"]


def test_status_of_a_run_whose_runner_died_says_its_running_members_are_not(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir, _ = make_run(tmp_path, 3, running=1)
    assert main(["status", str(run_dir)]) == 1
    err = " ".join(capsys.readouterr().err.split())  # no runner ever held it: how to start one
    unheld = "members shown queued, running or retrying are not"
    assert f"no runner holds this run: {unheld}; resilient-flows resume {run_dir} continues it" in err
    pid = dead_pid()
    record = {"pid": pid, "host": socket.gethostname(), "started": 1, "orphan_timeout_s": 60}
    run_layout(run_dir).write_lease(record)  # a runner that died without letting go of the run
    assert main(["status", str(run_dir)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    host = socket.gethostname()
    assert (
        f"the run's runner (process {pid} on {host}) is gone: members shown queued, running or retrying are not" in err
    )
    assert f"resilient-flows resume {run_dir} continues it" in err


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(dead.stdout)


def test_status_of_a_run_whose_runner_died_never_denies_members_that_still_beat(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir, _ = make_run(tmp_path, 3, running=2)
    pid, host = dead_pid(), socket.gethostname()
    run_layout(run_dir).write_lease({"pid": pid, "host": host, "started": 1, "orphan_timeout_s": 300})
    beats = run_layout(run_dir).heartbeats
    beats.mkdir()
    (beats / "m-0").write_text("{}")  # m-0 beats; m-1's beat is a minute old
    (beats / "m-1").write_text("{}")
    os.utime(beats / "m-1", (time.time() - 60, time.time() - 60))
    os.symlink(beats / "m-0", beats / "m-2")  # a link is not a heartbeat
    assert main(["status", str(run_dir)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"the run's runner (process {pid} on {host}) is gone; member m-0 still train" in err
    assert "will commit a checkpoint and stop within about" in err and "are not" not in err
    assert f"resilient-flows resume {run_dir} takes them over now where it can, or continues the run once" in err
    assert main(["status", "--json", str(run_dir)]) == 1
    runner = json.loads(capsys.readouterr().out)["runner"]
    assert runner["state"] == "gone" and runner["beating"] == ["m-0"]
    assert (runner["pid"], runner["host"], runner["orphan_timeout_s"]) == (pid, host, 300.0)


def test_status_says_how_to_resume_a_stopped_run_whatever_its_members_states(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=1)
    append(run_dir, [{"time": 30.0, "kind": "preempted", "member": "m-0", "attempt": 1, "step": 9}])
    RunnerLock(run_dir).acquire()
    assert main(["status", "--json", str(run_dir)]) == 1
    assert json.loads(capsys.readouterr().out)["runner"]["state"] == "holding"
    assert "resume" not in capsys.readouterr().err  # held: nothing to do
    end_lease(run_dir)  # the runner stopped its members (the orphan stop, Ctrl-C) and ended
    assert main(["status", str(run_dir)]) == 1
    captured = capsys.readouterr()
    assert table_rows(captured.out)[0][:2] == ["m-0", "preempted"]
    err = " ".join(captured.err.split())
    resume = f"resilient-flows resume {run_dir} continues it"
    assert f"no runner holds this run (its runner ended); {resume}" in err  # m-0 is shown preempted
    append(run_dir, [{"time": 90.0, "kind": "finished", "member": "m-0", "step": 49}])
    (run_dir / "members" / "m-0" / "result.json").write_text(json.dumps({"member": "m-0", "step": 49}))
    assert main(["status", str(run_dir)]) == 0
    assert "resume" not in capsys.readouterr().err  # done: nothing to continue


class Opens:
    """Counts files opened, by name: through pathlib and ``io.open``, and the files capped reads
    look at (``os.lstat``: they look before they open, and open what is there without blocking on
    a FIFO), not twice for a descriptor wrapped."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: list[str] = []
        real_io, real_lstat = io.open, os.lstat

        def counting_io(file: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(file, int):
                self.names.append(Path(file).name)
            return real_io(file, *args, **kwargs)

        def counting_lstat(file: Any, *args: Any, **kwargs: Any) -> Any:
            self.names.append(Path(file).name)
            return real_lstat(file, *args, **kwargs)

        monkeypatch.setattr(io, "open", counting_io)
        monkeypatch.setattr(os, "lstat", counting_lstat)

    def take(self) -> dict[str, int]:
        counts = {name: self.names.count(name) for name in sorted(set(self.names))}
        self.names.clear()
        return counts


@pytest.mark.parametrize("count", [60, 240])
def test_a_tracker_update_reads_what_changed_not_every_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    run_dir, members = make_run(tmp_path, count, running=5)
    tracker = StatusTracker(run_dir)
    opens = Opens(monkeypatch)
    first = tracker.update(members)
    assert opens.take() == {"events.jsonl": 1, "metrics.jsonl": count, "result.json": count}
    assert sum(s.state == "finished" for s in first.values()) == count - 5
    # nothing appended: the events file and the five running members' metrics, whatever the count
    assert tracker.update(members)["m-0"].step == 9
    assert opens.take() == {"events.jsonl": 1, "metrics.jsonl": 5}
    # m-0 logs a step, m-1 finishes, a finished member gets an event (analytics read its checkpoint)
    append(run_dir / "members" / "m-0", [{"step": 10, "attempt": 1, "time": 12.0, "loss": 0.5}], "metrics.jsonl")
    (run_dir / "members" / "m-1" / "result.json").write_text(json.dumps({"step": 9, "loss": 0.1}))
    last = members[-1][0]
    append(
        run_dir, [{"time": 70.0, "kind": "finished", "member": "m-1"}, {"time": 71.0, "kind": "tuned", "member": last}]
    )
    opens.take()  # the writes above
    statuses = tracker.update(members)
    assert opens.take() == {"events.jsonl": 1, "metrics.jsonl": 6, "result.json": 1}
    assert (statuses["m-0"].step, statuses["m-1"].state, statuses["m-1"].result) == (
        10,
        "finished",
        {"step": 9, "loss": 0.1},
    )
    assert tracker.update(members) and opens.take() == {"events.jsonl": 1, "metrics.jsonl": 4}


def test_a_retiring_member_is_watched_until_its_result_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, members = make_run(tmp_path, 3, running=1)
    tracker = StatusTracker(run_dir)
    tracker.update(members)
    append(run_dir, [{"time": 9.0, "kind": "retired", "member": "m-0", "step": 9, "reason": "pbt"}])
    opens = Opens(monkeypatch)  # a retiring member writes its result after the event
    for _ in range(2):
        assert tracker.update(members)["m-0"].state == "retired"
        assert opens.take() == {"events.jsonl": 1, "metrics.jsonl": 1, "result.json": 1}
    (run_dir / "members" / "m-0" / "result.json").write_text(json.dumps({"step": 9, "retired": "pbt"}))
    opens.take()
    assert tracker.update(members)["m-0"].result == {"step": 9, "retired": "pbt"}
    assert opens.take() == {"events.jsonl": 1, "metrics.jsonl": 1, "result.json": 1}
    assert tracker.update(members)["m-0"].state == "retired" and opens.take() == {"events.jsonl": 1}


def test_a_followed_member_is_read_at_its_ends_and_curves_on_demand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, members = make_run(tmp_path, 3, running=1)
    parsed = []
    real_loads = metrics_module.json.loads
    monkeypatch.setattr(metrics_module.json, "loads", lambda raw: parsed.append(raw) or real_loads(raw))
    followed = StatusTracker(run_dir).update(members)
    m0 = followed["m-0"].metrics
    assert (followed["m-0"].step, m0.attempt_spans, m0.attempt_times) == (9, {1: (0, 9)}, {1: (2.0, 11.0)})
    lines = [raw for raw in parsed if isinstance(raw, bytes) and b'"attempt"' in raw and b'"loss"' in raw]
    assert m0.curve == {} and len(lines) == 2 + 2  # m-0's first and last lines, m-1's and m-2's newest
    assert followed["m-1"].metrics.curve == {} and followed["m-1"].step == 49  # finished: its newest line only
    assert len(followed["m-1"].history().curve) == 50
    once = status_module.member_statuses(run_dir, members)
    assert once["m-0"].metrics.curve == {} and once["m-0"].step == 9


def test_a_chunk_that_spans_two_attempts_is_read_whole_and_later_attempts_replace_the_curve(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    first = [{"step": i, "attempt": 1, "time": 10.0 + i, "loss": 1.0} for i in range(6)]
    second = [{"step": i, "attempt": 2, "time": 30.0 + i, "loss": 2.0} for i in range(4, 9)]
    path.write_text("".join(json.dumps(r) + "\n" for r in first[:3]))
    reader = MetricsReader(path)
    reader.update()
    with path.open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in first[3:] + second) + '{"step": 9, "att')  # cut short
    reader.update()
    assert reader.attempt_spans == {1: (0, 5), 2: (4, 8)}
    assert reader.attempt_times == {1: (10.0, 15.0), 2: (34.0, 38.0)}
    assert reader.last == second[-1] and reader.curve == {}
    reader.read_curve()
    assert reader.curve == {**dict.fromkeys(range(4), 1.0), **dict.fromkeys(range(4, 9), 2.0)}
    assert reader.last == second[-1]


def test_a_sampled_curve_spreads_over_the_file_and_ends_at_its_newest_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": i, "attempt": 1, "loss": i / 10}) + "\n" for i in range(1001)))
    curve = MetricsReader(path).sampled_curve(100)
    assert sorted(curve) == [*range(0, 1001, 10)]
    assert curve[1000] == 100.0


def test_a_status_table_of_a_dead_runner_s_run_matches_the_files(tmp_path: Path) -> None:
    run_dir, members = make_run(tmp_path, 4, running=2)
    append(run_dir, [{"time": 5.0, "kind": "failed", "member": "m-1", "error": "WorkerLost: x", "cause": "lost"}])
    statuses = status_module.member_statuses(run_dir, members)
    assert [(s.state, s.step, s.failures) for s in statuses.values()] == [
        ("running", 9, 0),
        ("failed", 9, 1),
        ("finished", 49, 0),
        ("finished", 49, 0),
    ]
    assert statuses["m-1"].timeline == [(5.0, "failed")] and statuses["m-0"].since == 1.0


# ---------------------------------------------------------------------- start-up


def imported_by(args: list[str]) -> list[str]:
    """Which of torch and Parsl the command line imports to run ``args``, in a fresh interpreter."""
    probe = (
        "import sys\nfrom resilient_flows.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print('IMPORTED', *(m for m in ('torch', 'parsl') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env, cwd=REPO)
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("IMPORTED")]
    return line.split()[1:]


def test_the_runner_imports_parsl_but_not_torch() -> None:
    """Members import torch in their workers; the runner, which polls all of them, need not."""
    probe = (
        "import sys, resilient_flows.workflow._runner\n"
        "from resilient_flows.training._members import newest_committed\n"
        "newest_committed([])\n"  # what the retry handler asks after a failure
        "print(*(m for m in ('torch', 'parsl') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.split() == ["parsl"]


def test_help_and_status_import_neither_torch_nor_parsl_and_validate_only_parsl(tmp_path: Path) -> None:
    """``validate`` builds the site's Parsl configuration, as ``run`` does, to check it."""
    run_dir, _ = make_run(tmp_path, 3, running=1)
    assert imported_by(["--help"]) == []
    assert imported_by(["validate", str(REPO / "workflows" / "quickstart.yaml")]) == ["parsl"]
    assert imported_by(["status", str(run_dir)]) == []


def test_the_package_imports_its_names_on_first_use() -> None:
    probe = (
        "import sys, resilient_flows as rf\n"
        "assert 'torch' not in sys.modules and 'parsl' not in sys.modules, 'imported eagerly'\n"
        "from resilient_flows import WorkflowError, Checkpointer, load_site\n"
        "assert Checkpointer.__module__.startswith('resilient_flows.checkpoint')\n"
        "missing = [n for n in rf.__all__ if getattr(rf, n, None) is None]\n"
        "assert not missing, missing\n"
        "assert set(rf.__all__) <= set(dir(rf))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
