"""The wire between a node's checkpoint transfer service and its clients: frames, authentication, bytes.

Both ends treat what arrives as hostile: every frame is length-prefixed and capped before it is
read, parsed as plain JSON (never unpickled), and authenticated with an HMAC over a fresh nonce of
the other end, keyed by the run's secret. So a process that lacks the secret can neither store
nor fetch, and cannot replay a request or pose as a service.

Order of one exchange:

1. the service sends :data:`MAGIC` and its nonce;
2. the client sends a request frame (a JSON object naming its own nonce), authenticated over the
   service's nonce;
3. each reply frame of the service is authenticated over the client's nonce; raw bytes (shards)
   follow a frame that announced their sizes, and are verified by the checksums the authenticated
   frames carry (a manifest's digest in the frame, shard checksums in the manifest).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
from collections.abc import Callable
from typing import Any, BinaryIO

from resilient_flows.capped import parse_json
from resilient_flows.errors import PeerTransferError

MAGIC = b"RFPEER1\n"
NONCE_BYTES = 16
MAC_BYTES = 32
#: The largest frame either end reads: a request or reply is a small JSON object.
FRAME_CAP = 64 << 10
#: Bytes per read or write of a shard on the wire.
CHUNK = 4 << 20
_LENGTH = struct.Struct("!I")


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def mac(secret: bytes, nonce: bytes, body: bytes) -> bytes:
    return hmac.new(secret, nonce + body, hashlib.sha256).digest()


def send_frame(sock: socket.socket, secret: bytes, nonce: bytes, document: dict[str, Any]) -> None:
    """``document`` as JSON, authenticated over the other end's ``nonce``."""
    body = json.dumps(document, separators=(",", ":")).encode()
    sock.sendall(_LENGTH.pack(len(body)) + body + mac(secret, nonce, body))


def recv_frame(sock: socket.socket, secret: bytes, nonce: bytes) -> dict[str, Any]:
    """The next frame, its MAC over our ``nonce`` checked before a byte of it is parsed."""
    (length,) = _LENGTH.unpack(recv_exact(sock, _LENGTH.size))
    if length > FRAME_CAP:
        raise PeerTransferError(f"a frame of {length} bytes, over the {FRAME_CAP} bytes accepted")
    body = recv_exact(sock, length)
    if not hmac.compare_digest(recv_exact(sock, MAC_BYTES), mac(secret, nonce, body)):
        raise PeerTransferError("authentication failed: the frame was not made with this run's secret")
    try:
        document = parse_json(body)
    except ValueError as exc:
        raise PeerTransferError(f"a frame that is not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise PeerTransferError("a frame that is not a JSON object")
    return document


def recv_exact(sock: socket.socket, nbytes: int) -> bytes:
    data = bytearray()
    while len(data) < nbytes:
        got = sock.recv(min(CHUNK, nbytes - len(data)))
        if not got:
            raise PeerTransferError(f"the connection closed {nbytes - len(data)} bytes short")
        data += got
    return bytes(data)


def open_shard(path: os.PathLike | str) -> BinaryIO:
    """A shard file to send, opened without following a symbolic link (it may lead anywhere)."""
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb", buffering=0)


def send_file(sock: socket.socket, source: BinaryIO, nbytes: int) -> None:
    """Exactly ``nbytes`` of the open file ``source``, its size checked first."""
    size = os.fstat(source.fileno()).st_size
    if size != nbytes:
        raise PeerTransferError(f"{source.name} has {size} bytes, its manifest says {nbytes}")
    if nbytes:
        sock.sendfile(source, 0, nbytes)


def recv_to(sock: socket.socket, nbytes: int, write: Callable[[memoryview], None]) -> None:
    """``nbytes`` from the wire handed to ``write`` chunk by chunk (which hashes them)."""
    left = nbytes
    view = memoryview(bytearray(min(CHUNK, max(nbytes, 1))))
    while left:
        got = sock.recv_into(view[: min(CHUNK, left)])
        if not got:
            raise PeerTransferError(f"the connection closed {left} bytes short")
        write(view[:got])
        left -= got
