"""``resilient-flows checkpoints list | verify | export``: inspect and export checkpoint directories."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from resilient_flows.cli._console import console

if TYPE_CHECKING:
    from resilient_flows.checkpoint import CheckpointInfo


def add_parsers(commands: argparse._SubParsersAction) -> None:
    checkpoints = commands.add_parser("checkpoints", help="inspect checkpoint directories")
    sub = checkpoints.add_subparsers(required=True, metavar="ACTION")
    for name, verify, text in (
        ("list", False, "list committed checkpoints, checking manifests and shard sizes"),
        ("verify", True, "list committed checkpoints, reading every shard to check its checksum"),
    ):
        cmd = sub.add_parser(name, help=text, description=text + ". Exit code 1 if a tier's newest is invalid.")
        cmd.add_argument("dirs", nargs="+", metavar="DIR", help="a checkpoint tier, or a directory holding tiers")
        cmd.set_defaults(handler=_checkpoints, verify=verify)
    text = "write one checkpoint as a single file of full tensors (streamed: memory stays near the largest tensor)"
    export = sub.add_parser("export", help=text, description=text + ".")
    export.add_argument("dir", metavar="DIR", help="a checkpoint tier (a directory of step-* directories)")
    export.add_argument("--out", required=True, metavar="FILE", help="the file to write")
    export.add_argument("--step", type=int, help="the step to export; default: the newest valid one")
    export.add_argument("--format", choices=("safetensors", "torch"), default="safetensors")
    export.add_argument(
        "--part",
        help="top-level key of the state to export, names relative to it; default: model when there is one; "
        "'' for every array",
    )
    export.set_defaults(handler=_export)


def _export(args: argparse.Namespace) -> int:
    from resilient_flows.checkpoint import export

    result = export(args.dir, args.out, step=args.step, format=args.format, part=args.part)
    console().print(
        f"wrote {result.tensors} tensors ({_size(result.nbytes)}) of step {result.step} to {escape(str(result.path))}"
    )
    return 0


def _checkpoints(args: argparse.Namespace) -> int:
    from resilient_flows.checkpoint import scan

    out = console()
    infos = [info for directory in args.dirs for info in scan(directory, verify=args.verify)]
    if not infos:
        out.print(f"no committed checkpoints under {', '.join(args.dirs)}")
        return 0
    by_tier: dict[str, list[CheckpointInfo]] = {}
    for info in infos:
        by_tier.setdefault(str(info.tier), []).append(info)
    check = "checksums verified" if args.verify else "manifests and sizes checked; `verify` reads the data"
    invalid_newest = 0
    for tier, tier_infos in by_tier.items():
        out.print(f"[bold]{tier}[/]")
        out.print(_table(tier_infos, check))
        newest = tier_infos[0]
        if not newest.valid:
            invalid_newest += 1
            out.print(f"[bold red]the newest checkpoint in {tier} (step {newest.step}) is invalid:[/] {newest.problem}")
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
