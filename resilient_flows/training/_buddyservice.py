"""One checkpoint transfer service per node and run, for the peer copies of members on one node.

The first member on a node whose tiers name ``peer`` starts it (:func:`ensure_service`), detached,
so that it outlives that member: it keeps the copies of members running on other nodes, which
still need them after the member that started it finished. It ends with the run: once the
runner let go of its lease, or has been gone past its orphan timeout (checked every few seconds);
a node that crashes takes it along, with its copies.

One per node: the service holds a lock on a file in the node-local peer directory for its
lifetime; a member that can take that lock knows none runs, and starts one (two that race both
start one, and the second to reach the lock leaves at once). Services register their address in
the run directory (``peer-services/``, :mod:`~resilient_flows.checkpoint._buddy`), where the
members find them.

usage: python -m resilient_flows.training._buddyservice RUN_DIR PEER_ROOT CAPACITY
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from resilient_flows.checkpoint._registry import BuddyLink, register, run_secret
from resilient_flows.rundir._lease import read_lease

logger = logging.getLogger(__name__)

#: Seconds between two looks at the runner's lease.
LEASE_CHECK_S = 5.0
_LOCK = ".service.lock"


def registry(run_dir: str | os.PathLike) -> Path:
    """Where a run's services register and its members record where their copies are."""
    return Path(run_dir) / "peer-services"


def run_is_held(run_dir: str | os.PathLike) -> bool:
    """A runner holds the run: its lease is neither let go of nor expired."""
    lease = read_lease(run_dir)
    return lease is not None and not lease.ended and not lease.expired


def ensure_service(run_dir: str | os.PathLike, peer_root: Path, capacity: int) -> None:
    """Start this node's service, keeping copies under ``peer_root``, unless one runs."""
    peer_root.mkdir(parents=True, exist_ok=True)
    with open(peer_root / _LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a service holds it
        fcntl.flock(lock, fcntl.LOCK_UN)
    with open(peer_root / "service.log", "ab") as log:
        command = [sys.executable, "-m", __name__, str(run_dir), str(peer_root), str(capacity)]
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


def buddy_link(run_dir: str | os.PathLike, member: str, peer_dir: Path, capacity: int) -> BuddyLink | None:
    """How ``member`` (on one node, its peer tier in ``peer_dir``) reaches its buddies, this node's
    service started for its peers; None outside a workflow, where no service runs."""
    if not run_is_held(run_dir):
        return None
    ensure_service(run_dir, peer_dir.parent, capacity)
    return BuddyLink(registry(run_dir), member)


def node_address() -> str:
    """The address other nodes reach this one at: its host name's."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def serve(run_dir: Path, peer_root: Path, capacity: int) -> int:
    """Listen and register first: the service's imports (torch, for the manifest) take seconds,
    during which members that send a copy wait in the listen queue instead of passing this node over."""
    lock = open(peer_root / _LOCK, "a")  # noqa: SIM115  (held, with its lock, for the service's life)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another one won the race
    listener = socket.create_server((node_address(), 0), backlog=16)
    address, port = listener.getsockname()[:2]
    register(registry(run_dir), socket.gethostname(), address, port)
    from resilient_flows.checkpoint._peerservice import PeerService  # imports torch

    service = PeerService(peer_root, run_secret(registry(run_dir)), capacity, listener=listener)
    logger.info("serving peer copies of %s at %s:%d", run_dir, address, port)
    looked, held = 0.0, True

    def alive() -> bool:
        nonlocal looked, held
        if time.monotonic() - looked >= LEASE_CHECK_S:
            looked, held = time.monotonic(), run_is_held(run_dir)
        return held

    service.serve(alive)
    logger.info("the run ended: no more peer copies served")
    return 0


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run_dir, peer_root, capacity = argv
    return serve(Path(run_dir), Path(peer_root), int(capacity))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
