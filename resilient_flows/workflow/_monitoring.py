"""Parsl's own monitoring of a run (``monitoring: true``): a ``MonitoringHub`` in the run's Parsl
configuration, writing to the run's ``parsl/monitoring.db``, which ``parsl-visualize`` reads.

The hub has no address to set: in this Parsl (2026.10.26) a worker of a ``HighThroughputExecutor``
sends its monitoring messages to its interchange over the connection it already has (the
executor's default ``HTEXRadio``), and the interchange, on the runner's host, hands them on over
loopback. A compute node that reaches its interchange (the executor's ``address``, as any working
Slurm or PBS site's must) is therefore monitored with nothing more to configure.

A monitored run needs Parsl's ``monitoring`` extra (SQLAlchemy): without it ``validate``, ``run``
and ``resume`` stop with one line naming the extra. ``parsl-visualize`` needs Parsl's
``visualization`` extra too, which pins plotly < 7 and networkx < 3.3; the run does not, and any
environment with the same Parsl can read the database, so its absence is a note, not an error.
"""

from __future__ import annotations

from importlib import import_module, metadata
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.requirements import Requirement

from resilient_flows.errors import WorkflowError

if TYPE_CHECKING:
    from parsl.monitoring import MonitoringHub

#: What installs the database's requirements, and what installs ``parsl-visualize``'s.
MONITORING_EXTRA = "resilient-flows[monitoring]"
VISUALIZE_EXTRA = "resilient-flows[visualize]"

#: Seconds between two resource samples (CPU time, memory, I/O of an attempt's processes) written
#: to the database: each member's memory and CPU over time in parsl-visualize. Parsl's sampler, a
#: process forked into each attempt, wakes every 5 s whatever this is; measured on a 2-core machine
#: it costs about 1 % of a core per running attempt (the hub's two processes about 1.5 % together),
#: too little to switch off. Parsl's default, 30 s, writes 120 rows per attempt and hour.
RESOURCE_INTERVAL_S = 30.0


def check_monitoring() -> None:
    """Return if Parsl's monitoring can record a run here; else a :class:`WorkflowError` naming
    the extra, instead of the exception Parsl raises from inside ``parsl.load``."""
    from parsl.errors import OptionalModuleMissing

    try:
        import_module("parsl.monitoring.db_manager")  # what Parsl's hub imports: SQLAlchemy
    except OptionalModuleMissing as exc:
        missing = ", ".join(exc.module_names)
    except ImportError as exc:
        missing = exc.name or str(exc)
    else:
        return
    raise WorkflowError(
        f"monitoring: true needs Parsl's monitoring extra (SQLAlchemy), but {missing} does not import here: "
        f"pip install '{MONITORING_EXTRA}'"
    )


def monitoring_hub(database: Path, workflow_name: str) -> MonitoringHub:
    """A hub recording into ``database`` (created, or added to: each Parsl instance is a new
    workflow row), under the workflow's name, which ``parsl-visualize`` lists."""
    check_monitoring()
    from parsl.monitoring import MonitoringHub

    return MonitoringHub(
        workflow_name=workflow_name,
        logging_endpoint=f"sqlite:///{database.resolve()}",
        resource_monitoring_interval=RESOURCE_INTERVAL_S,
    )


def visualize_problems() -> list[str]:
    """Why ``parsl-visualize`` would fail in this environment: each requirement of Parsl's
    ``visualization`` extra that is missing (``Flask missing``) or of a version the extra excludes
    (``plotly 7.1.0, needs <7,>=5.19``); empty when it would work."""
    problems = []
    for text in metadata.requires("parsl") or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or not marker.evaluate({"extra": "visualization"}) or marker.evaluate({"extra": ""}):
            continue
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{requirement.name} missing")
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{requirement.name} {version}, needs {requirement.specifier}")
    return problems


def visualize_note() -> str | None:
    """One line for a user who switched monitoring on where ``parsl-visualize`` would not work;
    None where it would."""
    problems = visualize_problems()
    if not problems:
        return None
    return (
        f"parsl-visualize will not work in this environment ({'; '.join(problems)}); the run records its "
        f"database all the same: pip install '{VISUALIZE_EXTRA}' here, or in an environment of its own"
    )
