"""Shared fixtures: a small deterministic training problem whose losses we can compare exactly."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tiers(tmp_path: Path) -> tuple[Path, Path]:
    """A (shared, local) pair of tier directories."""
    return tmp_path / "shared", tmp_path / "local"


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests compare losses bit for bit; keep reductions on one deterministic thread."""
    import torch

    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def python_env() -> dict[str, str]:
    """Environment for child processes: the repo importable, one thread each."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env
