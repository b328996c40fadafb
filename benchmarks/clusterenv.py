"""The env file of a cluster that ``.ci/slurm-up DIR`` started (``DIR/env``): how the benchmarks
and the tests that use the cluster find its ``SLURM_CONF`` and, for several nodes, their names,
addresses, interface and scratch folders."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

__all__ = ["read_env_file"]


def read_env_file(path: str | os.PathLike) -> dict[str, str]:
    """The ``export NAME=VALUE`` lines of the file, as a mapping."""
    found = {}
    for line in Path(path).read_text().splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            found[name] = value
    return found
