"""``resilient-flows init [DIR]``: a starter workflow and training function, ready to run;
``init --example NAME [DIR]``: one of the example workflows the docs use.

The two starter files (``workflow.yaml`` and ``train.py``, from ``starter/`` beside this module)
are the shortest complete example of the member contract: the workflow names the function as
``train:train``, and modules are imported from the workflow file's directory, so that
``resilient-flows run workflow.yaml`` works in the new directory with nothing installed but this
package. The examples are the shipped ``workflows/`` (:func:`~resilient_flows.shipped.shipped_dir`:
a wheel's copy, else the checkout's), each with the files beside it that it names (a script a
command member runs): a user with only the wheel runs the docs' ``workflows/NAME.yaml`` as
written. Either way ``init`` writes only into an empty or new directory: nothing of the user's is
overwritten or mixed in.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from rich.markup import escape

from resilient_flows.cli._console import console
from resilient_flows.errors import WorkflowError
from resilient_flows.shipped import shipped_dir

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
    init.add_argument(
        "--example",
        metavar="NAME",
        help="write the example workflow NAME instead, as workflows/NAME.yaml, with the files it names "
        f"({', '.join(example_names()) or 'none shipped'})",
    )
    init.set_defaults(handler=_init)


def example_names() -> list[str]:
    """The example workflows that ship with the package."""
    return sorted(p.stem for p in shipped_dir("workflows").glob("*.yaml"))


def example_files(name: str) -> dict[str, Path]:
    """Where each file of example ``name`` goes (relative to the new directory), from where it is:
    ``workflows/NAME.yaml`` and the shipped files its text names (a command member's script)."""
    source = shipped_dir("workflows")
    workflow = source / f"{name}.yaml"
    if name not in example_names():
        raise WorkflowError(f"no example named {name!r}; the examples are {', '.join(example_names())}")
    named = set(re.findall(r"[\w.-]+\.py\b", workflow.read_text()))
    beside = {f"workflows/{p.name}": p for p in sorted(source.iterdir()) if p.name in named and p.is_file()}
    return {f"workflows/{name}.yaml": workflow, **beside}


def _init(args: argparse.Namespace) -> int:
    files = {name: STARTER / name for name in _FILES} if args.example is None else example_files(args.example)
    directory = Path(args.dir)
    if directory.exists() and not directory.is_dir():
        raise WorkflowError(f"{directory} is a file; init writes into an empty or new directory")
    present = sorted(p.name for p in directory.iterdir() if p.name != ".git") if directory.exists() else []
    if present:
        shown = ", ".join(present[:5]) + (f" and {len(present) - 5} more" if len(present) > 5 else "")
        raise WorkflowError(f"{directory.resolve()} is not empty ({shown}); init writes only into an empty directory")
    directory.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(source.read_bytes())
    out = console()
    out.print(f"wrote {', '.join(escape(str(directory / name)) for name in files)}")
    go = "" if directory.resolve() == Path.cwd().resolve() else f"cd {escape(shlex.quote(str(directory)))} && "
    workflow = next(iter(files))
    out.print(f"next: {go}resilient-flows validate {workflow} && resilient-flows run {workflow}")
    return 0
