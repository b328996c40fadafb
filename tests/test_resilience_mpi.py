"""resilience.Context with real MPI ranks: each rank checkpoints and gets back its own arrays."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import mpiexec, python_env, run_worker

from resilient_flows.checkpoint import read_checkpoint

pytestmark = [pytest.mark.mpi, pytest.mark.slow]
WORKER = Path(__file__).with_name("resilience_mpi_worker.py")


def test_a_crashed_decomposed_loop_resumes_per_rank_to_the_uninterrupted_arrays(tmp_path: Path) -> None:
    reference = run_worker(WORKER, 2, "reference", tmp_path)
    assert reference[0]["digest"] != reference[1]["digest"]  # the ranks' arrays differ
    subprocess.run(
        [mpiexec(), "-n", "2", sys.executable, str(WORKER), "crash", str(tmp_path)],
        env=python_env(),
        timeout=180,
        check=True,
    )
    _, state = read_checkpoint(tmp_path / "ckpt" / "rod")
    assert set(state["rank_local"]) == {"u", "v"}
    resumed = run_worker(WORKER, 2, "resume", tmp_path)
    # the crash came after iteration 57; 39 was committed (the worker waited for it), 49 may be in flight
    assert resumed[0]["restart"] in (39, 49) and resumed[1]["restart"] == resumed[0]["restart"]
    assert [r["digest"] for r in resumed] == [r["digest"] for r in reference]
    (alone,) = run_worker(WORKER, 1, "resume", tmp_path)  # one rank cannot take both ranks' pieces
    assert (
        "iteration 119 was saved by 2 ranks, each with its own arrays; restart it on 2 ranks, not 1" in alone["error"]
    )
