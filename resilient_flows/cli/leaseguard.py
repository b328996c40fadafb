"""``python -m resilient_flows.cli.leaseguard RUN_DIR --runner PID --started TICKS``: the runner's guard
(:mod:`resilient_flows.workflow._leaseguard`) as the process the runner starts beside itself."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from resilient_flows.workflow import guard

__all__ = ["main"]

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resilient_flows.cli.leaseguard", description=guard.__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--runner", type=int, required=True, help="the runner's process id")
    parser.add_argument("--started", type=int, help="the runner's start time, in clock ticks since boot")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    for line in guard(args.run_dir.resolve(), args.runner, args.started):
        logger.info("cancelled %s", line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
