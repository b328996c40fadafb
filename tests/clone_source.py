"""A source member whose hand-off to its clones is slow, so that a test can kill it mid-transfer.

``python clone_source.py RUN_DIR NAME``: runs the registered member NAME, with every adoption of a
checkpoint into a clone's tier delayed by two seconds (a slow file system).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from resilient_flows.checkpoint._tiers import Tier
from resilient_flows.training import run_member

original_adopt = Tier.adopt


def slow_adopt(self: Tier, source: Path, step: int) -> Path:
    time.sleep(2.0)
    return original_adopt(self, source, step)


if __name__ == "__main__":
    run_dir, name = sys.argv[1:]
    Tier.adopt = slow_adopt
    spec = json.loads((Path(run_dir) / "members" / name / "spec.json").read_text())
    run_member(spec, run_dir)
