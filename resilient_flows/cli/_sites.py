"""``resilient-flows sites [show NAME | new NAME --from SITE]``: the sites a workflow can name.

A workflow names its site (``site: polaris``, or ``--site``) and the name is looked up in
``RESILIENT_FLOWS_SITES``, then the user's site directory, then the site files shipped with the
package (:mod:`resilient_flows.sites`). ``sites`` shows what each name reaches and from where;
``sites new`` starts a user's own site from a shipped one, to edit (an account, a queue, a
filesystem), without touching the package.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from resilient_flows.cli._console import console
from resilient_flows.errors import SiteConfigError

#: What a new site's name may be: it becomes ``NAME.yaml``, and a name with a ``/`` or ending in
#: ``.yaml`` would be read as a path.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def add_parsers(commands: argparse._SubParsersAction) -> None:
    text = "list the sites a workflow can name, where each comes from, and what it is"
    sites = commands.add_parser(
        "sites",
        help=text,
        description=text + ". A name is looked up in each directory of RESILIENT_FLOWS_SITES (':'-separated), "
        "then the user's site directory (~/.config/resilient-flows/sites), then the sites shipped with the package; "
        "the first file NAME.yaml wins.",
    )
    sites.set_defaults(handler=_list)
    sub = sites.add_subparsers(metavar="ACTION")
    show = sub.add_parser("show", help="print a site's file", description="Print a site's file, as it is.")
    show.add_argument("name", metavar="NAME", help="a site name, or a site file's path")
    show.set_defaults(handler=_show)
    text = "write a copy of a site, to edit, as a site of your own"
    new = sub.add_parser(
        "new",
        help=text,
        description=text + ". It goes into the user's site directory (or --dir), never over an existing file; "
        "a copy named as a shipped site takes that name's place.",
    )
    new.add_argument("name", metavar="NAME", help="the new site's name (the file is NAME.yaml)")
    new.add_argument("--from", dest="source", required=True, metavar="SITE", help="the site to copy, e.g. polaris")
    new.add_argument("--dir", help="write it here instead of the user's site directory")
    new.set_defaults(handler=_new)


def _list(args: argparse.Namespace) -> int:
    from resilient_flows.sites import known_sites, site_description, site_dirs

    table = Table(box=None, pad_edge=False)
    for column in ("site", "from", "description"):
        table.add_column(column, overflow="fold")
    for site in known_sites().values():
        hides = ", ".join(directory.origin for directory in site.shadows)
        origin = site.source.origin + (f" (hides {hides})" if hides else "")
        table.add_row(site.name, origin, escape(site_description(site.path)))
    out = console()
    out.print(table)
    out.print("\nsearched in this order (the first NAME.yaml wins):")
    for directory in site_dirs():
        missing = "" if directory.path.is_dir() else " (none yet)"
        out.print(f"  {directory.origin}: {escape(str(directory.path))}{missing}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from resilient_flows.sites import site_path

    path = site_path(args.name)
    sys.stdout.write(path.read_text())
    return 0


def _new(args: argparse.Namespace) -> int:
    from resilient_flows.sites import known_sites, site_dirs, site_path, user_site_dir

    name = args.name
    if not _NAME.fullmatch(name) or name.endswith((".yaml", ".yml")):
        raise SiteConfigError(
            f"site name {name!r}: use letters, digits, '.', '_' and '-' (the file becomes NAME.yaml; no path, no .yaml)"
        )
    source = site_path(args.source)
    text = source.read_text()
    directory = Path(args.dir) if args.dir else user_site_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}.yaml"
    try:
        with target.open("x") as file:
            file.write(text)
    except FileExistsError:
        raise SiteConfigError(f"{target} exists; not overwriting it (edit it, or choose another name)") from None
    out = console()
    out.print(f"wrote {escape(str(target))}, a copy of {escape(args.source)}: edit it for your account and machine")
    searched = any(d.path.resolve() == directory.resolve() for d in site_dirs())
    if searched and known_sites()[name].path == target:
        out.print(f"a workflow names it as `site: {escape(name)}` (or `--site {escape(name)}`)")
    elif searched:
        out.print(f"[yellow]`{escape(name)}` still names {escape(str(site_path(name)))}, found first[/]")
    else:
        out.print(
            f"{escape(str(directory))} is not searched for site names: use `--site {escape(str(target))}`, "
            "or add the directory to RESILIENT_FLOWS_SITES"
        )
    return 0
