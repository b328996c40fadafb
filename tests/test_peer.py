"""The peer tier: each node's shards copied to the next node's memory, and restores that read them.

Ranks run as real processes over gloo; each names its own emulated node (``Checkpointer(node=)``),
whose node-local and peer directories no other node reads, and a node is lost by deleting its
directory, as on a cluster where its memory went with it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import run_worker
from test_sharded import launch as launch_ranks

from resilient_flows.checkpoint import Checkpointer, TierSpec
from resilient_flows.checkpoint._manifest import read_manifest
from resilient_flows.checkpoint._peer import Ring, plan_step
from resilient_flows.checkpoint._tiers import Tier

WORKER = Path(__file__).with_name("peer_worker.py")
MPI_WORKER = Path(__file__).with_name("peer_mpi_worker.py")
NODES = "n0,n1,n2"
SHARD = "shard-{:05d}-of-00003.safetensors"


def launch(ranks: int, mode: str, directory: Path, layout: str, nodes: str, *more: str) -> list[dict]:
    return launch_ranks(ranks, mode, directory, layout, nodes, *more, worker=WORKER)


def test_the_ring_sends_each_rank_to_the_same_place_on_the_next_node() -> None:
    ring = Ring(("a", "a", "b", "b", "c"))
    assert ring.nodes == [[0, 1], [2, 3], [4]]
    assert [ring.buddy(r) for r in range(5)] == [2, 3, 4, 4, 0]  # c has one rank: both of b's go there
    assert ring.senders(4) == [2, 3] and ring.senders(1) == []
    assert [ring.leader(r) for r in range(5)] == [True, False, True, False, True]
    alone = Ring(("a", "a"))
    assert not alone.active and alone.buddy(0) is None


def test_a_node_keeps_as_many_copies_as_its_capacity_holds() -> None:
    ring = Ring(("a", "b", "c"))
    manifest = SimpleNamespace(shards=[SimpleNamespace(nbytes=n) for n in (100, 300, 50)])
    plan = plan_step(ring, manifest, capacity=250, keep=3)
    # b receives a's 100 bytes (2 fit), c would receive b's 300 (none fit), a receives c's 50 (keep caps it)
    assert plan.keep == {"b": 2, "a": 3}
    assert plan.skipped == ("c",)
    assert plan.sends == {0: 1, 2: 0}
    assert plan_step(ring, manifest, capacity=None, keep=3).sends == {0: 1, 1: 2, 2: 0}


def test_a_peer_tier_goes_between_the_node_local_tiers_and_the_shared_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="peer tier: it goes after a node-local tier"):
        Checkpointer(tiers=[TierSpec(tmp_path / "p", peer=True), TierSpec(tmp_path / "s")])
    with pytest.raises(ValueError, match="capacity bounds a peer tier"):
        Checkpointer(tiers=[TierSpec(tmp_path / "l", capacity=10), TierSpec(tmp_path / "s")])


@pytest.fixture(scope="module", params=["fsdp"])  # replicated state: the MPI test and the multi-node Slurm tests
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    directory = tmp_path_factory.mktemp(f"peer-{request.param}")
    reports = launch(3, "save", directory, request.param, NODES)
    assert all(r["peer_held_bytes"] > 0 and r["peer_skipped"] == 0 and r["failed"] == 0 for r in reports)
    return directory, request.param


def copy_of(saved: tuple[Path, str], tmp_path: Path, lost: tuple[str, ...]) -> Path:
    directory = tmp_path / "job"
    shutil.copytree(saved[0], directory)
    for node in lost:
        shutil.rmtree(directory / "nodes" / node)
    return directory


def test_each_node_keeps_the_shards_of_the_node_before_it(saved: tuple[Path, str]) -> None:
    directory, _ = saved
    for index, node in enumerate(NODES.split(",")):
        peer = Tier(directory / "nodes" / node / "peer", "peer")
        assert peer.committed_steps() == [5, 4, 3, 2, 1, 0]
        before = (index - 1) % 3
        assert sorted(p.name for p in peer.step_dir(5).iterdir()) == ["manifest.json", SHARD.format(before)]
        local = directory / "nodes" / node / "local" / "step-00000005" / SHARD.format(index)
        assert (peer.step_dir(5) / SHARD.format(before)).read_bytes() == (
            directory / "nodes" / NODES.split(",")[before] / "local" / "step-00000005" / SHARD.format(before)
        ).read_bytes()
        assert local.is_file()
    copies = read_manifest(directory / "shared" / "step-00000005").copies
    assert copies[SHARD.format(1)] == ["local on n1", "peer on n2"]


def test_a_lost_node_is_restored_from_its_buddy_without_reading_the_shared_tier(saved, tmp_path: Path) -> None:
    """The restarted job runs on n0, n2 and a fresh n3; the shared tier holds step 5 too, and
    serves none of it."""
    directory = copy_of(saved, tmp_path, lost=("n1",))
    reports = launch(3, "restore", directory, saved[1], "n0,n3,n2")
    assert [r["step"] for r in reports] == [5, 5, 5]
    assert [r["differ"] for r in reports] == [[], [], []]
    report = reports[0]
    assert report["read_from"] == {
        SHARD.format(0): ["local on n0"],
        SHARD.format(1): ["peer on n2"],
        SHARD.format(2): ["local on n2"],
    }
    assert "shared" not in report["bytes_from"] and report["bytes_from"]["peer on n2"] > 0
    assert all(r["bytes_from"] == report["bytes_from"] for r in reports)
    # the lost node's shard survived on one node only: the next save goes through every tier at once
    assert [r["next_in_shared"] for r in reports] == [True] * 3


def test_a_step_that_only_the_nodes_hold_is_restored_on_a_new_node_from_the_survivors(saved, tmp_path: Path) -> None:
    """Step 5 never reached the shared tier (persist_every): the rank on the new node n3 has no
    copy of it at all, not even its manifest, and still restores it from the others."""
    directory = copy_of(saved, tmp_path, lost=("n1",))
    shutil.rmtree(directory / "shared" / "step-00000005")
    (directory / "shared" / "latest").write_text("2")
    reports = launch(3, "restore", directory, saved[1], "n0,n3,n2")
    assert [(r["step"], r["differ"], r["skipped"]) for r in reports] == [(5, [], [])] * 3
    assert set(reports[0]["bytes_from"]) == {"local on n0", "local on n2", "peer on n2"}


def test_a_node_lost_with_its_buddy_falls_back_to_the_shared_tier(saved, tmp_path: Path) -> None:
    directory = copy_of(saved, tmp_path, lost=("n1", "n2"))
    shutil.rmtree(directory / "nodes" / "n0" / "peer")  # node 2's copy too: only shard 0 is on a node
    reports = launch(3, "restore", directory, saved[1], "n0,n3,n4")
    assert [r["step"] for r in reports] == [5, 5, 5]
    assert [r["differ"] for r in reports] == [[], [], []]
    assert reports[0]["read_from"] == {
        SHARD.format(0): ["local on n0"],
        SHARD.format(1): ["shared"],  # its node and its buddy are gone
        SHARD.format(2): ["shared"],
    }
    assert reports[0]["bytes_from"]["shared"] > 0
    # no peer copy was read: the next save follows persist_every (every third), step 6 is not shared
    assert [r["next_in_shared"] for r in reports] == [False] * 3


def test_a_damaged_peer_copy_gives_way_to_the_shared_tier(saved, tmp_path: Path) -> None:
    directory = copy_of(saved, tmp_path, lost=("n1",))
    copy = directory / "nodes" / "n2" / "peer" / "step-00000005" / SHARD.format(1)
    data = bytearray(copy.read_bytes())
    data[-1] ^= 0xFF
    copy.write_bytes(bytes(data))
    reports = launch(3, "restore", directory, saved[1], "n0,n3,n2")
    assert [r["step"] for r in reports] == [5, 5, 5]
    assert [r["differ"] for r in reports] == [[], [], []]
    assert reports[0]["read_from"][SHARD.format(1)] == ["shared"]


def test_copies_that_do_not_fit_the_capacity_are_not_made(tmp_path: Path) -> None:
    reports = launch(3, "save", tmp_path, "ddp", NODES, "1000")
    assert [(r["peer_skipped"], r["peer_held_bytes"]) for r in reports] == [(6, 0)] * 3
    assert not [p for node in NODES.split(",") for p in (tmp_path / "nodes" / node / "peer").glob("step-*")]
    assert Tier(tmp_path / "shared", "shared").committed_steps() == [5, 2]


@pytest.mark.mpi
def test_over_mpi_a_lost_node_is_restored_from_its_buddy(tmp_path: Path) -> None:
    """mpi4py point to point, a shard in several messages; the shared tier holds every step and
    serves none of the lost node's bytes."""
    saved = run_worker(MPI_WORKER, 2, "save", tmp_path)
    assert all(r["peer_held_bytes"] >= 3 * (12 << 20) for r in saved)  # half of 24 MiB, 3 steps
    shutil.rmtree(tmp_path / "nodes" / "n1")
    reports = run_worker(MPI_WORKER, 2, "restore", tmp_path)
    assert [(r["step"], r["equal"]) for r in reports] == [(2, True), (2, True)]
    assert set(reports[0]["bytes_from"]) == {"local on n0", "peer on n0"}
    assert sum(reports[0]["bytes_from"].values()) == 24 << 20
