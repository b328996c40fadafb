"""``python -m resilient_flows.training._pulse``: answer a peer rank's keepalive for this rank's node.

A rank whose peer's node stops answering (every process there stopped, or its network down)
sees no error: its connections stay open, and its collective waits for torch's timeout. So each
rank of a member on several ranks starts this helper (:mod:`resilient_flows.training._peerwatch`),
which listens on a free port (printed as the first line of its output) and echoes every byte a
peer's keepalive sends. It is a process of its own, not a thread of the rank, so that a rank
whose main thread holds the GIL (a long C call) still answers: only a node (or a rank process)
that stopped altogether falls silent. It exits when the rank that started it is gone.

Only the standard library here: it starts within a rank's start-up, beside ``import torch``.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

#: How often the helper looks whether the rank that started it still lives.
PARENT_LOOK_S = 0.5


def main() -> int:
    parent = os.getppid()
    server = socket.create_server(("", 0))
    server.settimeout(PARENT_LOOK_S)
    print(server.getsockname()[1], flush=True)
    while os.getppid() == parent:
        try:
            connection, _ = server.accept()
        except TimeoutError:
            continue
        threading.Thread(target=_echo, args=(connection,), daemon=True).start()
    return 0


def _echo(connection: socket.socket) -> None:
    """Send back whatever the peer sends, until it hangs up."""
    with connection:
        connection.settimeout(None)
        try:
            while data := connection.recv(64):
                connection.sendall(data)
        except OSError:
            return


if __name__ == "__main__":
    sys.exit(main())
