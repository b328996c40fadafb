"""The recommender's training set, labelled through Parsl (``resilient-flows mlc generate``).

Labelling one parameter set runs the simulator's search (seconds), so a training set of thousands
is a campaign: chunks of parameter sets go to Parsl apps on a site (the local one by default, a
cluster's for a large set), and rows are appended to the output as chunks finish, so that an
interrupted generation keeps what it labelled and a second call adds to it.
"""

from __future__ import annotations

import time
from concurrent.futures import as_completed
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from resilient_flows.errors import WorkflowError
from resilient_flows.mlc import sample_params, write_rows


def generate(
    samples: int,
    out: Path,
    site: str = "local",
    seed: int = 0,
    trials: int = 400,
    chunk: int = 4,
    console: Console | None = None,
) -> int:
    """Label ``samples`` parameter sets (drawn with ``seed``) on ``site``; rows appended to ``out``."""
    import parsl  # Parsl and torch: only when labels are generated, not for `resilient-flows --help`

    from resilient_flows.apps import mlc_label_app
    from resilient_flows.sites import load_site

    if samples < 1 or chunk < 1 or trials < 1:
        raise WorkflowError(f"samples, chunk and trials must be >= 1, got {samples}, {chunk}, {trials}")
    console = console or Console()
    params = [asdict(p) for p in sample_params(samples, seed)]
    out.parent.mkdir(parents=True, exist_ok=True)
    config = load_site(site, run_dir=str(out.parent / f"{out.stem}.parsl"))
    started, done = time.monotonic(), 0
    with parsl.load(config):
        futures = [mlc_label_app(params[i : i + chunk], trials, seed) for i in range(0, samples, chunk)]
        for future in as_completed(futures):
            done += write_rows(future.result(), out)
            console.print(f"{done}/{samples} labelled ({time.monotonic() - started:.0f} s)")
    return done
