"""Where a run's checkpoint transfer services and its members' peer copies are: one shared directory.

The run directory's ``peer-services/`` holds

- ``secret``: the key of every request and reply, made once per run, readable by its owner only;
- ``nodes/<host>.json``: each running service's address and port, written when it starts;
- ``copies/<member>.json``: the node holding the member's newest copy, and its step, written
  after the service committed it: what a restore on another node looks for.

Nothing here imports torch: a service registers itself before its own imports end.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilient_flows.capped import read_json_capped
from resilient_flows.durable import write_durably
from resilient_flows.errors import DamagedFileError, FileTooLargeError

_RECORD_CAP = 64 << 10


@dataclass(frozen=True)
class BuddyLink:
    """How a member on one node reaches its buddies: the shared ``registry`` directory (see the
    module's layout) and the member's name, which names its copies on every node."""

    registry: Path
    member: str

    def nodes(self) -> dict[str, tuple[str, int]]:
        """Every registered service: host -> (address, port)."""
        found = {}
        for path in sorted((self.registry / "nodes").glob("*.json")):
            record = _read(path)
            with contextlib.suppress(KeyError, TypeError, ValueError):
                found[str(record["host"])] = (str(record["address"]), int(record["port"]))
        return found

    def buddies(self, node: str) -> list[str]:
        """The other registered nodes, in the order this node tries them: the next in name order first."""
        hosts = sorted(set(self.nodes()) - {node})
        return [h for h in hosts if h > node] + [h for h in hosts if h < node]

    def write_record(self, host: str, step: int) -> None:
        """``host`` holds this member's newest copy, of ``step``."""
        (self.registry / "copies").mkdir(parents=True, exist_ok=True)
        write_durably(self.registry / "copies" / f"{self.member}.json", json.dumps({"host": host, "step": step}))

    def record(self) -> tuple[str, int] | None:
        """The node that holds this member's newest copy, and its step."""
        record = _read(self.registry / "copies" / f"{self.member}.json")
        with contextlib.suppress(KeyError, TypeError, ValueError):
            return str(record["host"]), int(record["step"])
        return None


def run_secret(registry: Path) -> bytes:
    """The run's key, made by whoever needs it first: written aside, then linked into place, so
    that a reader never sees it half written and two makers agree on the first."""
    path = registry / "secret"
    if not path.exists():
        registry.mkdir(parents=True, exist_ok=True)
        tmp = registry / f".secret.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
        tmp.unlink()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as source:
        return bytes.fromhex(source.read(200).strip())


def register(registry: Path, host: str, address: str, port: int) -> None:
    """A service of ``host`` listens at ``address:port`` from now on."""
    (registry / "nodes").mkdir(parents=True, exist_ok=True)
    record = {"host": host, "address": address, "port": port}
    write_durably(registry / "nodes" / f"{host}.json", json.dumps(record))


def _read(path: Path) -> Any:
    try:
        return read_json_capped(path, _RECORD_CAP, "a peer service record")
    except (OSError, ValueError, DamagedFileError, FileTooLargeError):
        return None
