"""Workflows that name a third checkpoint tier: node memory, then node-local disk, then shared."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from resilient_flows.checkpoint._tiers import Tier
from resilient_flows.cli import main
from resilient_flows.errors import WorkflowError
from resilient_flows.training import run_member
from resilient_flows.training._contract import RunContract
from resilient_flows.workflow import load_workflow
from resilient_flows.workflow._plan import plan_workflow

THREE = """\
name: tiers
checkpoint:
  interval: 5
  keep: 20
  tiers: [memory, local, shared]
  persist_every: {local: 2, shared: 2}
members:
  - name: m
    workload: mlp-digits
    steps: 40
    params: {hidden: 8}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "wf.yaml"
    path.write_text(text)
    return path


def committed(path: Path) -> list[int]:
    return sorted(Tier(path, "any").committed_steps())


def test_a_member_checkpoints_through_memory_local_and_shared_and_resumes_from_the_fastest(tmp_path: Path) -> None:
    workflow = load_workflow(write(tmp_path, THREE))
    (spec,) = workflow.member_specs(str(tmp_path / "disk"), memory_root=str(tmp_path / "shm"))
    assert [(t.name, t.path, t.persist_every) for t in spec.checkpoint.tiers] == [
        ("memory", str(tmp_path / "shm/m"), 1),
        ("local", str(tmp_path / "disk/m"), 2),
        ("shared", "checkpoints", 2),
    ]
    run = tmp_path / "run"
    first = run_member(spec.to_dict(), str(run))
    # every 5 steps to memory; every 2nd of those on to the disk, every 2nd of those to the shared tier
    assert committed(tmp_path / "shm/m") == [4, 9, 14, 19, 24, 29, 34, 39]
    assert committed(tmp_path / "disk/m") == [9, 19, 29, 39]
    assert committed(run / "members/m/checkpoints") == [19, 39]
    contract = RunContract.for_member(spec, run, attempt=1)
    assert contract.checkpoint is not None and contract.checkpoint.tiers[0].path == str(tmp_path / "shm/m")
    assert [t.name for t in contract.checkpoint.tiers] == ["memory", "local", "shared"]
    again = run_member(spec.to_dict(), str(run))  # already done: restored from the newest, in memory
    assert again["digest"] == first["digest"]
    for node_tier in ("shm", "disk"):  # the node is lost: what is left is in the shared tier
        shutil.rmtree(tmp_path / node_tier)
    assert run_member(spec.to_dict(), str(run))["digest"] == first["digest"]


def test_a_peer_tier_keeps_other_nodes_copies_in_node_memory_under_the_sites_bound(tmp_path: Path) -> None:
    text = THREE.replace("[memory, local, shared]", "[memory, local, peer, shared]")
    workflow = load_workflow(write(tmp_path, text))
    shm = tmp_path / "shm"
    (spec,) = workflow.member_specs(
        str(tmp_path / "disk"), memory_root=str(shm), peer_root=str(shm / ".peer"), peer_capacity=5
    )
    peer = spec.checkpoint.tier("peer")
    assert peer is not None and (peer.path, peer.capacity) == (str(tmp_path / "shm/.peer/m"), 5)
    contract = RunContract.for_member(spec, tmp_path / "run", attempt=1)
    assert RunContract.from_env(contract.to_env()) == contract
    assert contract.checkpoint is not None
    tiers = contract.checkpoint.tiers
    assert [(t.name, t.peer, t.capacity) for t in tiers] == [
        ("memory", False, None),
        ("local", False, None),
        ("peer", True, 5),
        ("shared", False, None),
    ]


def test_a_site_without_node_scratch_refuses_the_peer_tier(tmp_path: Path) -> None:
    text = THREE.replace("[memory, local, shared]", "[local, peer, shared]").replace("{local: 2, shared: 2}", "2")
    with pytest.raises(WorkflowError, match="name 'peer', but site 'local' has neither memory_scratch nor"):
        plan_workflow(load_workflow(write(tmp_path, text)), "local", build_site=False)


def test_a_site_without_memory_scratch_refuses_the_memory_tier(tmp_path: Path) -> None:
    with pytest.raises(WorkflowError, match="name 'memory', but site 'local' has no memory_scratch"):
        plan_workflow(load_workflow(write(tmp_path, THREE)), "local", build_site=False)


@pytest.mark.parametrize(
    ("tiers", "every", "message"),
    [
        ("[local, memory, shared]", "1", "tiers go fastest first, each once"),
        ("[memory, memory, shared]", "1", "tiers go fastest first, each once"),
        ("[memory, local]", "1", "'shared' must be among the tiers"),
        ("[memory, shared]", "{local: 2}", "persist_every names 'local', which is not one of the tiers after"),
        ("[memory, local, shared]", "{memory: 2}", "checkpoint.persist_every"),
        ("[peer, shared]", "1", "'peer' copies what a node-local tier committed"),
        ("[memory, shared, peer]", "1", "tiers go fastest first, each once"),
    ],
)
def test_bad_tiers_give_one_line_and_exit_2(tmp_path: Path, capsys, tiers: str, every: str, message: str) -> None:
    text = THREE.replace("[memory, local, shared]", tiers).replace("{local: 2, shared: 2}", every)
    assert main(["validate", str(write(tmp_path, text))]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
