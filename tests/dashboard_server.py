"""``resilient-flows dashboard RUN_DIR --port 0`` in a subprocess, for the dashboard's tests."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from conftest import REPO, python_env


@contextlib.contextmanager
def served(run_dir: Path) -> Iterator[str]:
    """The server running while in the block; the URL it printed, token included."""
    command = [sys.executable, "-m", "resilient_flows.cli", "dashboard", str(run_dir), "--port", "0"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=python_env(), cwd=REPO)
    try:
        assert server.stdout is not None
        for line in server.stdout:
            found = re.search(r"http://\S+/\?token=\S+", line)
            if found:
                yield found.group(0)
                break
        else:
            raise AssertionError(f"the dashboard server printed no URL (exit status {server.wait()})")
    finally:
        server.terminate()
        server.wait(timeout=30)
