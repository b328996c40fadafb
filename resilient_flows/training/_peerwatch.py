"""A rank notices within seconds that its peer's node went silent, and ends its attempt as the machine's fault.

A peer rank that dies is seen at once: its connections close, the collective fails, and the rank
records a ``peer-lost`` fault (:mod:`resilient_flows.training._faults`). A peer whose node stops
answering without closing anything (every process there stopped, its network down) is not: the
collective waits for torch's timeout, 30 minutes. So the ranks of a member form a ring of
keepalives when their group forms: each starts a helper that echoes (:mod:`._pulse`), they
exchange where their helpers listen, and each rank's thread sends a byte to the next rank's
helper every :data:`PERIOD_S`. No echo (or no connection) within the silence limit
(:data:`SILENT_S`, or ``$RESILIENT_FLOWS_PEER_SILENT_S`` seconds): the next rank's node is silent.
The rank records a ``peer-lost`` fault naming that host in ``silent_hosts`` (the node watcher of
:mod:`._nodewatch` records it as lost: its slurmd may still accept connections, a stopped
process's kernel does), says so on stderr and exits :data:`EXIT_PEER_LOST` at once, since its
main thread is blocked in the collective. Its own connections then close, so every other rank
fails its collective in turn.

A refused connection or a hang-up is the next rank's process gone while its node answers: its
collectives see that too, and this watch stops. A ring keeps it one connection per rank,
whatever the world's size.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resilient_flows.training._contract import EXIT_PEER_LOST
from resilient_flows.training._faults import record_silent_peer

#: Seconds between two keepalives to the next rank.
PERIOD_S = 0.5
#: Seconds without an answer after which the next rank's node counts as silent.
SILENT_S = 5.0
#: The variable that overrides :data:`SILENT_S`.
SILENT_VARIABLE = "RESILIENT_FLOWS_PEER_SILENT_S"


class PeerWatch:
    """The keepalive of one rank to the next rank's helper at ``host:port``.

    ``on_silent(host, reason)`` runs once, from the watch's thread, when that node fell silent
    (by default :func:`end_attempt`, which does not return)."""

    def __init__(
        self,
        host: str,
        port: int,
        silent_s: float,
        on_silent: Callable[[str, str], None],
        helper: subprocess.Popen | None = None,
    ) -> None:
        self.host, self.port, self.silent_s = host, port, silent_s
        self.on_silent, self.helper = on_silent, helper
        self.echoes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peer-keepalive", daemon=True)

    def start(self) -> PeerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching and end this rank's helper: a peer watching this rank then sees it hang up."""
        self._stop.set()
        self._thread.join(timeout=self.silent_s + 1)
        if self.helper is not None and self.helper.poll() is None:
            self.helper.kill()
            self.helper.wait()

    def _run(self) -> None:
        try:
            connection = socket.create_connection((self.host, self.port), timeout=self.silent_s)
        except TimeoutError:
            self._silent(f"no connection to its keepalive within {self.silent_s:g} s")
            return
        except OSError:
            return  # refused or unreachable at once: the process is gone, its node answers
        with connection:
            while not self._stop.wait(PERIOD_S):
                try:
                    connection.sendall(b".")
                    answered = connection.recv(1)
                except TimeoutError:
                    self._silent(f"no answer to its keepalive for {self.silent_s:g} s")
                    return
                except OSError:
                    return
                if not answered:
                    return  # hung up: the peer finished or died, and its node said so
                self.echoes += 1

    def _silent(self, reason: str) -> None:
        if not self._stop.is_set():
            self.on_silent(self.host, reason)


def silent_limit_s() -> float:
    """The silence limit: ``$RESILIENT_FLOWS_PEER_SILENT_S`` where it is a positive number, else :data:`SILENT_S`."""
    with contextlib.suppress(ValueError):
        value = float(os.environ.get(SILENT_VARIABLE, ""))
        if value > 0:
            return value
    return SILENT_S


#: The helper :func:`prestart_helper` started, until :func:`start_helper` takes it.
_prestarted: subprocess.Popen | None = None


def prestart_helper() -> None:
    """Start this rank's helper now, while the rank imports torch: its own start-up (an
    interpreter's) is then off the rank's path to training. :func:`start_helper` takes it."""
    global _prestarted
    if _prestarted is None:
        _prestarted = _spawn()


def start_helper() -> tuple[subprocess.Popen | None, int | None]:
    """This rank's echoing helper (the one started ahead, else a new one) and its port; (None,
    None) where it could not start."""
    global _prestarted
    helper, _prestarted = _prestarted or _spawn(), None
    if helper is None:
        return None, None
    line = helper.stdout.readline().strip() if helper.stdout is not None else ""
    if not line.isdigit():
        helper.kill()
        helper.wait()
        return None, None
    return helper, int(line)


def _spawn() -> subprocess.Popen | None:
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "resilient_flows.training._pulse"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
    except OSError:
        return None


def watch_peers(group: Any, rank: int, world_size: int, directory: Path) -> PeerWatch | None:
    """The ring's keepalive of this rank (of ``world_size`` in the torch process ``group``) to
    the next rank; a collective: every rank calls it. None on one rank. Where the next rank's
    helper did not start, a watch of nothing (that node is watched by nobody, as before), whose
    :meth:`~PeerWatch.stop` still ends this rank's helper."""
    if world_size < 2:
        return None
    import torch.distributed as dist

    helper, port = start_helper()
    where: list[Any] = [None] * world_size
    dist.all_gather_object(where, (socket.gethostname(), port), group=group)
    host, peer_port = where[(rank + 1) % world_size]
    if peer_port is None:
        return PeerWatch(host, 0, 0.0, _ignore, helper)  # nothing to watch; stop() still ends the helper
    ended = functools.partial(end_attempt, directory, rank)
    return PeerWatch(host, int(peer_port), silent_limit_s(), ended, helper).start()


def end_attempt(directory: Path, rank: int, host: str, reason: str) -> None:
    """Record the silent peer node and end this rank now with :data:`EXIT_PEER_LOST`: its main
    thread waits in a collective that no peer will complete."""
    record_silent_peer(directory, rank, host, f"the node {host} of the next rank went silent: {reason}")
    print(f"a peer rank is gone: its node {host} went silent ({reason})", file=sys.stderr, flush=True)
    os._exit(EXIT_PEER_LOST)


def _ignore(host: str, reason: str) -> None:
    """Nothing to do for a peer that is not watched."""
