"""Checkpoints of jobs whose ranks sit on different nodes, each with a node-local tier of its own.

On one machine every rank used to share one local directory, so the per-node copies of a
checkpoint and the fall back to the shared tier when a node's copy is gone were never exercised.
Here each rank's local tier is a directory no other rank reads (an emulated node), and a node is
lost by deleting its directory.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from test_sharded import launch as launch_ranks

from resilient_flows.checkpoint._tiers import Tier

WORKER = Path(__file__).with_name("nodes_worker.py")


def launch(ranks: int, mode: str, directory: Path, layout: str) -> list[dict]:
    return launch_ranks(ranks, mode, directory, layout, worker=WORKER)


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    directory = tmp_path_factory.mktemp(f"nodes-{request.param}")
    launch(2, "save", directory, request.param)
    return directory, request.param


def copy_of(saved: tuple[Path, str], tmp_path: Path) -> Path:
    directory = tmp_path / "job"
    shutil.copytree(saved[0], directory)
    for report in directory.glob("restore-*.json"):
        report.unlink()
    return directory


def test_each_node_holds_its_own_shard_and_its_own_manifest(saved: tuple[Path, str]) -> None:
    directory, _ = saved
    shared = Tier(directory / "shared", "shared").committed_steps()
    assert shared == [5, 2]  # every third checkpoint reached the shared tier
    for rank in range(2):
        node = Tier(directory / "nodes" / f"node-{rank}", "local")
        assert node.committed_steps()[0] == 5
        files = sorted(p.name for p in node.step_dir(5).iterdir())
        assert files == ["manifest.json", f"shard-{rank:05d}-of-00002.safetensors"]  # its own share only


def test_with_every_node_intact_the_newest_local_checkpoint_is_restored(saved, tmp_path: Path) -> None:
    directory = copy_of(saved, tmp_path)
    shutil.rmtree(directory / "shared" / "step-00000005")  # only the nodes have step 5
    (directory / "shared" / "latest").write_text("2")
    reports = launch(2, "restore", directory, saved[1])
    assert [r["step"] for r in reports] == [5, 5]
    assert [r["differ"] for r in reports] == [[], []]
    assert [r["skipped"] for r in reports] == [[], []]


def test_a_lost_node_falls_back_to_the_shared_tier_on_every_rank(saved, tmp_path: Path) -> None:
    directory = copy_of(saved, tmp_path)
    shutil.rmtree(directory / "nodes" / "node-1")
    shutil.rmtree(directory / "shared" / "step-00000005")  # the newest shared copy is older than the nodes'
    (directory / "shared" / "latest").write_text("2")
    reports = launch(2, "restore", directory, saved[1])
    assert [r["step"] for r in reports] == [2, 2]  # node 0 still has 3, 4, 5, but node 1 does not
    assert [r["differ"] for r in reports] == [[], []]


def test_a_job_restarted_on_more_nodes_reads_what_the_old_nodes_kept(saved, tmp_path: Path) -> None:
    """Three ranks, where node 2 is new (empty) and node 1 was lost: step 5, its shard 0 from the
    copy node 0 kept (also for the new rank 2, which has none: rank 0 relays it), shard 1 from
    the shared tier."""
    directory = copy_of(saved, tmp_path)
    shutil.rmtree(directory / "nodes" / "node-1")
    reports = launch(3, "restore", directory, saved[1])
    assert [r["step"] for r in reports] == [5, 5, 5]
    assert [r["differ"] for r in reports] == [[], [], []]
    read_from = reports[0]["read_from"]
    assert all(r["read_from"] == read_from for r in reports)  # every rank is told the whole story
    kept, lost = "shard-00000-of-00002.safetensors", "shard-00001-of-00002.safetensors"
    assert read_from[lost] == ["shared"]
    # new rank 2 takes old rank 0's per-rank values (and under FSDP its overlap of the sharded
    # arrays) from rank 0, which reads them on its node, rather than from the shared tier
    assert read_from[kept] == [f"local on {socket.gethostname()}"]
    shard_bytes = {r["bytes_from"].get("shared", 0) for r in reports}
    assert len(shard_bytes) == 1 and shard_bytes.pop() > 0
