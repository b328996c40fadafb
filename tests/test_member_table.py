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
import struct
import subprocess
import termios
from pathlib import Path

import pytest
from rich.console import Console
from test_lease import CLI
from test_views import append, make_run

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


def status_in_a_pty(run_dir: Path, columns: int) -> str:
    """``resilient-flows status RUN`` on a pty of ``columns`` columns (no COLUMNS variable: the
    width is the terminal's), what it wrote without its colours."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    process = subprocess.Popen([CLI, "status", run_dir], stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    output = bytearray()
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the command ended and closed its side
            break
        if not data:
            break
        output += data
    os.close(master)
    process.wait(timeout=60)
    return ANSI.sub(b"", bytes(output)).decode()


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
