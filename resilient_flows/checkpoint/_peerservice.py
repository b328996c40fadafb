"""A node's checkpoint transfer service: where members of one node keep their peer copies on another.

A member on one node has no ring over its own ranks (every rank is on the same node), so its peer
copies go to a buddy node through this service: one per node and run, listening on the node's
address. It keeps each member's copies in ``<root>/<member>``, the member's peer tier directory
on this node, in the peer tier's layout (step directories committed by their manifest, ``latest``)
and under the tier's bound: a member's copies never exceed ``capacity`` bytes, as many kept as
fit (at most the ``keep`` the member asks for, at most :data:`MAX_KEEP`), pruned as the peer tier
prunes (:func:`~resilient_flows.checkpoint._peer.copies_within`). A member restarted on another
node fetches its copy back (:mod:`~resilient_flows.checkpoint._buddy`).

Everything a client sends is hostile until checked: requests are authenticated frames
(:mod:`~resilient_flows.checkpoint._wire`); member names are single path components; sizes are
checked against ``capacity`` before a byte of data is read; the manifest is parsed by the same
strict parser as a restore's (shard names fixed by it, no pickle); every shard is hashed on its
way in and committed only when size and checksum match its record, else nothing of it is kept.

Requests (a JSON object, ``nonce``: the client's nonce, hex, that replies are authenticated over):

- ``{"op": "store", "member", "step", "bytes", "keep", "manifest": <its length>}``: the service
  answers ``{"ok": true}`` or why not; then the manifest and every shard in manifest order
  follow, raw; the service answers once the copy is committed, or why it was not;
- ``{"op": "fetch", "member", "step"}``: the service answers ``{"ok": true, "manifest": <length>,
  "xxh3_64": <the manifest's>}``, the manifest and the shards follow.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from resilient_flows.checkpoint._manifest import Manifest, write_manifest
from resilient_flows.checkpoint._peer import Incoming, copies_within
from resilient_flows.checkpoint._summary import read_manifest_bytes
from resilient_flows.checkpoint._tiers import MANIFEST, Tier, shard_path
from resilient_flows.checkpoint._wire import (
    MAGIC,
    new_nonce,
    open_shard,
    recv_exact,
    recv_frame,
    recv_to,
    send_file,
    send_frame,
)
from resilient_flows.errors import CorruptCheckpointError, PeerTransferError

logger = logging.getLogger(__name__)

#: The most copies one member may ask a node to keep.
MAX_KEEP = 16
#: Clients served at once; more wait in the listen queue.
MAX_CLIENTS = 16
#: Seconds a connection may stay silent before the service drops it.
IDLE_S = 60.0
#: The largest manifest accepted: it describes the shards, it is not data.
MANIFEST_LIMIT = 64 << 20
_MEMBER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class PeerService:
    """The service of one node: listens on ``host`` (port ``port``, 0: any free one), or on
    ``listener`` (bound and registered before this module's imports, which take seconds, so that
    clients wait in its queue meanwhile), and keeps members' copies under ``root``, each member's
    at most ``capacity`` bytes."""

    def __init__(
        self,
        root: Path,
        secret: bytes,
        capacity: int,
        host: str = "127.0.0.1",
        port: int = 0,
        listener: socket.socket | None = None,
    ) -> None:
        self.root, self.capacity = Path(root), capacity
        self._secret = secret
        self._listener = listener or socket.create_server((host, port), backlog=MAX_CLIENTS)
        self._listener.settimeout(1.0)
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return host, port

    def serve(self, alive: Callable[[], bool] = lambda: True) -> None:
        """Serve until :meth:`close`, or until ``alive()`` (asked about once a second) says no."""
        while not self._closed.is_set() and alive():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            self._slots.acquire()
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True, name="rf-peer-client").start()
        self._listener.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept at once

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(IDLE_S)
                self._handle(conn)
        except (OSError, PeerTransferError) as exc:  # a client gone or refused: nothing kept of it
            logger.warning("peer copy request refused: %s", exc)
        finally:
            self._slots.release()

    def _handle(self, conn: socket.socket) -> None:
        nonce = new_nonce()
        conn.sendall(MAGIC + nonce)
        request = recv_frame(conn, self._secret, nonce)
        try:
            client = bytes.fromhex(str(request.get("nonce")))
        except ValueError:
            raise PeerTransferError("the request names no nonce to answer over") from None
        try:
            op = request.get("op")
            if op == "store":
                self._store(conn, request, client)
            elif op == "fetch":
                self._fetch(conn, request, client)
            else:
                raise PeerTransferError(f"unknown request {op!r}")
        except (PeerTransferError, CorruptCheckpointError) as exc:
            with contextlib.suppress(OSError):
                send_frame(conn, self._secret, client, {"ok": False, "error": str(exc)})
            raise PeerTransferError(str(exc)) from None

    def _store(self, conn: socket.socket, request: dict[str, Any], client: bytes) -> None:
        tier, step = self._tier(request), _count(request, "step")
        nbytes, length = _count(request, "bytes"), _count(request, "manifest")
        keep = min(max(_count(request, "keep"), 1), MAX_KEEP)
        if nbytes > self.capacity:
            raise PeerTransferError(f"step {step}: {nbytes} bytes exceed this node's bound of {self.capacity} bytes")
        if length > MANIFEST_LIMIT:
            raise PeerTransferError(f"step {step}: a manifest of {length} bytes, over {MANIFEST_LIMIT}")
        send_frame(conn, self._secret, client, {"ok": True})
        text = recv_exact(conn, length)
        manifest = Manifest.from_json(text, f"the manifest of step {step} sent by {tier.path.name}")
        if manifest.step != step or manifest.nbytes != nbytes:
            raise PeerTransferError(f"step {step}: the manifest says step {manifest.step} of {manifest.nbytes} bytes")
        with self._member_lock(tier.path.name):
            receive_step(conn, manifest, tier)
            tier.prune(copies_within(self.capacity, nbytes, keep), {step})
        send_frame(conn, self._secret, client, {"ok": True})

    def _fetch(self, conn: socket.socket, request: dict[str, Any], client: bytes) -> None:
        tier, step = self._tier(request), _count(request, "step")
        step_dir = tier.step_dir(step)
        if step_dir.is_symlink():
            raise PeerTransferError(f"{step_dir} is a symbolic link")
        with self._member_lock(tier.path.name):
            text = read_manifest_bytes(step_dir)
            manifest = Manifest.from_json(text, f"{step_dir.name}/{MANIFEST}")
            paths = [shard_path(step_dir, s.file) for s in manifest.shards]
            handles = [open_shard(p) for p in paths]  # held open: a prune may unlink them meanwhile
        try:
            reply = {"ok": True, "manifest": len(text), "xxh3_64": xxhash.xxh3_64_hexdigest(text)}
            send_frame(conn, self._secret, client, reply)
            conn.sendall(text)
            for handle, shard in zip(handles, manifest.shards, strict=True):
                send_file(conn, handle, shard.nbytes)
        finally:
            for handle in handles:
                handle.close()

    def _tier(self, request: dict[str, Any]) -> Tier:
        member = request.get("member")
        if not isinstance(member, str) or not _MEMBER.match(member) or member in (".", ".."):
            raise PeerTransferError(f"member {member!r} is not a member's name")
        path = self.root / member
        if path.is_symlink():
            raise PeerTransferError(f"{path} is a symbolic link")
        return Tier(path, "peer")

    def _member_lock(self, member: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(member, threading.Lock())


def receive_step(sock: socket.socket, manifest: Manifest, tier: Tier) -> None:
    """Every shard of ``manifest`` from ``sock`` into ``tier``, committed with the manifest once
    all match their records (size and checksum); nothing of a step that was not committed before
    is left otherwise. Both ends use it: a service storing a copy, a member fetching its own."""
    step_dir = tier.step_dir(manifest.step)
    existed = (step_dir / MANIFEST).is_file()
    step_dir.mkdir(parents=True, exist_ok=True)
    if step_dir.is_symlink():
        raise PeerTransferError(f"{step_dir} is a symbolic link")
    incoming = [Incoming(step_dir / s.file, s.nbytes, i) for i, s in enumerate(manifest.shards)]
    try:
        for shard in incoming:
            recv_to(sock, shard.nbytes, shard.write)
            shard.close()
        problem = next((p for p in (s.check(manifest) for s in incoming) if p is not None), None)
        if problem is not None:
            raise PeerTransferError(problem.message)
        for shard in incoming:
            shard.commit()
        write_manifest(step_dir, manifest)
        tier.write_latest(max(tier.committed_steps()))
    except BaseException:
        for shard in incoming:
            shard.close()
            shard.discard()
        if not existed:
            shutil.rmtree(step_dir, ignore_errors=True)
        raise


def _count(request: dict[str, Any], key: str) -> int:
    value = request.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PeerTransferError(f"{key} must be a non-negative integer, got {value!r}")
    return value
