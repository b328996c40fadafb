"""The end of each failed member's output, under the member table: its traceback's last lines.

The table's "last error" is the exception's message; where it came from is in the member's own
output, which its failed attempt ended with (see :mod:`resilient_flows.training._output`). A view
shows the last :data:`TAIL_LINES` lines of it per failed member, each on its own line cut at the
view's width (whole in ``summary.txt``), and the command that prints the whole of it. Only the
end of each file is read (:data:`~resilient_flows.rundir.TAIL_CAP` bytes): logs may be huge.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from resilient_flows.rundir import attempt_logs, failure_tail, member_layout
from resilient_flows.workflow._status import MemberStatus

#: Lines of a failed member's output shown under the table.
TAIL_LINES = 5
#: Failed members whose output's end is shown; the others are named.
TAILS_SHOWN = 10


@dataclass(frozen=True)
class OutputTail:
    """The last ``lines`` of ``path``, the output of ``member``'s attempt ``attempt``."""

    member: str
    attempt: int
    path: Path
    lines: list[str]


def logs_command(run_dir: str | os.PathLike, member: str) -> str:
    return shlex.join(["resilient-flows", "logs", str(run_dir), member])


def failed_tails(
    run_dir: str | os.PathLike, statuses: Iterable[MemberStatus], lines: int = TAIL_LINES
) -> list[OutputTail]:
    """The end of the latest attempt's output of each member that failed (for good), in order;
    a member whose output cannot be read (none, or damaged) has none."""
    tails = []
    for status in statuses:
        if status.state != "failed":
            continue
        logs = attempt_logs(member_layout(run_dir, status.name))
        if not logs:
            continue
        attempt = max(logs)
        try:
            found = failure_tail(logs[attempt], lines)
        except (OSError, ValueError):  # removed since, or damaged: the table still names the error
            continue
        if found is not None:
            tails.append(OutputTail(status.name, attempt, found[0], found[1]))
    return tails


class OutputTails:
    """The tails under the table: per member a line naming its attempt's log, its last lines
    (indented; cut at the console's width with ``cut``), and the command that prints all of it.
    That command is there to be copied: it is one line, never cut nor broken, wider than the
    console if it must be (the terminal wraps it softly and copies it whole), so print the tails
    with ``crop=False``."""

    def __init__(self, run_dir: str | os.PathLike, tails: list[OutputTail], cut: bool = True) -> None:
        self.run_dir, self.tails, self.cut = run_dir, tails, cut

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for tail in self.tails[:TAILS_SHOWN]:
            where = os.path.relpath(tail.path, self.run_dir)
            yield Text(f"{tail.member} failed; the end of attempt {tail.attempt}'s output ({where}):")
            for line in tail.lines:
                yield Text(f"  {line}", no_wrap=self.cut, overflow="ellipsis" if self.cut else "fold")
            yield Text(f"  all of it: {logs_command(self.run_dir, tail.member)}", no_wrap=True, overflow="ignore")
        more = [t.member for t in self.tails[TAILS_SHOWN:]]
        if more:
            yield Text(f"{len(more)} more failed ({', '.join(more)}): {logs_command(self.run_dir, 'MEMBER')}")
