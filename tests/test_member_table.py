"""The member table at any width: every member's name whole, the columns a user looks for first,
the last error as a column where it fits and on a line of its own where it does not, never a
line wider than the terminal; ``summary.txt`` never cut. Rendered by Rich at each width, and by
``resilient-flows status`` in a real pty."""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import select
import shlex
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest
from conftest import REPO
from rich.console import Console
from test_lease import CLI
from test_views import append, make_run

from resilient_flows.cli import main
from resilient_flows.cli._console import PIPE_WIDTH
from resilient_flows.workflow._report import status_table, write_report
from resilient_flows.workflow._status import MemberStatus

LONG_NAMES = [f"mlp-digits-lr0.0{i}-wide-hidden-seed{i}" for i in range(3)]
FAILED = "cnn-digits-hidden128-dropout0.25-seed7"
ERROR = "BashExitFailure: bash_app mpi_train_app failed with unix exit code 9 " + "x" * 150
WIDTHS = [80, 100, 120, 200]


def statuses() -> dict[str, MemberStatus]:
    found = {n: MemberStatus(n, 300, state="finished", checkpoint=299, attempts=1) for n in LONG_NAMES}
    found[FAILED] = MemberStatus(FAILED, 300, state="failed", checkpoint=99, attempts=3, failures=3, errors=[ERROR])
    return found


def render(width: int, **kwargs: bool) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(status_table(statuses(), "run (34 s)", **kwargs))
    return console.file.getvalue()


def header(text: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith("┃"))
    return [cell.strip() for cell in line.strip("┃").split("┃")]


@pytest.mark.parametrize("width", WIDTHS)
def test_every_name_is_whole_and_no_line_is_wider_than_the_terminal(width: int) -> None:
    text = render(width)
    assert max(len(line) for line in text.splitlines()) <= width
    rows = [line for line in text.splitlines() if line.startswith("│")]
    assert [row.strip("│ ").split("│")[0].strip() for row in rows] == [*LONG_NAMES, FAILED]
    assert header(text)[:5] == ["member", "state", "step", "loss", "checkpoint"]
    error_lines = [line for line in text.splitlines() if line.startswith(f"{FAILED}: ")]
    if width < 200:  # too long for a column beside the five first: on a line of its own
        assert header(text)[-1] != "last error" and len(error_lines) == 1
        assert error_lines[0].startswith(f"{FAILED}: BashExitFailure: bash_app")
    else:  # its first 100 characters fit a column
        assert header(text)[-1] == "last error" and error_lines == []
        assert ERROR[:99] + "…" in text


def test_columns_are_dropped_from_the_last_as_the_width_shrinks() -> None:
    every = ["member", "state", "step", "loss", "checkpoint", "attempts", "failures", "preempted", "test acc."]
    assert header(render(80)) == every[:5]
    assert header(render(100)) == every[:6]
    assert header(render(120)) == every[:8]
    assert header(render(200)) == [*every[:6], "last error"]  # the others give way to the error
    assert header(render(300)) == [*every, "last error"]
    narrow = render(60)  # a split pane: the name, whole, and what fits
    assert header(narrow) == every[:3] and FAILED in narrow


def test_a_short_error_is_a_column_while_it_fits_whole() -> None:
    short = statuses()
    short[FAILED].errors = ["WorkerLost: pool 3 exited"]
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(status_table(short, "run"))
    text = console.file.getvalue()
    assert header(text)[-1] == "last error" and "WorkerLost: pool 3 exited │" in text
    assert not any(line.startswith(f"{FAILED}: ") for line in text.splitlines())


def test_the_summary_file_cuts_nothing(tmp_path: Path) -> None:
    summary = tmp_path / "report" / "summary.txt"
    write_report(statuses(), summary, tmp_path / "report" / "loss.png", "run")
    text = summary.read_text()
    assert ERROR in text and all(name in text for name in [*LONG_NAMES, FAILED])
    assert header(text)[-1] == "last error" and "…" not in text


ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\r")


def in_a_pty(argv: list[str], columns: int, timeout: float = 300.0) -> tuple[int, bytes]:
    """Run ``argv`` on a pty of ``columns`` columns (no COLUMNS variable: the width is the
    terminal's; a TERM that draws live views); its exit status and everything it wrote. One still
    writing after ``timeout`` seconds is interrupted (as Ctrl-C would) and fails the test."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color"}  # without COLUMNS and LINES: conftest.py takes them out
    process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    output = bytearray()
    deadline = time.monotonic() + timeout
    while select.select([master], [], [], max(0.0, deadline - time.monotonic()))[0]:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the command ended and closed its side
            data = b""
        if not data:
            os.close(master)
            return process.wait(timeout=60), bytes(output)
        output += data
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    os.close(master)
    raise AssertionError(f"{argv[1]} did not end within {timeout:g} s; its last output: {bytes(output[-3000:])!r}")


def status_in_a_pty(run_dir: Path, columns: int) -> str:
    """``resilient-flows status RUN`` on a pty, what it wrote without its colours."""
    return ANSI.sub(b"", in_a_pty([CLI, "status", str(run_dir)], columns)[1]).decode()


@pytest.mark.parametrize("columns", WIDTHS)
def test_status_in_a_terminal_shows_every_name_and_the_error(tmp_path: Path, columns: int) -> None:
    run_dir, members = make_run(tmp_path, 3, running=0)
    failed = members[0][0]
    cause = "RuntimeError: the loss became NaN at step 12 after the learning rate warm-up ended " + "y" * 60
    append(run_dir, [{"time": 61.0, "kind": "failed", "member": failed, "attempt": 1, "error": cause}])
    text = status_in_a_pty(run_dir, columns)
    assert max(len(line) for line in text.splitlines()) <= columns, text
    assert all(re.search(rf"│ {re.escape(name)} +│", text) for name, _ in members), text
    shown = json.dumps(text)
    assert "RuntimeError: the loss became NaN at step 12" in text, shown


@pytest.mark.parametrize("columns", [None, "60", "80"])
def test_status_piped_keeps_its_lines_whole_or_fits_the_columns_the_user_set(
    tmp_path: Path, columns: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A pipe (``status RUN | less``) gets the whole table, unless ``COLUMNS`` says how wide."""
    run_dir, members = make_run(tmp_path, 3, running=0)
    if columns is not None:  # otherwise none: conftest.py takes it out
        monkeypatch.setenv("COLUMNS", columns)
    assert main(["status", str(run_dir)]) == 0
    text = capsys.readouterr().out
    widest = max(len(line) for line in text.splitlines())
    assert widest <= (int(columns) if columns else PIPE_WIDTH), text
    assert all(re.search(rf"│ {re.escape(name)} +│", text) for name, _ in members), text
    if columns is None:  # no column dropped
        assert "checkpoint" in text and "attempts" in text, text


# ------------------------------------------------------------------------ `run` in a terminal

#: Command members with long names, one failing with a long message: the live table, the
#: final one, the error's line and the end of the member's output must all fit.
RUN_MEMBERS = {f"command-member-with-a-long-name-lr0.05-seed{k}": "finished" for k in range(2)}
RUN_FAILED = "command-member-that-fails-with-a-long-name-seed2"
RUN_CAUSE = "RuntimeError: the loss became NaN at step 12 after the learning rate warm-up ended " + "y" * 60
RUN_WORKFLOW = "\n".join(
    [
        "name: narrow",
        "retries: 0",
        "members:",
        *(f"  - {{name: {name}, steps: 1, command: [sh, -c, 'echo training; sleep 1']}}" for name in RUN_MEMBERS),
        f"  - {{name: {RUN_FAILED}, steps: 1, command: [sh, -c, 'echo \"{RUN_CAUSE}\" >&2; exit 3']}}\n",
    ]
)
SGR = re.compile(rb"\x1b\[[0-9;]*m")
MOVES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\r")


def screen_lines(output: bytes) -> list[str]:
    """Every line the command drew, colours removed: a cursor movement (the live view redrawing
    itself) ends a line as a newline does."""
    return MOVES.sub(b"\n", SGR.sub(b"", output)).decode().split("\n")


@pytest.mark.slow
@pytest.mark.parametrize("columns", [80, 200])
def test_run_in_a_terminal_draws_nothing_wider_than_it(tmp_path: Path, columns: int) -> None:
    """``resilient-flows run`` on the local site in a real pty: its live table while the members
    run, the final table, the failed member's error and output's end fit the width, every name
    whole; only the commands to copy are whole lines, wider if they must be (the terminal wraps them)."""
    site = tmp_path / "site.yaml"  # the local site; no pools preloaded with torch for command members
    site.write_text(
        (REPO / "site-configs/local.yaml")
        .read_text()
        .replace("warm_workers: true", "warm_workers: false")
        .replace("standby_pool: true", "standby_pool: false")
    )
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(RUN_WORKFLOW)
    run_dir = tmp_path / "run"
    argv = [CLI, "run", str(workflow), "--site", str(site), "--run-dir", str(run_dir)]
    returncode, output = in_a_pty(argv, columns)
    lines = screen_lines(output)
    shown = json.dumps(lines)
    assert returncode == 1, shown  # a member failed
    commands = [
        f"  {what}: {shlex.join(['resilient-flows', 'logs', str(run_dir), RUN_FAILED])}"
        for what in ("all of it", "its output")
    ]
    assert all(command in lines for command in commands), shown
    assert max(len(line) for line in lines if line not in commands) <= columns, shown
    assert any(re.fullmatch(r" *narrow \(\d+ s\) *", line) for line in lines), shown  # the live table was drawn
    final = lines[max(k for k, line in enumerate(lines) if line.startswith("┏")) :]  # the last table drawn
    states = {**RUN_MEMBERS, RUN_FAILED: "failed"}
    rows = [re.match(r"│ (\S+) +│ (\S+) +│", line) for line in final]
    assert {row[1]: row[2] for row in rows if row is not None} == states, shown
    assert "CommandFailed: command of mem" in "\n".join(final), shown  # the error: a column, or a line of its own
    assert any(line.startswith("  RuntimeError: the loss became NaN at step 12") for line in final), shown
