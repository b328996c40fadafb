"""The engine over a torch.distributed process group (gloo), as torchrun users hold it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import python_env
from trainkit import Problem, replicated_digest

from resilient_flows.checkpoint import Checkpointer

WORKER = Path(__file__).with_name("torchdist_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_gloo_ranks_share_the_writing_and_one_process_restores(tmp_path: Path) -> None:
    port = free_port()
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(r), "2", str(port), str(tmp_path)], env=python_env())
        for r in range(2)
    ]
    assert [p.wait(timeout=180) for p in procs] == [0, 0]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["digest"] == ranks[1]["digest"] and [r["restored"] for r in ranks] == [2, 2]
    written = [r["bytes_written"] for r in ranks]
    assert min(written) > 0.8 * sum(written) / 2
    fresh = Problem(seed=7, width=512, depth=3)
    with Checkpointer(tmp_path) as ck:
        assert ck.restore(fresh.state) == 2
    assert replicated_digest(fresh.state) == ranks[0]["digest"]
    assert fresh.state.rank_extra == {"rank": 0}
