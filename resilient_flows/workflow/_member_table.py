"""The member table, laid out for the width it is drawn at.

A table of fixed columns squeezed into an 80-column terminal lets Rich shrink every column at
once: names vanish into "…" and the row says nothing. Here the width decides which columns are
drawn, in an order of what a user looks for first:

- the member's name, whole, then its state, step, loss and newest checkpoint (their headers
  shortened where even they are too wide);
- attempts, failures, preemptions and test accuracy follow while they fit, dropped from the last
  (and in a very narrow terminal the checkpoint, loss, step and state too, in that order);
- the last error is a column while it fits whole beside the columns above (the optional ones
  dropped first); narrower, each error is a line of its own under the table, cut at the width:
  there it keeps more of its text than a squeezed column would, and no column gives way to it.

Drawn without a width limit (``summary.txt``), every column is drawn and no cell is cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from resilient_flows.workflow._status import MemberStatus

#: Characters of a member's last error that a row shows in a terminal: the start of a message
#: says what failed, and its end is in ``status``'s notes, the member's log and the event log.
ERROR_SHOWN = 100
#: What a column of the box costs beside its text: a space each side and its right rule.
_COLUMN_COST = 3


@dataclass(frozen=True)
class _Column:
    header: str
    short: str
    justify: JustifyMethod = "right"


_ALWAYS = (
    _Column("member", "member", "left"),
    _Column("state", "state", "left"),
    _Column("step", "step"),
    _Column("loss", "loss"),
    _Column("checkpoint", "ckpt"),
)
#: Drawn while they fit, in this order.
_OPTIONAL = (
    _Column("attempts", "att."),
    _Column("failures", "fail."),
    _Column("preempted", "pre."),
    _Column("test acc.", "acc."),
)
_EVERY = (*_ALWAYS, *_OPTIONAL)


def format_loss(value: float | None) -> str:
    """A loss as the tables show it: four significant digits, "-" without one."""
    return "-" if value is None else f"{value:.4g}"


def last_error(status: MemberStatus, width: int | None = ERROR_SHOWN) -> str:
    """The member's last error as one line ("-" without one): its first line (a traceback's text
    follows the message), whitespace runs collapsed, cut with "…" at ``width`` characters (never,
    with None)."""
    if not status.errors:
        return "-"
    first = next((line for line in status.errors[-1].splitlines() if line.strip()), "")
    text = " ".join(first.split())
    return text if width is None or len(text) <= width else text[: width - 1].rstrip() + "…"


def _cells(s: MemberStatus) -> list[str]:
    accuracy = None if s.result is None else s.result.get("test_accuracy")
    return [
        s.name,
        s.state,
        "-" if s.step is None else f"{s.step + 1}/{s.steps}",
        format_loss(s.loss),
        "-" if s.checkpoint is None else str(s.checkpoint),
        str(s.attempts),
        str(s.failures),
        str(s.preemptions),
        "-" if accuracy is None else f"{accuracy:.3f}",
    ]


class MemberTable:
    """A row per member; with ``errors``, the last error of each (see the module's docstring).
    ``cut_errors``: errors at most :data:`ERROR_SHOWN` characters (a terminal's view)."""

    def __init__(
        self, statuses: Iterable[MemberStatus], title: str, errors: bool = False, cut_errors: bool = True
    ) -> None:
        self.statuses = list(statuses)
        self.title, self.errors = title, errors
        self._rows = [_cells(s) for s in self.statuses]
        shown = ERROR_SHOWN if cut_errors else None
        self._errors = [last_error(s, shown) for s in self.statuses] if errors else []
        self._cell_widths = [max((len(row[i]) for row in self._rows), default=0) for i in range(len(_EVERY))]
        self._error_width = max([len("last error"), *(len(e) for e in self._errors)]) if errors else 0

    def _width(self, index: int, short: bool = False) -> int:
        column = _EVERY[index]
        return max(len(column.short if short else column.header), self._cell_widths[index])

    def _cost(self, columns: list[int], short: bool = False) -> int:
        return 1 + sum(self._width(i, short) + _COLUMN_COST for i in columns)

    def layout(self, width: int) -> tuple[list[int], bool, int | None]:
        """The columns drawn (indexes into the cells), whether headers are short, and the error
        column's width (None: errors on lines of their own, or none) at ``width`` characters."""
        short = self._cost(list(range(len(_ALWAYS)))) > width
        if self._errors:
            for drawn in range(len(_EVERY), len(_ALWAYS) - 1, -1):
                if self._cost(list(range(drawn)), short) + self._error_width + _COLUMN_COST <= width:
                    return list(range(drawn)), short, self._error_width
        for drawn in range(len(_EVERY), 1, -1):
            if self._cost(list(range(drawn)), short) <= width:
                return list(range(drawn)), short, None
        return [0], short, None

    def table(self, columns: list[int], short: bool, error_width: int | None) -> Table:
        table = Table(title=self.title)
        for index in columns:
            column = _EVERY[index]
            table.add_column(
                column.short if short else column.header,
                justify=column.justify,
                no_wrap=True,
                min_width=self._width(index, short),
            )
        if error_width is not None:
            table.add_column("last error", no_wrap=True, min_width=error_width)
        for number, row in enumerate(self._rows):
            cells = [row[i] for i in columns]
            table.add_row(*cells, *([self._errors[number]] if error_width is not None else []))
        return table

    def below(self) -> Iterator[Text]:
        """Each failed member's error on a line of its own, cut at the console's width."""
        for status, error in zip(self.statuses, self._errors, strict=True):
            if error != "-":
                yield Text(f"{status.name}: {error}", no_wrap=True, overflow="ellipsis")

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        columns, short, error_width = self.layout(options.max_width)
        yield self.table(columns, short, error_width)
        if self._errors and error_width is None:
            yield from self.below()

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        error = self._error_width + _COLUMN_COST if self._errors else 0
        widest = self._cost(list(range(len(_EVERY)))) + error
        return Measurement(self._cost(list(range(len(_ALWAYS))), short=True), widest).clamp(max_width=options.max_width)
