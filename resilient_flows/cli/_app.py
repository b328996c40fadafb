"""The top-level parser, and :func:`main`: the ``resilient-flows`` console script.

Each command group's module adds its own subcommands; the order here is the order of ``--help``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from importlib import metadata

from rich.markup import escape

from resilient_flows import __version__
from resilient_flows.cli import (
    _checkpoints,
    _cosched,
    _cosim,
    _dashboard,
    _logs,
    _mlc,
    _sites,
    _starter,
    _tune,
    _workflow,
)
from resilient_flows.cli._console import console
from resilient_flows.errors import ResilientFlowsError

#: What ``--help`` says first, in plain text (a terminal shows no reStructuredText).
DESCRIPTION = (
    "Run ensembles of PyTorch training as Parsl workflows that survive failures, preemption and "
    "exploration: checkpoints, retries that resume, clones, co-scheduling."
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in ``argv``; a user's mistake is one line on stderr and exit status 2, a
    Ctrl-C that the command does not take itself (the runner does) one line and status 130."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (ResilientFlowsError, FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console(stderr=True).print("interrupted")
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="resilient-flows", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for group in (_starter, _checkpoints, _workflow, _logs, _dashboard, _sites, _cosim, _cosched, _mlc, _tune):
        group.add_parsers(commands)
    return parser


def version() -> str:
    """The installed distribution's version; a checkout used without installing says so."""
    try:
        return metadata.version("resilient-flows")
    except metadata.PackageNotFoundError:
        return f"{__version__} (not installed)"
