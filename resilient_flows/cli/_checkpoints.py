"""``resilient-flows checkpoints list | verify | export``: inspect and export checkpoint directories.

``list`` imports no torch (manifests are read as JSON), so that it answers at once; ``verify``
and ``export`` read tensors and pay for it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from resilient_flows.cli._console import console, print_document, warn
from resilient_flows.errors import CheckpointError

if TYPE_CHECKING:
    from resilient_flows.checkpoint import CheckpointInfo

#: The version of the ``checkpoints list --json`` document; README.md ("Output for scripts") lists its fields.
LIST_VERSION = 1


def add_parsers(commands: argparse._SubParsersAction) -> None:
    checkpoints = commands.add_parser("checkpoints", help="inspect checkpoint directories")
    sub = checkpoints.add_subparsers(required=True, metavar="ACTION")
    for name, verify, text in (
        ("list", False, "list committed checkpoints, checking manifests and shard sizes"),
        ("verify", True, "list committed checkpoints, reading every shard to check its checksum"),
    ):
        cmd = sub.add_parser(name, help=text, description=text + ". Exit code 1 if a tier's newest is invalid.")
        cmd.add_argument("dirs", nargs="+", metavar="DIR", help="a checkpoint tier, or a directory holding tiers")
        cmd.add_argument(
            "--json", action="store_true", help="print a JSON document for scripts instead (README: Output for scripts)"
        )
        cmd.set_defaults(handler=_checkpoints, verify=verify)
    text = "write one checkpoint as a single file of full tensors (streamed: memory stays near the largest tensor)"
    export = sub.add_parser("export", help=text, description=text + ".")
    export.add_argument(
        "dir", metavar="DIR", help="a checkpoint tier, a directory holding one tier, or a run directory with MEMBER"
    )
    export.add_argument("member", nargs="?", metavar="MEMBER", help="with a run directory DIR: the member to export")
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

    result = export(_source(Path(args.dir), args.member), args.out, step=args.step, format=args.format, part=args.part)
    for step, why in result.skipped:
        warn(f"passed over step {step}, newer but damaged: {why}")
    steps = [str(step) for step, _ in result.skipped]
    newer = f"; not the newest: step{'s' if len(steps) > 1 else ''} {', '.join(steps)} damaged" if steps else ""
    console().print(
        f"wrote {result.tensors} tensors ({_size(result.nbytes)}) of step {result.step} "
        f"to {escape(str(result.path))}{newer}"
    )
    return 0


def _source(directory: Path, member: str | None) -> Path:
    """What to export from: in a run directory, the checkpoints of ``member`` (or of its one
    member that has any), else ``directory`` itself (a tier, or a directory holding one)."""
    from resilient_flows.rundir import run_layout

    layout = run_layout(directory)
    if not layout.members.is_dir():
        if member is not None:
            raise CheckpointError(f"{directory} is not a run directory (no {layout.members.name}/): MEMBER needs one")
        return directory
    have = sorted(d.name for d in layout.members.iterdir() if layout.member(d.name).checkpoints.is_dir())
    if member is None and len(have) == 1:
        member = have[0]
    if member is None or member not in have:
        unknown = "" if member is None else f"has no checkpoints of a member {member!r}; it "
        raise CheckpointError(
            f"{directory} {unknown}holds the checkpoints of {len(have)} member(s): {', '.join(have) or 'none'}; "
            f"name one: checkpoints export {directory} MEMBER --out FILE"
        )
    return layout.member(member).checkpoints


def _checkpoints(args: argparse.Namespace) -> int:
    from resilient_flows.checkpoint import scan

    infos = [info for directory in args.dirs for info in scan(directory, verify=args.verify)]
    by_tier: dict[str, list[CheckpointInfo]] = {}
    for info in infos:
        by_tier.setdefault(str(info.tier), []).append(info)
    invalid_newest = [tier for tier, tier_infos in by_tier.items() if not tier_infos[0].valid]
    if args.json:
        print_document(_list_document(by_tier, args.verify))
        return 1 if invalid_newest else 0
    out = console()
    if not infos:
        out.print(f"no committed checkpoints under {', '.join(args.dirs)}")
        return 0
    check = "checksums verified" if args.verify else "manifests and sizes checked; `verify` reads the data"
    for tier, tier_infos in by_tier.items():
        out.print(f"[bold]{tier}[/]")
        out.print(_table(tier_infos, check))
        newest = tier_infos[0]
        if not newest.valid:
            out.print(f"[bold red]the newest checkpoint in {tier} (step {newest.step}) is invalid:[/] {newest.problem}")
    return 1 if invalid_newest else 0


def _list_document(by_tier: dict[str, list[CheckpointInfo]], verified: bool) -> dict[str, Any]:
    """``checkpoints list|verify --json``: per tier, its checkpoints newest first."""
    return {
        "version": LIST_VERSION,
        "verified": verified,
        "tiers": [
            {
                "path": tier,
                "newest_valid": infos[0].valid,
                "checkpoints": [
                    {
                        "step": info.step,
                        "created": info.created,
                        "bytes": info.nbytes,
                        "world_size": info.world_size,
                        "valid": info.valid,
                        "problem": info.problem,
                    }
                    for info in infos
                ],
            }
            for tier, infos in by_tier.items()
        ],
    }


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
