"""A member that may shrink (``min_nodes``): checked without a cluster. The end-to-end test, on the
emulated nodes, is in ``tests/test_multinode.py``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from resilient_flows.apps import launch_prefix, mpi_train_app
from resilient_flows.errors import WorkflowError
from resilient_flows.sites._spares import with_spares
from resilient_flows.training import MemberSpec
from resilient_flows.training._lostnodes import record_lost
from resilient_flows.training._shrink import fewest_nodes, on_nodes_left
from resilient_flows.workflow import load_workflow, plan_workflow
from resilient_flows.workflow._status import MemberStatus
from resilient_flows.workflow._status_json import member_document

SITE = """\
executors:
  - {type: HighThroughputExecutor, provider: {type: SlurmProvider}}
facts: {nodes: 4, cores_per_node: 2}
"""


def _member(**given: object) -> dict:
    return MemberSpec(name="m", workload="mlp-digits", params={}, ranks=4, nodes=2, **given).to_dict()


def test_min_nodes_goes_from_the_workflow_to_the_members_spec_and_must_lie_between_one_and_nodes(
    tmp_path: Path,
) -> None:
    path, site = tmp_path / "wf.yaml", tmp_path / "site.yaml"
    site.write_text(SITE)
    member = "name: w\nmembers:\n  - {name: a, workload: mlp-digits, steps: 5, nodes: 3, %s}\n"
    path.write_text(member % "min_nodes: 2")
    ((spec),) = plan_workflow(load_workflow(path), str(site), build_site=False).members
    assert (spec.ranks, spec.nodes, spec.min_nodes) == (3, 3, 2)
    path.write_text(member % "ranks: 6")
    ((spec),) = plan_workflow(load_workflow(path), str(site), build_site=False).members
    assert spec.min_nodes is None  # it never shrinks
    for bad in (0, 4):
        path.write_text(member % f"min_nodes: {bad}")
        with pytest.raises(
            WorkflowError,
            match=rf"member 'a': min_nodes \({bad}\) must be between 1 and nodes \(3\): the fewest nodes it may",
        ):
            load_workflow(path)
    path.write_text("name: w\nmembers:\n  - {name: a, command: [echo], steps: 5, min_nodes: 1}\n")
    with pytest.raises(WorkflowError, match=r"min_nodes apply to workloads; a command launches its own ranks"):
        load_workflow(path)
    with pytest.raises(WorkflowError, match=r"member 'm': min_nodes must be between 1 and nodes \(2\), got 3"):
        MemberSpec.from_dict(_member(min_nodes=3))
    resized = MemberSpec.from_dict(_member(min_nodes=2)).with_ranks(3)  # 3 ranks: on one node, down to it
    assert (resized.ranks, resized.nodes, resized.min_nodes) == (3, 1, 1)


def test_a_member_that_may_shrink_runs_on_the_nodes_its_block_has_left(tmp_path: Path) -> None:
    """Fewer nodes left than it spans, but at least ``min_nodes``: the attempt's spec spans those,
    as many ranks per node; otherwise the member's own spec, unchanged."""
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x1\nx1\nx2\nx3\n")  # PBS Pro's: a line per chunk
    block = {"PBS_JOBID": "7.pbs", "PBS_NODEFILE": str(nodefile)}
    three = {**_member(min_nodes=1), "ranks": 6, "nodes": 3}
    assert on_nodes_left(three, ["x3"], block) == {**three, "ranks": 4, "nodes": 2, "min_nodes": 1}
    assert on_nodes_left(three, ["x2", "x3"], block) == {**three, "ranks": 2, "nodes": 1, "min_nodes": 1}
    two = _member(min_nodes=2)
    assert on_nodes_left(two, ["x3"], block) is two  # two nodes left: all it spans
    assert on_nodes_left(two, ["x2", "x3"], block) is two  # one left, fewer than min_nodes: a new block
    plain = _member()
    assert on_nodes_left(plain, ["x2", "x3"], block) is plain  # no min_nodes: it never shrinks
    assert on_nodes_left(three, [], block) is three  # nothing lost
    assert on_nodes_left(three, ["x3"], {**block, "PARSL_MPI_PREFIX": "mpiexec -n 6"}) is three
    assert [fewest_nodes(s) for s in (three, two, plain)] == [1, 2, 2]


def test_the_launch_of_a_member_that_shrank_runs_fewer_ranks_and_its_watcher_keeps_the_block_for_min_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line the app hands to bash: one node left of its block of three, so its two
    ranks per node run there, started as on several nodes (on the hosts left); a member on three
    nodes that lost two of four runs on the two left, watched with the fewest nodes it can run on.
    Under Slurm, one node in a block that lost nodes is an srun step beside the failed one: MPICH's
    mpiexec would start its ranks through an srun step that Slurm holds back."""
    nodefile, run_dir = tmp_path / "nodefile", tmp_path / "run"
    nodefile.write_text("x1\nx2\nx3\n")
    monkeypatch.setenv("PBS_JOBID", "7.pbs")
    monkeypatch.setenv("PBS_NODEFILE", str(nodefile))
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "PARSL_MPI_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    record_lost(str(run_dir), {"PBS_JOBID": "7.pbs"}, ["x2", "x3"])
    command = shlex.split(mpi_train_app.func(_member(min_nodes=1), str(run_dir), ranks=4))
    assert command[:7] == ["mpiexec", "-n", "2", "--ppn", "2", "--hosts", "x1"], command
    written = MemberSpec.from_dict(json.loads((run_dir / "members/m/spec.json").read_text()))
    assert (written.ranks, written.nodes, written.min_nodes) == (2, 1, 1)
    nodefile.write_text("x1\nx2\nx3\nx4\n")
    three = {**_member(min_nodes=1), "ranks": 3, "nodes": 3}
    command = shlex.split(mpi_train_app.func(three, str(run_dir), ranks=3))
    watch = command.index("resilient_flows.training._nodewatch")
    assert command[watch + 1] == "1"  # the block is kept while one node is left
    launch = command[command.index("--") + 1 :]
    assert launch[:7] == ["mpiexec", "-n", "2", "--ppn", "1", "--hosts", "x1,x4"], launch


def test_one_node_in_a_slurm_block_that_lost_nodes_is_an_srun_step_beside_the_failed_one() -> None:
    block = {"SLURM_JOB_ID": "42"}
    srun = "srun --nodes=1 --ntasks=2 --ntasks-per-node=2 --exclude=n2 --overlap --kill-on-bad-exit=0 --wait=60"
    assert launch_prefix(2, 1, block, ["n2"]) == srun
    assert launch_prefix(2, 1, block) == "mpiexec -n 2"  # nothing lost: as always


def test_blocks_outlive_a_lost_node_without_spares_where_a_member_may_shrink() -> None:
    slurm = {
        "executors": [{"type": "HighThroughputExecutor", "provider": {"type": "SlurmProvider", "nodes_per_block": 2}}]
    }
    (provider,) = [e["provider"] for e in with_spares(slurm, 0, survive=True)["executors"]]
    assert provider == {"type": "SlurmProvider", "nodes_per_block": 2, "scheduler_options": "#SBATCH --no-kill"}
    assert with_spares(slurm, 0) is slurm


def test_status_says_how_many_nodes_the_latest_attempt_ran_on() -> None:
    status = MemberStatus("m", 20)
    status.apply({"kind": "started", "member": "m", "attempt": 1, "nodes": 2, "time": 1.0})
    assert member_document(status)["nodes"] == 2
    status.apply({"kind": "started", "member": "m", "attempt": 2, "nodes": 1, "time": 2.0})
    assert (status.attempts, member_document(status)["nodes"]) == (2, 1)
    assert member_document(MemberStatus("one", 5))["nodes"] is None
