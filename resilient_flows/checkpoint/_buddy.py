"""Peer copies of a member that runs on one node: sent to a buddy node's transfer service, fetched back.

The peer tier of a member on several nodes is a ring over its own ranks; a member on one node
has none, so its rank 0 sends each checkpoint that reached the peer tier (manifest and every
shard, read from the node-local tier where its ranks committed it) to the service of another node
(:mod:`~resilient_flows.checkpoint._peerservice`), which keeps it in memory under the tier's bound.

Where the services and the copies are is in the run directory
(:mod:`~resilient_flows.checkpoint._registry`).

The buddy is chosen without asking anyone: the registered nodes in name order, starting after
this one (the next node of the block, or of another block), the first that takes the copy. On
restore, where this node's own tiers lack the recorded step, rank 0 fetches it into this node's
peer tier directory, each shard verified against the manifest on its way in; the restore then
reads it there like any peer copy, before the shared tier.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import xxhash

from resilient_flows.checkpoint._manifest import Manifest
from resilient_flows.checkpoint._peerservice import MANIFEST_LIMIT, receive_step
from resilient_flows.checkpoint._registry import BuddyLink, run_secret
from resilient_flows.checkpoint._tiers import Tier
from resilient_flows.checkpoint._wire import (
    MAGIC,
    NONCE_BYTES,
    new_nonce,
    open_shard,
    recv_exact,
    recv_frame,
    send_file,
    send_frame,
)
from resilient_flows.errors import CorruptCheckpointError, PeerTransferError

logger = logging.getLogger(__name__)

#: Seconds to reach a service: a dead node must not hold a flush up for long.
CONNECT_S = 3.0
#: Seconds a transfer may stay silent.
IO_S = 60.0


def send_copy(link: BuddyLink, node: str, step_dir: Path, manifest: Manifest, keep: int) -> str | None:
    """The committed step in ``step_dir`` sent to the first buddy of ``node`` that takes it; that
    buddy's host, once recorded; None when no other node's service is registered (one node, or
    the others not started yet). PeerTransferError when every buddy refused or was unreachable."""
    nodes, problems = link.nodes(), []
    buddies = link.buddies(node)
    if not buddies:
        return None
    for host in buddies:
        try:
            with _Session(link, nodes[host]) as session:
                session.store(step_dir, manifest, keep)
        except (OSError, PeerTransferError) as exc:
            problems.append(f"{host}: {exc}")
            continue
        link.write_record(host, manifest.step)
        return host
    raise PeerTransferError("no buddy node took the copy: " + "; ".join(problems))


def fetch_copy(link: BuddyLink, node: str, tiers: list[Tier], into: Tier) -> int | None:
    """Where ``tiers`` (this node's) lack the member's newest recorded copy, fetch it from its node
    into ``into``; the step fetched, or None (nothing to fetch, or it failed: said in the log)."""
    recorded = link.record()
    if recorded is None or recorded[0] == node:
        return None
    host, step = recorded
    if any(step in tier.committed_steps() for tier in tiers):
        return None
    address = link.nodes().get(host)
    try:
        if address is None:
            raise PeerTransferError(f"no service of {host} is registered")
        with _Session(link, address) as session:
            session.fetch(step, into)
    except (OSError, PeerTransferError, CorruptCheckpointError) as exc:
        logger.warning("the peer copy of step %d on %s could not be fetched: %s", step, host, exc)
        return None
    logger.info("fetched the peer copy of step %d from %s", step, host)
    return step


class _Session:
    """One authenticated exchange with a service."""

    def __init__(self, link: BuddyLink, address: tuple[str, int]) -> None:
        self.link = link
        self.secret = run_secret(link.registry)
        self.sock = socket.create_connection(address, timeout=CONNECT_S)
        self.sock.settimeout(IO_S)
        hello = recv_exact(self.sock, len(MAGIC) + NONCE_BYTES)
        if not hello.startswith(MAGIC):
            self.sock.close()
            raise PeerTransferError(f"{address[0]}:{address[1]} is not a checkpoint transfer service")
        self.theirs, self.ours = hello[len(MAGIC) :], new_nonce()

    def __enter__(self) -> _Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def request(self, document: dict[str, Any]) -> dict[str, Any]:
        send_frame(self.sock, self.secret, self.theirs, {**document, "nonce": self.ours.hex()})
        return self.reply()

    def reply(self) -> dict[str, Any]:
        answer = recv_frame(self.sock, self.secret, self.ours)
        if answer.get("ok") is not True:
            raise PeerTransferError(f"refused: {answer.get('error')}")
        return answer

    def store(self, step_dir: Path, manifest: Manifest, keep: int) -> None:
        text = manifest.to_json().encode()
        sources = [open_shard(step_dir / shard.file) for shard in manifest.shards]
        try:
            request = {"op": "store", "member": self.link.member, "step": manifest.step, "keep": keep}
            self.request({**request, "bytes": manifest.nbytes, "manifest": len(text)})
            self.sock.sendall(text)
            for source, shard in zip(sources, manifest.shards, strict=True):
                send_file(self.sock, source, shard.nbytes)
            self.reply()
        finally:
            for source in sources:
                source.close()

    def fetch(self, step: int, into: Tier) -> None:
        answer = self.request({"op": "fetch", "member": self.link.member, "step": step})
        length = answer.get("manifest")
        if not isinstance(length, int) or not 0 < length <= MANIFEST_LIMIT:
            raise PeerTransferError(f"a manifest of {length!r} bytes")
        text = recv_exact(self.sock, length)
        if xxhash.xxh3_64_hexdigest(text) != answer.get("xxh3_64"):
            raise PeerTransferError("the manifest does not match the digest its reply carried")
        manifest = Manifest.from_json(text, f"the fetched manifest of step {step}")
        if manifest.step != step:
            raise PeerTransferError(f"asked for step {step}, got step {manifest.step}")
        receive_step(self.sock, manifest, into)
