"""The dashboard written as a file: ``report/index.html`` at the end of a run, or on demand.

A run ends on a login node that may have no browser, and is looked at later from a laptop that
may have no server: the report page needs neither (see :mod:`~resilient_flows.workflow.dashboard._page`).
It holds each member's sampled curve (a few hundred points), not every step, so that a page of a
thousand members stays a few megabytes.
"""

from __future__ import annotations

import os
from pathlib import Path

from resilient_flows.rundir import DamageLog
from resilient_flows.workflow.dashboard._model import RunModel
from resilient_flows.workflow.dashboard._page import write_report_page


def write_dashboard_report(
    run_dir: str | os.PathLike, page: str | os.PathLike, damage: DamageLog | None = None
) -> Path:
    """Write the run's dashboard as the page ``page`` (its assets beside it); its path. What it
    passed over as damaged is listed in the page, and in ``damage`` when given (for the caller to say)."""
    model = RunModel(run_dir, damage)
    model.update()
    members = {name: model.member_sample(name) for name in model.member_names()}
    return write_report_page(page, model.document(), members)
