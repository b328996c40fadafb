"""Members that span nodes: ``nodes: 2`` on the ``local-slurm-nodes`` site, for real on the
multi-node cluster of ``.ci/slurm-up --nodes 3 DIR`` (each node a network namespace with its own
host name and address), and the pieces that make it work checked without one.

The cluster is found through ``RESILIENT_FLOWS_NODES_ENV``, the path of its ``DIR/env`` (never
through ``SLURM_CONF``, which names the one-node cluster of the other Slurm tests); the workflow
runs in a subprocess with that file's variables. Without the cluster these tests skip, and fail
where ``RESILIENT_FLOWS_REQUIRE_ALL=1`` (CI, see ``tests/requires.py``). Their names say "slurm":
under xdist they take the one-node Slurm tests' turn (``tests/conftest.py``), since both
clusters' nodes share this machine's CPUs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, python_env
from requires import unmet
from slurm import cancel, cancel_all, node_local_tier, remove_node_scratch, slurm_problem

from resilient_flows.apps import launch_prefix
from resilient_flows.checkpoint import TierSpec
from resilient_flows.errors import LaunchError, SiteConfigError, WorkflowError
from resilient_flows.examples.preemptible import train
from resilient_flows.sites._facts import parse_facts
from resilient_flows.sites._site import SiteFile
from resilient_flows.sites._spares import with_spares
from resilient_flows.training import MemberSpec, read_events, run_member
from resilient_flows.training import _distributed as dist_module
from resilient_flows.training._distributed import init_process_group, use_interface
from resilient_flows.training._lostnodes import dead_hosts, read_lost, record_lost
from resilient_flows.workflow import load_workflow, plan_workflow
from resilient_flows.workflow._runner import resize_members
from resilient_flows.workflow._status import loss_curve

sys.path.append(str(REPO / "benchmarks"))  # the cluster's env file, read as the benchmarks read it
from clusterenv import read_env_file

#: Where CI (``.ci/run``) says the multi-node cluster's ``DIR/env`` is.
NODES_ENV = "RESILIENT_FLOWS_NODES_ENV"
SITE = "local-slurm-nodes"
TOLERANCE = 1e-5

TWO_NODES = """\
name: nodes
site: local-slurm-nodes
retries: 0
checkpoint: {interval: 10}
members:
  - {name: ddp, workload: mlp-digits, steps: 20, seed: 3, nodes: 2, params: {hidden: 32}}
  - {name: fsdp, workload: mlp-digits, steps: 20, seed: 3, nodes: 2, parallel: fsdp, params: {hidden: 32}}
faults:
  - {preempt: ddp, at_step: 12}     # SIGTERM to both ranks: exit 75 through srun, requeued free
"""


# ------------------------------------------------------------------ without a cluster


def test_a_member_on_several_nodes_starts_its_ranks_with_srun_in_its_block() -> None:
    block = {"SLURM_JOB_ID": "42"}
    srun = "srun --nodes=2 --ntasks=4 --ntasks-per-node=2 --kill-on-bad-exit=0 --wait=60"
    assert launch_prefix(4, 2, block) == srun
    assert launch_prefix(2, 1, block) == "mpiexec -n 2"  # one node: as before, also inside Slurm
    assert launch_prefix(2, 2, {**block, "PARSL_MPI_PREFIX": "srun -n 2"}) == "srun -n 2"
    with pytest.raises(LaunchError, match=r"a member on 2 nodes .* in neither \(SLURM_JOB_ID and PBS_NODEFILE"):
        launch_prefix(2, 2, {})


def test_under_pbs_a_member_on_several_nodes_starts_its_ranks_with_pals_mpiexec_on_the_blocks_hosts(
    tmp_path: Path,
) -> None:
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x3006c0s1b0n0\nx3006c0s1b0n0\nx3006c0s7b1n0\nx3006c0s13b0n0\n")  # a host per chunk
    block = {"PBS_JOBID": "1234.polaris-pbs-01", "PBS_NODEFILE": str(nodefile)}
    pals = "mpiexec -n 4 --ppn 2 --hosts x3006c0s1b0n0,x3006c0s7b1n0"
    assert launch_prefix(4, 2, block) == pals
    with pytest.raises(LaunchError, match=rf"a member on 4 nodes, but PBS_NODEFILE={nodefile} lists 3 "):
        launch_prefix(4, 4, block)
    with pytest.raises(LaunchError, match=r"PBS_NODEFILE /nonexistent: "):
        launch_prefix(4, 2, {**block, "PBS_NODEFILE": "/nonexistent"})


def test_watchers_recording_lost_nodes_at_once_keep_every_node(tmp_path: Path) -> None:
    """Watchers of several members of one block, each in its own process, record their dead nodes
    at the same moment: none drops another's."""
    import multiprocessing

    run_dir, hosts = str(tmp_path / "run"), [f"n{i}" for i in range(16)]
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.starmap(record_lost, [(run_dir, {"SLURM_JOB_ID": "42"}, [host]) for host in hosts])
    assert sorted(read_lost(run_dir, {"SLURM_JOB_ID": "42"})) == sorted(hosts)


def test_after_a_node_loss_a_member_launches_on_the_nodes_its_block_has_left(tmp_path: Path) -> None:
    """The node choice: the block's record of its lost nodes, read where the member is launched,
    leaves them out of the srun step (beside the failed step, which Slurm holds until it declares
    the node down) and out of PALS's host list."""
    run_dir, block = str(tmp_path / "run"), {"SLURM_JOB_ID": "42"}
    assert read_lost(run_dir, block) == []
    assert record_lost(run_dir, block, ["n2"]) == ["n2"]
    assert record_lost(run_dir, block, ["n3", "n2"]) == ["n2", "n3"]
    assert read_lost(run_dir, {"SLURM_JOB_ID": "43"}) == []  # another block lost nothing
    assert json.loads((tmp_path / "run/blocks/42/lost-nodes.json").read_text()) == {"job": "42", "nodes": ["n2", "n3"]}
    srun = "srun --nodes=2 --ntasks=4 --ntasks-per-node=2 --exclude=n2,n3 --overlap --kill-on-bad-exit=0 --wait=60"
    assert launch_prefix(4, 2, block, read_lost(run_dir, block)) == srun
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x1\nx1\nx2\nx3\nx4\n")
    pbs = {"PBS_JOBID": "7.pbs", "PBS_NODEFILE": str(nodefile)}
    record_lost(run_dir, pbs, ["x2"])
    assert launch_prefix(4, 2, pbs, read_lost(run_dir, pbs)) == "mpiexec -n 4 --ppn 2 --hosts x1,x3"
    with pytest.raises(
        LaunchError, match=rf"a member on 4 nodes, but PBS_NODEFILE={nodefile} lists 4 .*, 1 of them lost\)"
    ):
        launch_prefix(4, 4, pbs, ["x2"])


def test_a_dead_node_is_one_whose_daemon_refuses_or_does_not_answer() -> None:
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, not listening: refused
        assert dead_hosts(["127.0.0.1", "localhost"], listening.getsockname()[1]) == []
        assert dead_hosts(["127.0.0.1"], closed.getsockname()[1]) == ["127.0.0.1"]


def test_the_launch_watcher_records_a_dead_node_and_ends_the_step_once_a_rank_saw_its_peer_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launch (here a rank that records a peer gone, then hangs as a survivor waiting on a
    dead node would) is killed as soon as the probe finds a node of the block dead: the node is
    recorded for the block and in the member's fault record, with the nodes the block has left."""
    from resilient_flows.training import _nodewatch

    nodefile, member, run_dir = tmp_path / "nodefile", tmp_path / "run/members/m", tmp_path / "run"
    nodefile.write_text("127.0.0.1\nlocalhost\n")
    member.mkdir(parents=True)
    rank = (
        "import sys, time; from pathlib import Path; from resilient_flows.training import record_fault; "
        "record_fault(Path(sys.argv[1]), 0, ConnectionResetError('Connection reset by peer')); time.sleep(120)"
    )
    monkeypatch.setattr(_nodewatch, "dead_hosts", lambda hosts, _port: [h for h in hosts if h == "localhost"])
    monkeypatch.setenv("PBS_JOBID", "9.pbs")
    monkeypatch.setenv("PBS_NODEFILE", str(nodefile))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    began = time.monotonic()
    status = _nodewatch.main(["2", str(member), str(run_dir), "--", sys.executable, "-c", rank, str(member)])
    assert status == 1 and time.monotonic() - began < 120  # killed, not waited for: the rank sleeps 120 s
    assert read_lost(str(run_dir), {"PBS_JOBID": "9.pbs"}) == ["localhost"]
    fault = json.loads((member / "fault.json").read_text())
    assert (fault["kind"], fault["lost_nodes"], fault["nodes_left"], fault["nodes_needed"]) == (
        "peer-lost",
        ["localhost"],
        1,
        2,
    )


def test_spare_nodes_ask_each_block_for_more_nodes_in_a_job_that_outlives_a_node(tmp_path: Path) -> None:
    site = (REPO / "site-configs" / f"{SITE}.yaml").read_text().replace("\nfacts:\n", "\nfacts:\n  spare_nodes: 1\n")
    (tmp_path / "site.yaml").write_text(site)
    env = {
        "RESILIENT_FLOWS_TEST_BRIDGE_ADDR": "10.0.0.1",
        "RESILIENT_FLOWS_TEST_IFNAME": "rf0",
        "RESILIENT_FLOWS_TEST_NODES_DIR": str(tmp_path),
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        opened = SiteFile.open(tmp_path / "site.yaml")
        facts, (executor,) = opened.facts(), opened.config().executors
    assert (facts.nodes, facts.spare_nodes) == (2, 1)  # members plan with 2 nodes; the block holds 3
    assert executor.provider.nodes_per_block == 3
    assert executor.provider.scheduler_options.splitlines()[:2] == ["#SBATCH --no-requeue", "#SBATCH --no-kill"]
    pbs = {
        "executors": [{"type": "HighThroughputExecutor", "provider": {"type": "PBSProProvider", "nodes_per_block": 2}}]
    }
    (provider,) = [e["provider"] for e in with_spares(pbs, 2)["executors"]]
    assert provider == {
        "type": "PBSProProvider",
        "nodes_per_block": 4,
        "scheduler_options": "#PBS -W tolerate_node_failures=all",
    }
    assert with_spares(pbs, 0) is pbs
    for bad in (-1, "one", True):
        with pytest.raises(SiteConfigError, match=rf"s.yaml: facts.spare_nodes must be an integer >= 0, got {bad!r}"):
            parse_facts({"nodes": 2, "cores_per_node": 2, "spare_nodes": bad}, "s", "s.yaml")


def test_nodes_alone_means_a_rank_per_node_and_ranks_must_share_them_evenly(tmp_path: Path) -> None:
    path, site = tmp_path / "wf.yaml", tmp_path / "site.yaml"
    executors = "executors:\n  - {type: HighThroughputExecutor, provider: {type: %s}}\n"
    facts = "facts: {nodes: 2, cores_per_node: 2, network_interface: ib0}\n"
    site.write_text(executors % "SlurmProvider" + facts)
    path.write_text("name: w\nmembers:\n  - {name: a, workload: mlp-digits, steps: 5, nodes: 2}\n")
    ((member),) = plan_workflow(load_workflow(path), str(site), build_site=False).members
    assert (member.ranks, member.nodes, member.ranks_per_node, member.network_interface) == (2, 2, 1, "ib0")
    site.write_text(executors % "PBSProProvider" + facts)  # PALS's mpiexec starts them on the block's nodes
    ((member),) = plan_workflow(load_workflow(path), str(site), build_site=False).members
    assert (member.ranks, member.nodes) == (2, 2)
    site.write_text(executors % "LocalProvider" + facts)  # nothing there starts ranks on other nodes
    with pytest.raises(WorkflowError, match=r"member 'a' spans 2 nodes, .* has LocalProvider provider\(s\)"):
        plan_workflow(load_workflow(path), str(site), build_site=False)
    with pytest.raises(WorkflowError, match=r"member 'a' spans 2 nodes, but a block of site 'local' holds 1"):
        plan_workflow(load_workflow(path), "local", build_site=False)
    path.write_text("name: w\nmembers:\n  - {name: a, workload: mlp-digits, steps: 5, nodes: 2, ranks: 3}\n")
    with pytest.raises(WorkflowError, match=r"member 'a': ranks \(3, the total\) must be a multiple of nodes \(2\)"):
        load_workflow(path)
    path.write_text("name: w\nmembers:\n  - {name: a, command: [echo], steps: 5, nodes: 2}\n")
    with pytest.raises(WorkflowError, match=r"nodes apply to workloads; a command launches its own ranks"):
        load_workflow(path)


def test_a_resize_keeps_the_nodes_that_share_the_new_rank_count() -> None:
    member = MemberSpec(name="m", workload="mlp-digits", params={}, ranks=4, nodes=2)
    assert [(m.ranks, m.nodes) for m in resize_members([member], 6)] == [(6, 2)]
    assert [(m.ranks, m.nodes) for m in resize_members([member], {"m": 3})] == [(3, 1)]
    with pytest.raises(WorkflowError, match="must be a multiple of nodes"):
        replace(member, ranks=3)


def test_the_network_interface_fact_is_an_interface_name() -> None:
    base = {"nodes": 2, "cores_per_node": 2}
    assert parse_facts({**base, "network_interface": "hsn0,hsn1"}, "s", "s.yaml").network_interface == "hsn0,hsn1"
    assert parse_facts(base, "s", "s.yaml").network_interface is None
    with pytest.raises(SiteConfigError, match=r"s.yaml: facts.network_interface must be an interface name"):
        parse_facts({**base, "network_interface": "eth 0"}, "s", "s.yaml")


def test_the_sites_interface_is_exported_for_gloo_unless_the_environment_names_one() -> None:
    loopback = socket.if_nameindex()[0][1]
    env: dict[str, str] = {}
    assert use_interface(loopback, env) == loopback
    assert env == {"GLOO_SOCKET_IFNAME": loopback, "NCCL_SOCKET_IFNAME": loopback}
    assert use_interface("nope0", {"GLOO_SOCKET_IFNAME": loopback}) == loopback  # the user's word wins
    assert use_interface(None, {}) is None
    site = r"GLOO_SOCKET_IFNAME=nope0 \(the site's facts.network_interface\)"
    with pytest.raises(LaunchError, match=rf"{site}: .* has no interface nope0; it has .*{loopback}"):
        use_interface("nope0", {})
    with pytest.raises(LaunchError, match=r"GLOO_SOCKET_IFNAME=nope0 \(set in the environment\)"):
        use_interface(None, {"GLOO_SOCKET_IFNAME": "nope0"})


def test_rank_zeros_host_that_does_not_resolve_names_the_node_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """No rank waits for a rendezvous it can never reach: the error says which variable named the host."""
    for name, value in {
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NODELIST": "gone[1-2]",
        "SLURM_JOB_ID": "7",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PALS_RANKID"):
        monkeypatch.delenv(name, raising=False)

    def unknown(host: str, *args: object, **kwargs: object) -> list:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(dist_module.socket, "getaddrinfo", unknown)
    message = r"srun: rank 0's host 'gone1' \(the first host of SLURM_STEP_NODELIST=gone\[1-2\]\) does not resolve"
    with pytest.raises(LaunchError, match=message):
        init_process_group(timeout=5)


# ------------------------------------------------------------------ on the multi-node cluster


@pytest.fixture(scope="module")
def cluster() -> dict[str, str]:
    """The environment for processes that use the multi-node cluster: this one's, plus its env file."""
    path = os.environ.get(NODES_ENV)
    if not path:
        unmet(f"no multi-node Slurm cluster: {NODES_ENV} is unset (the DIR/env of .ci/slurm-up --nodes 3 DIR)")
    if not os.path.isfile(path):
        unmet(f"no multi-node Slurm cluster: {NODES_ENV}={path} is not a file")
    env = {**python_env(), **read_env_file(path)}
    problem = slurm_problem(env)
    if problem is None and len(env.get("RESILIENT_FLOWS_TEST_NODES", "").split()) < 2:
        problem = "fewer than 2 nodes"
    if problem is not None:
        unmet(f"the multi-node Slurm cluster of {path} cannot run a job on two nodes ({problem})")
    return env


@pytest.fixture(scope="module")
def two_node_run(cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One workflow of two members that span two nodes each (DDP, preempted once, and FSDP), run
    to the end; afterwards its node-local checkpoints are removed from the nodes."""
    root = tmp_path_factory.mktemp("multinode")
    (root / "wf.yaml").write_text(TWO_NODES)
    run_dir = root / "run"
    done = _run_workflow(root / "wf.yaml", run_dir, cluster)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:], _events(run_dir))
    yield run_dir
    remove_node_scratch(node_local_tier(_planned(run_dir, "ddp")), cluster)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_slurm_nodes_without_the_sites_interface_fail_naming_the_variable(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """A site naming an interface the nodes lack: every rank stops before any rendezvous, and the
    run's events say which variable and which value, from which node."""
    site = (REPO / "site-configs" / f"{SITE}.yaml").read_text()
    (tmp_path / "site.yaml").write_text(re.sub(r"(?m)^  network_interface: .*$", "  network_interface: nope0", site))
    (tmp_path / "wf.yaml").write_text(
        "name: wrong-net\nretries: 0\nmembers:\n  - {name: m, workload: mlp-digits, steps: 5, nodes: 2}\n"
    )
    run_dir = tmp_path / "run"
    done = _run_workflow(tmp_path / "wf.yaml", run_dir, cluster, "--site", str(tmp_path / "site.yaml"))
    assert done.returncode != 0
    warnings = [e for e in _events(run_dir) if e["kind"] == "warning" and e["member"] == "m"]
    assert warnings and {e["host"] for e in warnings} <= set(cluster["RESILIENT_FLOWS_TEST_NODES"].split())
    expected = "GLOO_SOCKET_IFNAME=nope0 (the site's facts.network_interface)"
    present = f"has no interface nope0; it has lo, {cluster['RESILIENT_FLOWS_TEST_IFNAME']}"
    assert all(expected in e["reason"] and present in e["reason"] for e in warnings)
    assert [e["kind"] for e in _events(run_dir) if e["kind"] in ("failed", "finished")] == ["failed"]


def _run_workflow(path: Path, run_dir: Path, env: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    """``resilient-flows run`` in a subprocess on the multi-node cluster; its pilot jobs gone after."""
    try:
        return subprocess.run(
            _command(path, run_dir, *options), cwd=path.parent, env=env, capture_output=True, text=True, timeout=240
        )
    finally:
        cancel_all(name_prefix=f"parsl.{SITE}.block-", env=env)


def _command(path: Path, run_dir: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "resilient_flows.cli", "run", str(path), "--run-dir", str(run_dir), *options]


def _assert_losses_of_one_rank(run_dir: Path, spec: MemberSpec, out: Path) -> dict:
    """The member of ``spec`` in ``run_dir`` logged the losses of the same member trained on one
    rank in this process (into ``out``), within float reduction noise, for each of its 20 steps;
    that one rank's result."""
    local = replace(spec.checkpoint, tiers=(TierSpec("checkpoints"),))
    alone = replace(spec, ranks=1, nodes=1, network_interface=None, checkpoint=local, faults=())
    reference = run_member(alone.to_dict(), str(out))
    got, want = loss_curve(run_dir, spec.name), loss_curve(out, spec.name)
    assert sorted(got) == sorted(want) == list(range(20))
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in want)
    assert worst <= TOLERANCE, f"largest relative difference {worst:.2e}"
    return reference


def _events(run_dir: Path) -> list[dict]:
    return list(read_events(run_dir)) if (run_dir / "events.jsonl").exists() else []


def _planned(run_dir: Path, name: str) -> MemberSpec:
    return MemberSpec.from_dict(json.loads((run_dir / "members" / name / "spec.json").read_text()))


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_slurm_member_on_two_nodes_runs_a_rank_on_each_host(two_node_run: Path, cluster: dict[str, str]) -> None:
    nodes = cluster["RESILIENT_FLOWS_TEST_NODES"].split()
    for name, attempts in (("ddp", 2), ("fsdp", 1)):
        started = [e for e in _events(two_node_run) if e["kind"] == "started" and e["member"] == name]
        assert len(started) == attempts
        for event in started:
            hosts = event["hosts"]
            assert len(hosts) == 2 and len(set(hosts)) == 2 and set(hosts) <= set(nodes), event
            assert event["host"] == hosts[0]
        spec = _planned(two_node_run, name)
        assert (spec.ranks, spec.nodes, spec.network_interface) == (2, 2, cluster["RESILIENT_FLOWS_TEST_IFNAME"])
        # Each rank wrote its shard to node-local scratch on its own node (the site's ${SLURMD_NODENAME}).
        local = node_local_tier(spec)
        assert local is not None and "${SLURMD_NODENAME}" in local
        for rank, host in enumerate(hosts):
            step = Path(local.replace("${SLURMD_NODENAME}", host)) / "step-00000019"
            assert sorted(p.name for p in step.glob("shard-*")) == [f"shard-{rank:05d}-of-00002.safetensors"]


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_slurm_member_on_two_nodes_stopped_by_a_signal_is_requeued_free(two_node_run: Path) -> None:
    """Both ranks exit 75 after committing step 12; srun hands that status on, so it costs no retry."""
    events = [e for e in _events(two_node_run) if e["member"] == "ddp"]
    (failed,) = [e for e in events if e["kind"] == "failed"]
    assert failed["cost"] == 0.0 and failed["cause"] == "preempted", failed
    assert [e["step"] for e in events if e["kind"] == "resumed"] == [12]


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_slurm_member_on_two_nodes_trains_like_one_rank(two_node_run: Path, tmp_path: Path, name: str) -> None:
    """The global batch is split over the nodes: the losses are one rank's, within float reduction
    noise, also across ddp's preemption and resume."""
    reference = _assert_losses_of_one_rank(two_node_run, _planned(two_node_run, name), tmp_path)
    result = json.loads((two_node_run / "members" / name / "result.json").read_text())
    assert abs(result["test_loss"] - reference["test_loss"]) <= TOLERANCE * reference["test_loss"]


# ------------------------------------------------------------------ losing a node

#: The ddp member of TWO_NODES, paced (``chaos:paced``: the same training, a pause after each step)
#: so that a node can be lost between two of its checkpoints, every 4 steps; each node also keeps
#: a copy of the other's shards (the peer tier).
NODE_LOSS = """\
name: node-loss
site: local-slurm-nodes
retries: 2
checkpoint: {interval: 4, tiers: [local, peer, shared]}
members:
  - {name: ddp, workload: "chaos:paced", steps: 20, seed: 3, nodes: 2, params: {hidden: 32, pause_ms: 250}}
"""
#: Lose the node once the member logged this step: after the checkpoints of steps 3 and 7.
LOSE_AFTER = 9


def _slurm_node(action: str, node: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [str(REPO / ".ci" / "slurm-node"), action, node], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def _wait_for(what: str, predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.1)


def _lose_during_run(
    cluster: dict[str, str], tmp_path: Path, both: bool, rank: int = 0, spares: int = 0, workflow: str = NODE_LOSS
) -> tuple[Path, list[dict], list[str]]:
    """Run NODE_LOSS and, once the member logged step LOSE_AFTER, crash the node of its rank
    ``rank`` (0: the node its block's worker pool runs on; 1: the other one, where only a rank
    runs) or, with ``both``, both its nodes together; a crashed node boots again, empty, once
    the run ended (or, with ``both``, at once). ``spares``: the site's ``facts.spare_nodes``;
    ``workflow``: NODE_LOSS or a variant of it. The run directory, its events and the first
    attempt's hosts."""
    run_dir, env, runner = _start_node_loss_run(cluster, tmp_path, spares, workflow)
    lost: list[str] = []
    try:
        _wait_for(f"step {LOSE_AFTER}", lambda: max(loss_curve(run_dir, "ddp"), default=-1) >= LOSE_AFTER, 180)
        (started,) = [e for e in _events(run_dir) if e["kind"] == "started"]
        lost = list(started["hosts"] if both else started["hosts"][rank : rank + 1])
        for node in lost:
            _slurm_node("down", node, env)
        if both:  # one node is left: the member needs two, so the crashed ones must come back
            for node in lost:
                _slurm_node("up", node, env)
            lost = []
        out, err = runner.communicate(timeout=300)
    finally:
        runner.kill()
        cancel_all(name_prefix=f"parsl.{SITE}.block-", env=env)
        for node in lost:
            _slurm_node("up", node, env)
    events = _events(run_dir)
    assert runner.returncode == 0, (out[-2000:], err[-3000:], events)
    return run_dir, events, started["hosts"]


def _assert_same_weights(run_dir: Path, uninterrupted: Path) -> None:
    """The member ended with the uninterrupted run's weights, bit for bit."""
    result = json.loads((run_dir / "members/ddp/result.json").read_text())
    assert result["digest"] == json.loads((uninterrupted / "members/ddp/result.json").read_text())["digest"]


def _resumed_within(run_dir: Path, events: list[dict], intervals: int, attempt: int = 2) -> dict:
    """The resume of ``attempt`` (the first, by default): from a checkpoint taken before it, at most
    ``intervals`` checkpoints behind the newest one and the step the attempt before reached (1: the
    newest; 2: the shared tier's copy of it may not have been flushed when every node holding it
    crashed)."""
    (resumed,) = [e for e in events if e["kind"] == "resumed" and e["attempt"] == attempt]
    committed = [e["step"] for e in events if e["kind"] == "checkpointed" and e["time"] < resumed["time"]]
    metrics = [json.loads(line) for line in (run_dir / "members/ddp/metrics.jsonl").read_text().splitlines()]
    reached = max(m["step"] for m in metrics if m["attempt"] == attempt - 1)
    assert resumed["step"] in committed[-intervals:] and reached - resumed["step"] <= 4 * intervals, (
        committed,
        reached,
        resumed,
    )
    return resumed


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(420)
def test_slurm_member_that_lost_a_node_resumes_on_the_nodes_left_and_the_node_serves_again_when_back(
    two_node_run: Path, cluster: dict[str, str], tmp_path: Path
) -> None:
    """The node of the member's rank 0 and its worker pool crashes between two checkpoints (every
    process in its namespace SIGKILLed, its node-local scratch deleted). Slurm marks it down and
    ends the block; Parsl starts another on the two nodes left; the member resumes there from
    the newest checkpoint, reading the shard the surviving node kept locally and the lost one
    from the copy the survivor kept of it (its peer tier), not a byte from the shared tier, and
    ends with the weights of the uninterrupted run, bit for bit (same layout). The node, back,
    runs jobs again."""
    run_dir, events, hosts = _lose_during_run(cluster, tmp_path, both=False)
    lost, survivor = hosts
    (second,) = [e for e in events if e["kind"] == "started" and e["attempt"] == 2]
    assert lost not in second["hosts"] and survivor in second["hosts"] and len(set(second["hosts"])) == 2, second
    resumed = _resumed_within(run_dir, events, intervals=1)
    # Each old rank's shard: the survivor's from its node-local copy, the lost node's from the copy
    # the survivor kept of it; nothing from the shared tier.
    ranks = {host: f"shard-{rank:05d}-of-00002.safetensors" for rank, host in enumerate(hosts)}
    assert resumed["read_from"] == {f"local on {survivor}": [ranks[survivor]], f"peer on {survivor}": [ranks[lost]]}
    assert set(resumed["bytes_from"]) == {f"local on {survivor}", f"peer on {survivor}"}, resumed["bytes_from"]
    _assert_same_weights(run_dir, two_node_run)
    # The node is back: a job on all three nodes runs a task on each.
    nodes = cluster["RESILIENT_FLOWS_TEST_NODES"].split()
    script = tmp_path / "all.sh"
    script.write_text("#!/bin/sh\nsrun hostname\n")
    out_file = tmp_path / "all.out"
    subprocess.run(
        ["sbatch", "--wait", f"-N{len(nodes)}", "-o", str(out_file), str(script)],
        env=cluster,
        check=True,
        timeout=120,
        capture_output=True,
    )
    assert sorted(out_file.read_text().split()) == sorted(nodes)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(420)
def test_slurm_member_that_lost_the_node_of_its_rank_1_spends_no_retry(cluster: dict[str, str], tmp_path: Path) -> None:
    """The node of rank 1 crashes; the block's worker pool, on rank 0's node, lives on. Whichever
    sees it first (the srun step failing as its peer's connection resets, Slurm marking the node
    down and ending the block, the watchdog), the fault is the machine's: no failure is charged,
    no retry is sent into the block that lost the node, and the member resumes on a new block
    without the lost node from its newest checkpoint and finishes."""
    run_dir, events, hosts = _lose_during_run(cluster, tmp_path, both=False, rank=1)
    survivor, lost = hosts
    failed = [e for e in events if e["kind"] == "failed"]
    assert failed and all(e["cost"] == 0.0 for e in failed), failed
    assert all(e["failure_kind"] == "infrastructure" for e in failed), failed
    started = [e for e in events if e["kind"] == "started"]
    first_block = started[0]["block"]
    assert all(e["block"] != first_block for e in started[1:]), started
    assert all(lost not in e["hosts"] for e in started[1:]), started
    assert [e["kind"] for e in events if e["kind"] in ("finished", "failed")][-1] == "finished"
    _resumed_within(run_dir, events, intervals=1)
    assert survivor in started[-1]["hosts"]


@contextlib.contextmanager
def _crashing(runner: subprocess.Popen, env: dict[str, str]) -> Iterator[list[str]]:
    """The nodes a test crashes (or stops) go into the list this yields: however the test ends, the
    runner is killed, the run's blocks cancelled and the nodes still down (or stopped) crashed
    for good and booted again."""
    down: list[str] = []
    try:
        yield down
    finally:
        runner.kill()
        cancel_all(name_prefix=f"parsl.{SITE}.block-", env=env)
        for node in down:
            _slurm_node("down", node, env)
            _slurm_node("up", node, env)


def _start_node_loss_run(
    cluster: dict[str, str], tmp_path: Path, spares: int = 1, workflow: str = NODE_LOSS
) -> tuple[Path, dict[str, str], subprocess.Popen]:
    """``workflow`` (NODE_LOSS or a variant) started on ``local-slurm-nodes`` with ``spare_nodes:
    spares``: its run directory, the runner's environment and the runner."""
    env = {**cluster, "PYTHONPATH": os.pathsep.join([str(REPO / "benchmarks"), cluster["PYTHONPATH"]])}
    (tmp_path / "wf.yaml").write_text(workflow)
    site = (REPO / "site-configs" / f"{SITE}.yaml").read_text()
    (tmp_path / "site.yaml").write_text(site.replace("\nfacts:\n", f"\nfacts:\n  spare_nodes: {spares}\n"))
    run_dir = tmp_path / "run"
    command = _command(tmp_path / "wf.yaml", run_dir, "--site", str(tmp_path / "site.yaml"))
    runner = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return run_dir, env, runner


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "members/ddp/metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(420)
def test_slurm_member_whose_rank_1_node_falls_silent_restarts_on_the_spare_of_its_block(
    two_node_run: Path, cluster: dict[str, str], tmp_path: Path
) -> None:
    """Every process of rank 1's node stopped (SIGSTOP): no connection closes and its slurmd's port
    still accepts; only the surviving rank's keepalive can tell, in seconds (not torch's 30-minute
    timeout). It exits 76, the watcher records the node lost and ends the step; the retry, free,
    restarts in the block on the survivor and the spare, to the uninterrupted run's weights."""
    run_dir, env, runner = _start_node_loss_run(cluster, tmp_path)
    with _crashing(runner, env) as down:
        _wait_for(f"step {LOSE_AFTER}", lambda: max(loss_curve(run_dir, "ddp"), default=-1) >= LOSE_AFTER, 180)
        (first,) = [e for e in _events(run_dir) if e["kind"] == "started"]
        survivor, silent = first["hosts"]
        down.append(silent)
        _slurm_node("stop", silent, env)
        out, err = runner.communicate(timeout=300)
    events = _events(run_dir)
    assert runner.returncode == 0, (out[-2000:], err[-3000:], events)
    (spare,) = set(cluster["RESILIENT_FLOWS_TEST_NODES"].split()) - {survivor, silent}
    (block,) = [e for e in events if e["kind"] == "block_started"]
    (failed,) = [e for e in events if e["kind"] == "failed"]
    assert (failed["cost"], failed["failure_kind"]) == (0.0, "infrastructure"), failed
    assert f"the node {silent} of the next rank went silent" in failed["cause"], failed
    assert f"node(s) {silent} lost, 2 left in its block" in failed["cause"], failed
    second = [e for e in events if e["kind"] == "started"][1]
    assert str(second["block"]) == str(block["block"]) and second["hosts"] == [survivor, spare], second
    lost = json.loads((run_dir / "blocks" / block["job_id"] / "lost-nodes.json").read_text())["nodes"]
    assert lost == [silent]
    _assert_same_weights(run_dir, two_node_run)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(420)
def test_slurm_member_whose_spare_died_unnoticed_gets_a_new_block_when_its_own_node_dies(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """The idle spare crashes first: nothing runs there, so nothing notices. Then rank 1's node
    crashes; the probe finds both dead, one node left: the block is retired, and the member
    resumes on a new block (which, holding a spare too, waits for both nodes to boot again), the
    fault free."""
    run_dir, env, runner = _start_node_loss_run(cluster, tmp_path)
    with _crashing(runner, env) as down:
        _wait_for("the member's start", lambda: any(e["kind"] == "started" for e in _events(run_dir)), 180)
        (first,) = [e for e in _events(run_dir) if e["kind"] == "started"]
        survivor, lost = first["hosts"]
        (spare,) = set(cluster["RESILIENT_FLOWS_TEST_NODES"].split()) - {survivor, lost}
        down.append(spare)
        _slurm_node("down", spare, env)
        _wait_for(
            f"step {LOSE_AFTER}", lambda: max((m["step"] for m in _metrics(run_dir)), default=-1) >= LOSE_AFTER, 180
        )
        down.append(lost)
        _slurm_node("down", lost, env)
        _wait_for("the fault", lambda: any(e["kind"] == "failed" for e in _events(run_dir)), 120)
        while down:  # both boot again: a new block, spare included, holds the three nodes
            _slurm_node("up", down.pop(0), env)
        out, err = runner.communicate(timeout=300)
    events = _events(run_dir)
    assert runner.returncode == 0, (out[-2000:], err[-3000:], events)
    (failed,) = [e for e in events if e["kind"] == "failed"]
    assert (failed["cost"], failed["failure_kind"]) == (0.0, "infrastructure") and "left in its block" not in failed[
        "cause"
    ]
    blocks = [e for e in events if e["kind"] == "block_started"]
    record = json.loads((run_dir / "blocks" / blocks[0]["job_id"] / "lost-nodes.json").read_text())
    assert sorted(record["nodes"]) == sorted([lost, spare]), record
    first, second = [e for e in events if e["kind"] == "started"]
    assert len(blocks) == 2 and str(second["block"]) == blocks[1]["block"], (blocks, second)
    assert [e["kind"] for e in events if e["kind"] in ("finished", "failed")][-1] == "finished"


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(480)
def test_slurm_member_that_lost_two_nodes_in_a_row_uses_the_spare_then_a_new_block(
    two_node_run: Path, cluster: dict[str, str], tmp_path: Path
) -> None:
    """One spare (``spare_nodes: 1``: a block holds the three nodes, submitted with ``--no-kill``),
    two losses. Rank 1's node crashes: the surviving rank records its peer gone, the launch watcher
    finds the dead node, records it for the block and ends the step without waiting for Slurm to
    declare the node down; the retry, free, restarts in the same block on the survivor and the
    spare (``srun --exclude``), reading the lost shard from the survivor's peer copy (0 bytes from
    the shared tier). Then the spare, now rank 1's node, dies too. The block has one node left,
    fewer than the member spans: it is retired, and the member resumes on a new block (which,
    holding a spare too, waits for both nodes to boot again) to the uninterrupted run's weights,
    bit for bit. Both faults are free."""
    run_dir, env, runner = _start_node_loss_run(cluster, tmp_path)

    def attempt_steps(attempt: int) -> list[int]:
        return [m["step"] for m in _metrics(run_dir) if m["attempt"] == attempt]

    with _crashing(runner, env) as down:
        _wait_for(f"step {LOSE_AFTER}", lambda: max(attempt_steps(1), default=-1) >= LOSE_AFTER, 180)
        (first,) = [e for e in _events(run_dir) if e["kind"] == "started"]
        down.append(first["hosts"][1])
        _slurm_node("down", down[-1], env)
        _wait_for("the restart's first step", lambda: bool(attempt_steps(2)), 180)
        second = [e for e in _events(run_dir) if e["kind"] == "started"][-1]
        down.append(second["hosts"][1])
        _slurm_node("down", down[-1], env)
        _wait_for("the second fault", lambda: len([e for e in _events(run_dir) if e["kind"] == "failed"]) == 2, 120)
        while down:  # both boot again: a new block, spare included, holds the three nodes
            _slurm_node("up", down.pop(0), env)
        out, err = runner.communicate(timeout=300)
    events = _events(run_dir)
    assert runner.returncode == 0, (out[-2000:], err[-3000:], events)
    survivor, lost, spare = first["hosts"][0], first["hosts"][1], second["hosts"][1]
    assert second["hosts"] == [survivor, spare] and spare != lost, (first, second)
    blocks = [e for e in events if e["kind"] == "block_started"]
    started = [e for e in events if e["kind"] == "started"]
    assert [str(e["block"]) for e in started] == [blocks[0]["block"], blocks[0]["block"], blocks[1]["block"]]
    assert len(blocks) == 2, blocks
    failed = [e for e in events if e["kind"] == "failed"]
    assert [(e["cost"], e["failure_kind"]) for e in failed] == [(0.0, "infrastructure")] * 2, failed
    assert failed[0]["cause"].endswith(f"node(s) {lost} lost, 2 left in its block"), failed[0]
    assert "left in its block" not in failed[1]["cause"], failed[1]  # none to spare: the block was retired
    record = json.loads((run_dir / "blocks" / blocks[0]["job_id"] / "lost-nodes.json").read_text())
    assert record == {"job": blocks[0]["job_id"], "nodes": [lost, spare]}
    on_the_spare = _resumed_within(run_dir, events, intervals=1)
    ranks = {host: f"shard-{rank:05d}-of-00002.safetensors" for rank, host in enumerate(first["hosts"])}
    read = {f"local on {survivor}": [ranks[survivor]], f"peer on {survivor}": [ranks[lost]]}
    assert on_the_spare["read_from"] == read, on_the_spare
    assert set(on_the_spare["bytes_from"]) == set(read), on_the_spare["bytes_from"]
    _assert_same_weights(run_dir, two_node_run)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(420)
def test_slurm_member_that_lost_a_node_and_its_buddy_resumes_from_the_shared_tier(
    two_node_run: Path, cluster: dict[str, str], tmp_path: Path
) -> None:
    """Both nodes of the member crash together, each with the other's peer copy: nothing of the
    checkpoint is left on any node, and the member resumes (on nodes that booted again, empty)
    from the shared tier alone, to the uninterrupted run's weights."""
    run_dir, events, _ = _lose_during_run(cluster, tmp_path, both=True)
    resumed = _resumed_within(run_dir, events, intervals=2)
    shards = [f"shard-{rank:05d}-of-00002.safetensors" for rank in range(2)]
    assert resumed["read_from"] == {"shared": shards} and list(resumed["bytes_from"]) == ["shared"], resumed
    _assert_same_weights(run_dir, two_node_run)


#: NODE_LOSS's member allowed to shrink to one node, every checkpoint kept: the test continues the
#: one it resumed from on one rank itself.
SHRINK = NODE_LOSS.replace("shared]}", "shared], keep: 10}").replace("nodes: 2,", "nodes: 2, min_nodes: 1,")


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(420)
def test_slurm_member_that_may_shrink_goes_on_on_the_node_left_in_its_block_without_a_spare(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """``min_nodes: 1``, no spare: the block holds the member's two nodes, submitted with
    ``--no-kill`` all the same. Rank 1's node crashes; the retry, free, runs at once in the same
    block on the node left, one rank, restoring the two ranks' checkpoint resharded from the
    survivor's own and peer copies (no other block is ever submitted). Its weights are bit for bit
    those of one rank continuing, in this process, from the checkpoint the retry resumed from (the
    same layouts at the same steps), and within float reduction noise (1e-5 relative, as two ranks
    against one) of one rank's uninterrupted run: its losses at every step and its final test loss."""
    run_dir, events, hosts = _lose_during_run(cluster, tmp_path, both=False, rank=1, workflow=SHRINK)
    survivor, lost = hosts
    (block,) = [e for e in events if e["kind"] == "block_started"]
    failed = [e for e in events if e["kind"] == "failed"]
    assert [(e["cost"], e["failure_kind"]) for e in failed] == [(0.0, "infrastructure")], failed
    assert f"node(s) {lost} lost, 1 left in its block" in failed[0]["cause"], failed
    first, second = [e for e in events if e["kind"] == "started"]
    assert str(first["block"]) == str(second["block"]) == str(block["block"]), (first, second, block)
    assert (first["nodes"], second["nodes"], second["host"]) == (2, 1, survivor), second
    record = json.loads((run_dir / "blocks" / block["job_id"] / "lost-nodes.json").read_text())
    assert record == {"job": block["job_id"], "nodes": [lost]}
    resumed = _resumed_within(run_dir, events, intervals=1)
    # The one rank reads both old ranks' shards: its own node's copy and its copy of the lost node's.
    shards = [f"shard-{rank:05d}-of-00002.safetensors" for rank in range(2)]
    assert resumed["read_from"] == {f"local on {survivor}": shards[:1], f"peer on {survivor}": shards[1:]}, resumed
    spec = _planned(run_dir, "ddp")  # the spec its last attempt ran: one rank on one node
    assert (spec.ranks, spec.nodes, spec.min_nodes) == (1, 1, 1)
    shared = run_dir / "members/ddp/checkpoints"
    reference = tmp_path / "from-resume"
    step = f"step-{resumed['step']:08d}"
    shutil.copytree(shared / step, reference / "members/ddp/checkpoints" / step)
    alone = replace(spec, network_interface=None, checkpoint=replace(spec.checkpoint, tiers=(TierSpec("checkpoints"),)))
    continued = run_member(replace(alone, params={**spec.params, "pause_ms": 0}).to_dict(), str(reference))
    result = json.loads((run_dir / "members/ddp/result.json").read_text())
    assert result["digest"] == continued["digest"]
    one_rank = _assert_losses_of_one_rank(run_dir, alone, tmp_path / "uninterrupted")
    assert abs(result["test_loss"] - one_rank["test_loss"]) <= TOLERANCE * one_rank["test_loss"]


# ------------------------------------------------------------------ preempting across nodes


def _sbatch(env: dict[str, str], *args: str) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", *args], env=env, capture_output=True, text=True, check=True, timeout=30
    )
    return out.stdout.strip().split(";")[0]


def _job_state(env: dict[str, str], job_id: str) -> str:
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], env=env, capture_output=True, text=True
    )
    return out.stdout.strip()


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_slurm_agent_counting_nodes_preempts_a_two_node_job_for_a_one_node_request(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """All three nodes are busy: "wide" on two (checkpointing every step), "narrow" on one
    (checkpointed once, at its start). A one-node on-demand job arrives. Preempting narrow
    frees just enough nodes but throws away all its work; preempting wide frees more than
    needed yet loses at most a step on each of its two nodes, so the agent (``--unit nodes``)
    preempts wide, the request runs, and wide, requeued, resumes to the uninterrupted weights."""
    steps = 100
    run = f"exec {sys.executable} -m resilient_flows.examples.preemptible {{}} --steps {steps} --every {{}}"
    ids: list[str] = []
    try:
        wide, narrow = tmp_path / "wide", tmp_path / "narrow"
        for directory in (wide, narrow):
            directory.mkdir()
        ids.append(_sbatch(cluster, "-N2", "--exclusive", "--requeue", "-J", "rf-mn-wide", "-o", str(wide / "out"),
                           "--wrap", run.format(wide, 1)))  # fmt: skip
        ids.append(_sbatch(cluster, "-N1", "--exclusive", "--requeue", "-J", "rf-mn-narrow", "-o", str(narrow / "out"),
                           "--wrap", run.format(narrow, 10_000)))  # fmt: skip
        beats = [d / "shared" / "checkpoint-heartbeat.json" for d in (wide, narrow)]
        _wait_for("both heartbeats published", lambda: all(b.exists() for b in beats), 60)
        time.sleep(2.0)  # narrow's one checkpoint ages
        ids.append(_sbatch(cluster, "-N1", "--exclusive", "-J", "rf-mn-ondemand", "--comment=rf-ondemand",
                           "-o", "/dev/null", "--wrap", "sleep 2"))  # fmt: skip
        ondemand = ids[-1]
        _wait_for("the on-demand job pending", lambda: _job_state(cluster, ondemand) == "PENDING", 30)
        log = tmp_path / "agent.jsonl"
        agent = [str(Path(sys.executable).with_name("resilient-flows")), "cosched", "agent", "--unit", "nodes",
                 "--interval", "0.5", "--grace", "20", "--log", str(log)]  # fmt: skip

        def events() -> list[dict]:
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

        with open(tmp_path / "agent.out", "wb") as out:
            process = subprocess.Popen(agent, env=cluster, stdout=out, stderr=out)
            try:
                _wait_for("the victim released", lambda: any(e["event"] == "release" for e in events()), 120)
            finally:
                process.kill()
                process.wait()
        (decision,) = [e for e in events() if e["event"] == "decision"]
        assert decision["decision"]["preempt"] == [ids[0]] and decision["acted"], decision
        sizes = {job["id"]: job["nodes"] for job in decision["inputs"]["running"]}
        assert sizes == {ids[0]: 2, ids[1]: 1}, decision["inputs"]
        assert _job_state(cluster, ondemand) in ("RUNNING", "COMPLETING", "COMPLETED")
        _wait_for("the victim finished", lambda: (wide / "final.npy").exists(), 120)
        np.testing.assert_array_equal(np.load(wide / "final.npy"), train(steps))
        starts = [line.split() for line in (wide / "starts").read_text().splitlines()]
        assert len(starts) == 2 and int(starts[1][0]) >= 0  # resumed from its checkpoint, not restarted
    finally:
        cancel(ids, cluster)


# ------------------------------------------------------------------ PBS Pro, through its fakes

#: A PBS Pro site whose blocks hold two nodes, its worker pool on the first (SimpleLauncher), as
#: ALCF documents for MPI applications under Parsl; ``qsub``, ``qstat`` and PALS's ``mpiexec`` are
#: the fakes of ``tests/fakesched/pbspro``, which run every "node" on this machine.
PBS_SITE = """\
executors:
  - type: HighThroughputExecutor
    label: pbs-nodes
    address: 127.0.0.1
    poll_period: 100
    max_workers_per_node: 1
    heartbeat_period: 5
    heartbeat_threshold: 30
    provider:
      type: PBSProProvider
      queue: debug
      nodes_per_block: 2
      cpus_per_node: 2
      init_blocks: 1
      min_blocks: 0
      max_blocks: 1
      walltime: "00:10:00"
      launcher: {{type: SimpleLauncher}}
      worker_init: export PATH={path}
retries: 0
facts:
  nodes: 2
  cores_per_node: 2
  gpus_per_node: 0
  walltime: 10m
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pbs_member_on_two_nodes_starts_its_ranks_with_pals_mpiexec_and_trains_like_one_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As far as the fakes go: the block's two hosts come from ``$PBS_NODEFILE``, the ranks start
    through PALS's ``mpiexec --ppn 1 --hosts`` and meet at the node file's first host on a port
    from ``$PBS_JOBID`` (the fake's ranks have no MPI to carry the rendezvous, as a PALS job whose
    mpi4py was built against another MPI would not); the losses are one rank's."""
    from fakesched import PBSPRO, engine

    from resilient_flows.cli import main

    sched = tmp_path / "sched"
    path = os.pathsep.join([str(PBSPRO), str(Path(sys.executable).parent), os.environ["PATH"]])
    monkeypatch.setenv("PATH", path)
    monkeypatch.setenv(engine.DIR_ENV, str(sched))
    monkeypatch.setenv(engine.NODES_ENV, "127.0.0.1,localhost")  # two names for this machine: two "nodes"
    monkeypatch.delenv(engine.QUEUE_SECONDS_ENV, raising=False)
    for name in [n for n in os.environ if n.startswith(("SLURM_JOB", "PBS_"))]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site.yaml").write_text(PBS_SITE.format(path=path))
    (tmp_path / "wf.yaml").write_text(
        "name: pbs\nmembers:\n  - {name: m, workload: mlp-digits, steps: 20, seed: 3, nodes: 2, params: {hidden: 32}}\n"
    )
    run_dir = tmp_path / "run"
    try:
        assert (
            main(["run", str(tmp_path / "wf.yaml"), "--site", str(tmp_path / "site.yaml"), "--run-dir", str(run_dir)])
            == 0
        )
        (job,) = engine.numbers(sched)
        assert engine.record(sched, job)["hosts"] == ["127.0.0.1", "localhost"]
        calls = [json.loads(line) for line in (sched / "mpiexec.jsonl").read_text().splitlines()]
        (member_call,) = [argv for argv in calls if "resilient_flows.training.mpi_member" in argv]
        assert member_call[:6] == ["-n", "2", "--ppn", "1", "--hosts", "127.0.0.1,localhost"]
    finally:
        engine.delete_all(sched)
    spec = _planned(run_dir, "m")
    assert (spec.ranks, spec.nodes) == (2, 2)
    (started,) = [e for e in _events(run_dir) if e["kind"] == "started"]
    assert len(started["hosts"]) == 2
    _assert_losses_of_one_rank(run_dir, spec, tmp_path / "alone")


# ------------------------------------------------------------------ Parsl's MPIExecutor


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_slurm_member_under_parsls_mpi_executor_gets_its_nodes_and_ranks_and_trains_like_srun(
    two_node_run: Path, cluster: dict[str, str], tmp_path: Path
) -> None:
    """``local-slurm-nodes`` with Parsl's ``MPIExecutor`` (``mpi_launcher: srun``): MPI mode refuses
    a task without a resource specification, so the runner gives every task its nodes and ranks;
    Parsl picks the block's nodes and composes ``$PARSL_MPI_PREFIX``, which launches the member.
    Its weights are the ``srun`` step's of the same member, bit for bit."""
    site = (REPO / "site-configs" / f"{SITE}.yaml").read_text()
    site = site.replace("type: HighThroughputExecutor", "type: MPIExecutor\n    mpi_launcher: srun")
    site = re.sub(r"(?m)^    max_workers_per_node: 2 .*$", "    max_workers_per_block: 2", site)
    assert "MPIExecutor" in site and "max_workers_per_block" in site
    (tmp_path / "site.yaml").write_text(site)
    (tmp_path / "wf.yaml").write_text(
        "name: mpi\nretries: 0\ncheckpoint: {interval: 10}\nmembers:\n"
        "  - {name: ddp, workload: mlp-digits, steps: 20, seed: 3, nodes: 2, params: {hidden: 32}}\n"
        "  - {name: one, workload: mlp-digits, steps: 5, seed: 4, params: {hidden: 32}}\n"
    )
    run_dir = tmp_path / "run"
    done = _run_workflow(tmp_path / "wf.yaml", run_dir, cluster, "--site", str(tmp_path / "site.yaml"))
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:], _events(run_dir))
    assert {e["member"] for e in _events(run_dir) if e["kind"] == "finished"} == {"one", "ddp"}
    (started,) = [e for e in _events(run_dir) if e["kind"] == "started" and e["member"] == "ddp"]
    assert len(set(started["hosts"])) == 2, started
    result = json.loads((run_dir / "members/ddp/result.json").read_text())
    assert result["digest"] == json.loads((two_node_run / "members/ddp/result.json").read_text())["digest"]
