"""``resilient-flows dashboard``: a run in a browser, live, or written as a report page."""

from __future__ import annotations

import argparse
import contextlib
import getpass
import ipaddress
import socket
from pathlib import Path

from rich.markup import escape

from resilient_flows.cli._console import console, warn_damage


def add_parsers(commands: argparse._SubParsersAction) -> None:
    from resilient_flows.workflow.dashboard import DEFAULT_PORT

    dashboard = commands.add_parser(
        "dashboard",
        help="serve a run's live dashboard (read only, needs the printed token), or write it as a page",
    )
    dashboard.add_argument("run_dir", metavar="RUN_DIR")
    dashboard.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: reach it through an ssh tunnel)",
    )
    dashboard.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0 takes a free port"
    )
    dashboard.add_argument(
        "--report",
        nargs="?",
        const="",
        metavar="DIR",
        help="write the page with the run's data in it to DIR/index.html (default RUN_DIR/report) and exit",
    )
    dashboard.set_defaults(handler=_dashboard)


def _dashboard(args: argparse.Namespace) -> int:
    from resilient_flows.rundir import DamageLog
    from resilient_flows.workflow.dashboard import serve_dashboard, write_dashboard_report

    run_dir = Path(args.run_dir)
    out = console()
    if args.report is not None:
        damage = DamageLog()
        page = write_dashboard_report(run_dir, Path(args.report or run_dir / "report") / "index.html", damage)
        out.print(f"wrote {escape(str(page))}: open it in a browser, no server needed")
        warn_damage(run_dir, damage)
        return 0

    def ready(host: str, port: int, page: str) -> None:
        shown = f"[{host}]" if ":" in host else host
        out.print(f"dashboard of {escape(str(run_dir))} (Ctrl-C to stop):", soft_wrap=True)
        out.print(f"  http://{shown}:{port}{page}", soft_wrap=True, highlight=False)
        if _loopback(host):
            login = f"{getpass.getuser()}@{socket.gethostname()}"
            out.print(
                f"from a laptop: ssh -N -L {port}:127.0.0.1:{port} {escape(login)}, then open the URL above there",
                soft_wrap=True,
            )
        else:
            out.print(
                f"[bold yellow]listening on {escape(host)}:[/] whoever reaches it with the token reads the run",
                soft_wrap=True,
            )

    with contextlib.suppress(KeyboardInterrupt):
        serve_dashboard(run_dir, host=args.host, port=args.port, ready=ready)
    return 0


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
