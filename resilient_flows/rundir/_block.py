"""Which Parsl block this process runs in: the records a member writes and the requests it obeys
name it, so that a request meant for one attempt is never taken by a later one on a fresh block.

Only the standard library: a member's heartbeat and its control requests read it at every beat.
"""

from __future__ import annotations

import os

#: The variable in which Parsl tells a worker (and the member it runs) which block it is on.
BLOCK_ENV = "PARSL_WORKER_BLOCK_ID"


def current_block() -> str | None:
    """The Parsl block this process runs in; None outside a Parsl worker."""
    return os.environ.get(BLOCK_ENV)
