"""``resilient-flows init [DIR]``: a starter workflow and training function, ready to run.

The two files (``workflow.yaml`` and ``train.py``, from ``starter/`` beside this module) are the
shortest complete example of the member contract: the workflow names the function as
``train:train``, and modules are imported from the workflow file's directory, so that
``resilient-flows run workflow.yaml`` works in the new directory with nothing installed but this
package. It writes only into an empty or new directory: nothing of the user's is overwritten or
mixed in.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from rich.markup import escape

from resilient_flows.cli._console import console
from resilient_flows.errors import WorkflowError

#: The starter's files, copied as they are.
STARTER = Path(__file__).resolve().parent / "starter"
_FILES = ("workflow.yaml", "train.py")


def add_parsers(commands: argparse._SubParsersAction) -> None:
    text = "write a starter workflow and training function into an empty directory"
    init = commands.add_parser(
        "init",
        help=text,
        description=text + f" ({', '.join(_FILES)}); then `resilient-flows run workflow.yaml` there trains it "
        "on this machine.",
    )
    init.add_argument("dir", nargs="?", default=".", metavar="DIR", help="an empty or new directory (default: .)")
    init.set_defaults(handler=_init)


def _init(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    if directory.exists() and not directory.is_dir():
        raise WorkflowError(f"{directory} is a file; init writes into an empty or new directory")
    present = sorted(p.name for p in directory.iterdir() if p.name != ".git") if directory.exists() else []
    if present:
        shown = ", ".join(present[:5]) + (f" and {len(present) - 5} more" if len(present) > 5 else "")
        raise WorkflowError(f"{directory.resolve()} is not empty ({shown}); init writes only into an empty directory")
    directory.mkdir(parents=True, exist_ok=True)
    for name in _FILES:
        (directory / name).write_bytes((STARTER / name).read_bytes())
    out = console()
    out.print(f"wrote {', '.join(escape(str(directory / name)) for name in _FILES)}")
    go = "" if directory.resolve() == Path.cwd().resolve() else f"cd {escape(shlex.quote(str(directory)))} && "
    out.print(f"next: {go}resilient-flows validate workflow.yaml && resilient-flows run workflow.yaml")
    return 0
