"""A paced workload (as ``paced.py``) that records, per attempt, which process imported it: a
warm worker finds it, and torch with it, imported by its parent, the pool's fork server.

Each attempt appends ``{"pid", "parent", "imported_in"}`` to ``params["record"]``
(a JSON line) before its first step; ``params["record"]`` is not part of what it trains.
"""

from __future__ import annotations

import json
import os
from typing import Any

import paced

from resilient_flows.training import TrainContext

#: The process that imported this module (and torch, which ``paced`` imports).
IMPORTED_IN = os.getpid()


def train(ctx: TrainContext) -> dict[str, Any]:
    with open(ctx.params["record"], "a") as record:
        record.write(json.dumps({"pid": os.getpid(), "parent": os.getppid(), "imported_in": IMPORTED_IN}) + "\n")
    return paced.train(ctx)
