"""While a runner runs, what libraries have to say goes to the run's log, not to the terminal.

Matplotlib, Parsl and torch (in a thread-pool executor's tasks) warn through :mod:`warnings` and
:mod:`logging`. In the terminal such a line lands between the live table's redraws and reads like
a failure of the run, which it seldom is. For as long as :func:`library_output_to_log` holds, every
``warnings.warn`` and every log record of WARNING and above, from any library, is written to the
run's log (``runner.log``) instead; Python would otherwise print them on stderr. This package's own
warnings (its ``resilient_flows.*`` loggers) are written there too and still printed on the run's
console: they say something about the run. Members' errors are not log records: the runner
reports them itself.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.markup import escape

#: The logger whose records are this package's own, shown on the console as well.
PACKAGE_LOGGER = "resilient_flows"


@contextlib.contextmanager
def library_output_to_log(path: Path, console: Console) -> Iterator[None]:
    """Send warnings and WARNING+ log records to ``path`` while the block runs; this package's own
    records to ``console`` too. Everything is as it was afterwards (filters, handlers, hooks)."""
    to_file = logging.FileHandler(path, encoding="utf-8", delay=True)  # created by the first line
    to_file.setLevel(logging.WARNING)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    to_console = _ConsoleHandler(console)
    root, package = logging.getLogger(), logging.getLogger(PACKAGE_LOGGER)
    root.addHandler(to_file)
    package.addHandler(to_console)
    try:
        with warnings.catch_warnings():  # restores showwarning and the filters on the way out
            warnings.showwarning = _log_warning
            yield
    finally:
        package.removeHandler(to_console)
        root.removeHandler(to_file)
        to_file.close()


def _log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` as a log record of ``py.warnings`` (what ``logging.captureWarnings``
    does, without changing a hook that others may have set for good)."""
    text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
    logging.getLogger("py.warnings").warning("%s", text)


class _ConsoleHandler(logging.Handler):
    """This package's warnings and errors, printed above the live table (rich keeps them apart)."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            style = "bold red" if record.levelno >= logging.ERROR else "yellow"
            self.console.print(f"[{style}]{record.levelname.lower()}:[/] {escape(record.getMessage())}")
        except Exception:
            self.handleError(record)
