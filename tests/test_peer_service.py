"""Peer copies of members on one node: a node's transfer service, what it refuses, and restores
that fetch a lost node's copy back from it.

The service runs in a thread of this process on the loopback; it is registered as node ``b``
and the members name their own nodes (``Checkpointer(node=)``), so that ``a`` sends to ``b`` and
a member restarted on ``c`` fetches from ``b``.
"""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from resilient_flows.checkpoint import Checkpointer, TierSpec
from resilient_flows.checkpoint._buddy import _Session, fetch_copy, send_copy
from resilient_flows.checkpoint._manifest import Manifest, read_manifest
from resilient_flows.checkpoint._peerservice import PeerService
from resilient_flows.checkpoint._registry import BuddyLink, register, run_secret
from resilient_flows.checkpoint._tiers import Tier
from resilient_flows.errors import PeerTransferError

MEMBER = "m"


class Node:
    """Node ``b``'s service over ``root``, registered in ``registry``."""

    def __init__(self, registry: Path, root: Path, capacity: int) -> None:
        self.root = root
        self.service = PeerService(root, run_secret(registry), capacity)
        register(registry, "b", *self.service.address)
        self.thread = threading.Thread(target=self.service.serve, daemon=True)
        self.thread.start()

    def held(self) -> list[str]:
        """Every file the service keeps of the member, by path under its directory."""
        base = self.root / MEMBER
        return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()) if base.exists() else []

    def stop(self) -> None:
        self.service.close()
        self.thread.join(timeout=10)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    started = Node(tmp_path / "registry", tmp_path / "b-peer", capacity=1 << 20)
    yield started
    started.stop()


def _state(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 32, generator=generator), "step": seed}


def _tiers(tmp_path: Path, host: str, link: BuddyLink | None) -> list[TierSpec]:
    return [
        TierSpec(tmp_path / host / "local"),
        TierSpec(tmp_path / host / "peer", peer=True, capacity=1 << 20, buddies=link),
        TierSpec(tmp_path / "shared"),
    ]


def _saved(tmp_path: Path, steps: tuple[int, ...] = (1,)) -> tuple[Path, Manifest]:
    """Checkpoints of ``steps`` in a plain local tier (no buddies): the newest one's directory and manifest."""
    with Checkpointer(tiers=_tiers(tmp_path, "a", None), node="a") as ck:
        for step in steps:
            ck.save(step, _state(step))
    step_dir = Tier(tmp_path / "a" / "local", "local").step_dir(steps[-1])
    return step_dir, read_manifest(step_dir)


def test_a_copy_sent_to_the_buddy_is_kept_there_and_fetched_back_verified(node: Node, tmp_path: Path) -> None:
    link = BuddyLink(tmp_path / "registry", MEMBER)
    step_dir, manifest = _saved(tmp_path)
    assert send_copy(link, "a", step_dir, manifest, keep=2) == "b"
    assert link.record() == ("b", 1)
    shard = manifest.shards[0].file
    assert node.held() == ["latest", "step-00000001/manifest.json", f"step-00000001/{shard}"]
    assert (node.root / MEMBER / "step-00000001" / shard).read_bytes() == (step_dir / shard).read_bytes()
    into = Tier(tmp_path / "c" / "peer", "peer")
    assert fetch_copy(link, "c", [], into) == 1
    assert (into.step_dir(1) / shard).read_bytes() == (step_dir / shard).read_bytes()
    assert into.committed_steps() == [1]
    # where the step is here already, nothing is fetched; nor from the node that asks
    assert fetch_copy(link, "c", [into], Tier(tmp_path / "d", "peer")) is None
    assert fetch_copy(link, "b", [], Tier(tmp_path / "d", "peer")) is None


def test_a_node_keeps_a_members_copies_within_its_bound(tmp_path: Path) -> None:
    step_dir, manifest = _saved(tmp_path, steps=(1, 2, 3))
    node = Node(tmp_path / "registry", tmp_path / "b-peer", capacity=2 * manifest.nbytes + 10)
    try:
        link = BuddyLink(tmp_path / "registry", MEMBER)
        local = step_dir.parent
        for step in (1, 2, 3):
            send_copy(link, "a", local / f"step-{step:08d}", read_manifest(local / f"step-{step:08d}"), keep=3)
        assert Tier(node.root / MEMBER, "peer").committed_steps() == [3, 2]  # two fit, though 3 are asked for
    finally:
        node.stop()


def test_a_request_without_the_runs_secret_is_refused(node: Node, tmp_path: Path) -> None:
    step_dir, manifest = _saved(tmp_path)
    other = tmp_path / "other-registry"
    run_secret(other)
    shutil.copytree(tmp_path / "registry" / "nodes", other / "nodes")
    with pytest.raises(PeerTransferError, match="no buddy node took the copy: b: the connection closed"):
        send_copy(BuddyLink(other, MEMBER), "a", step_dir, manifest, keep=2)
    assert node.held() == []


def test_a_copy_over_the_nodes_bound_is_refused_before_its_data(tmp_path: Path) -> None:
    step_dir, manifest = _saved(tmp_path)
    node = Node(tmp_path / "registry", tmp_path / "b-peer", capacity=manifest.nbytes - 1)
    try:
        with pytest.raises(PeerTransferError, match=f"{manifest.nbytes} bytes exceed this node's bound"):
            send_copy(BuddyLink(tmp_path / "registry", MEMBER), "a", step_dir, manifest, keep=2)
        assert node.held() == []
    finally:
        node.stop()


@pytest.mark.parametrize("member", ["../escape", "a/b", "..", "", "/etc"])
def test_a_member_name_that_is_not_one_path_component_is_refused(node: Node, tmp_path: Path, member: str) -> None:
    link = BuddyLink(tmp_path / "registry", member)
    with _Session(link, link.nodes()["b"]) as session, pytest.raises(PeerTransferError, match="is not a member's name"):
        session.request({"op": "store", "member": member, "step": 1, "keep": 1, "bytes": 1, "manifest": 1})
    assert node.held() == [] and not (tmp_path / "escape").exists()


def test_a_shard_that_does_not_match_its_checksum_is_not_kept(node: Node, tmp_path: Path) -> None:
    step_dir, manifest = _saved(tmp_path)
    shard = step_dir / manifest.shards[0].file
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only the checksum tells
    shard.write_bytes(bytes(data))
    with pytest.raises(PeerTransferError, match="does not match its record"):
        send_copy(BuddyLink(tmp_path / "registry", MEMBER), "a", step_dir, manifest, keep=2)
    assert node.held() == []


def test_a_damaged_copy_at_the_buddy_is_not_fetched(node: Node, tmp_path: Path) -> None:
    link = BuddyLink(tmp_path / "registry", MEMBER)
    step_dir, manifest = _saved(tmp_path)
    send_copy(link, "a", step_dir, manifest, keep=2)
    kept = node.root / MEMBER / "step-00000001" / manifest.shards[0].file
    data = bytearray(kept.read_bytes())
    data[-1] ^= 0xFF
    kept.write_bytes(bytes(data))
    into = Tier(tmp_path / "c" / "peer", "peer")
    assert fetch_copy(link, "c", [], into) is None
    assert into.step_dirs() == {}


def test_a_member_that_lost_its_node_restores_from_its_buddy_without_the_shared_tier(
    node: Node, tmp_path: Path
) -> None:
    """Saved on node a (each checkpoint's copy sent to b), resumed on node c after a is gone: the
    copy is fetched from b and read, 0 bytes from the shared tier, the state exact; the next save
    goes through every tier again, and the fetched copy is not left on c."""
    link = BuddyLink(tmp_path / "registry", MEMBER)
    with Checkpointer(tiers=_tiers(tmp_path, "a", link), node="a", keep=2) as ck:
        for step in (1, 2):
            ck.save(step, _state(step))
    assert link.record() == ("b", 2)
    shutil.rmtree(tmp_path / "a")  # node a is lost
    state = _state(0)
    with Checkpointer(tiers=_tiers(tmp_path, "c", link), node="c", keep=2) as ck:
        assert ck.restore(state) == 2
        assert list(ck.restored.bytes_from) == ["peer on c"] and ck.restored.bytes_from["peer on c"] > 0
        assert Tier(tmp_path / "c" / "peer", "peer").step_dirs() == {}
        assert torch.equal(state["w"], _state(2)["w"]) and state["step"] == 2
        ck.save(3, state)
    assert Tier(tmp_path / "shared", "shared").committed_steps()[0] == 3
    assert link.record() == ("b", 3)


def test_without_another_node_nothing_is_sent_and_a_dead_node_is_passed_over(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    link = BuddyLink(registry, MEMBER)
    step_dir, manifest = _saved(tmp_path)
    register(registry, "a", "127.0.0.1", 9)  # this node's own service: no buddy of itself
    assert send_copy(link, "a", step_dir, manifest, keep=2) is None
    with socket.socket() as closed:  # a port nothing listens on any more: a node that died
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
    register(registry, "ab", "127.0.0.1", dead_port)  # tried first, in name order after "a"
    node = Node(registry, tmp_path / "b-peer", capacity=1 << 20)
    try:
        assert send_copy(link, "a", step_dir, manifest, keep=2) == "b"
        assert link.record() == ("b", 1)
    finally:
        node.stop()


def test_only_a_peer_tier_reaches_buddies(tmp_path: Path) -> None:
    link = BuddyLink(tmp_path / "registry", MEMBER)
    with pytest.raises(ValueError, match=r"tiers\[0\].buddies reach other nodes' copies: only a peer tier"):
        Checkpointer(tiers=[TierSpec(tmp_path / "l", buddies=link), TierSpec(tmp_path / "s")])
