"""Parsl's monitoring on the multi-node cluster (see ``tests/test_multinode.py``): a worker pool in a
node's network namespace reports to the runner's database across the node network.

A file of the multi-node tests' own (``test_multinode*``): under xdist they run one after another,
the one-node Slurm tests in a turn of their own beside them (``tests/conftest.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_monitoring import final_states, rows
from test_multinode import SITE as NODES_SITE
from test_multinode import _run_workflow as run_on_nodes
from test_multinode import cluster

from resilient_flows.rundir import run_layout

__all__ = ["cluster"]  # the fixture, shared with tests/test_multinode.py


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_a_slurm_member_on_an_emulated_node_is_recorded_across_the_node_network(
    cluster: dict[str, str],
    tmp_path: Path,
) -> None:
    """On the multi-node cluster the worker pool runs in a node's network namespace, where the
    runner's host is only its bridge address: what the node reports reaches the database there."""
    (tmp_path / "wf.yaml").write_text(
        f"name: mon-nodes\nsite: {NODES_SITE}\nmonitoring: true\nretries: 0\n"
        "members:\n  - {name: m, workload: mlp-breast-cancer, steps: 10}\n"
    )
    run_dir = tmp_path / "run"
    done = run_on_nodes(tmp_path / "wf.yaml", run_dir, cluster)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    database = run_layout(run_dir).monitoring_db
    ((run_id,),) = rows(database, "select run_id from workflow")
    assert list(final_states(database, run_id).values()) == ["exec_done"]
    ((host,),) = rows(database, "select hostname from try")
    assert host in cluster["RESILIENT_FLOWS_TEST_NODES"].split()
    assert {h for (h,) in rows(database, "select hostname from node")} == {host}
