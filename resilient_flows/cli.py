"""The ``resilient-flows`` command line.

User mistakes (a missing directory, a corrupt checkpoint) end in one line on stderr and a
non-zero exit; only bugs show a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from resilient_flows.checkpoint.catalog import CheckpointInfo, scan
from resilient_flows.errors import ResilientFlowsError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (ResilientFlowsError, FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        _console(stderr=True).print(f"[bold red]error:[/] {exc}")
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="resilient-flows", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    checkpoints = commands.add_parser("checkpoints", help="inspect checkpoint directories")
    sub = checkpoints.add_subparsers(required=True, metavar="ACTION")
    for name, verify, text in (
        ("list", False, "list committed checkpoints, checking manifests and shard sizes"),
        ("verify", True, "list committed checkpoints, reading every shard to check its checksum"),
    ):
        cmd = sub.add_parser(name, help=text, description=text + ". Exit code 1 if a tier's newest is invalid.")
        cmd.add_argument("dirs", nargs="+", metavar="DIR", help="a checkpoint tier, or a directory holding tiers")
        cmd.set_defaults(handler=_checkpoints, verify=verify)
    return parser


def _console(stderr: bool = False) -> Console:
    """A terminal gets tables fitted to its width; a pipe or a log file gets unwrapped lines."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, width=None if stream.isatty() else 200, highlight=False)


def _checkpoints(args: argparse.Namespace) -> int:
    console = _console()
    infos = [info for directory in args.dirs for info in scan(directory, verify=args.verify)]
    if not infos:
        console.print(f"no committed checkpoints under {', '.join(args.dirs)}")
        return 0
    by_tier: dict[str, list[CheckpointInfo]] = {}
    for info in infos:
        by_tier.setdefault(str(info.tier), []).append(info)
    check = "checksums verified" if args.verify else "manifests and sizes checked; `verify` reads the data"
    invalid_newest = 0
    for tier, tier_infos in by_tier.items():
        console.print(f"[bold]{tier}[/]")
        console.print(_table(tier_infos, check))
        newest = tier_infos[0]
        if not newest.valid:
            invalid_newest += 1
            console.print(
                f"[bold red]the newest checkpoint in {tier} (step {newest.step}) is invalid:[/] {newest.problem}"
            )
    return 1 if invalid_newest else 0


def _table(infos: list[CheckpointInfo], check: str) -> Table:
    table = Table(caption=check)
    for column in ("step", "time", "size", "ranks"):
        table.add_column(column, justify="left" if column == "time" else "right")
    table.add_column("valid", overflow="fold")
    for info in infos:
        table.add_row(
            str(info.step),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.created)) if info.created else "?",
            _size(info.nbytes),
            str(info.world_size) if info.world_size else "?",
            "[green]yes[/]" if info.valid else f"[red]no: {info.problem}[/]",
        )
    return table


def _size(nbytes: int | None) -> str:
    if nbytes is None:
        return "?"
    if nbytes < 1024:
        return f"{nbytes} B"
    value = nbytes / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


if __name__ == "__main__":
    sys.exit(main())
