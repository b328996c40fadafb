"""The interchange of a ``HighThroughputExecutor``: ``python -m resilient_flows.sites._interchange``.

HTEX starts its interchange as a script (``interchange.py``) that reads its configuration on
stdin; this starts the same module, Parsl's own, without Parsl's run-time type checks (see
:mod:`resilient_flows.sites._typechecks`). The site builder makes it every HTEX's
``interchange_launch_cmd`` unless the site file gives one.
"""

from __future__ import annotations

from resilient_flows.sites._typechecks import skip_type_checks

if __name__ == "__main__":
    skip_type_checks()
    from resilient_flows.sites._parsl import run_interchange

    run_interchange()
