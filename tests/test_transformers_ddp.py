"""Hugging Face ``Trainer`` under DDP on two CPU ranks (gloo, started by ``torchrun`` as users start it),
trained from the resumable loader: every process SIGKILLed mid-epoch after a committed checkpoint, as
a node failure would, the resumed run starts at the committed data position, trains every sample
of each epoch once across the ranks, and ends at an uninterrupted two-rank run's weights bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from requires import require_module

transformers = require_module(
    "transformers", "transformers is not installed: pip install 'resilient-flows[transformers]'"
)

import hf_ddp_worker  # noqa: E402
import hf_ids  # noqa: E402
from conftest import python_env  # noqa: E402

from resilient_flows.checkpoint import read_manifest, unflatten  # noqa: E402

RANKS = 2
TORCHRUN = Path(sys.executable).with_name("torchrun")
HOLD_AT = 7  # global steps: checkpoints at 3 and 6 (save_steps=3); 7 is 3 batches into epoch 1
COMMITTED = 5  # our step of global step 6: 2 global batches of 4 into epoch 1
STEPS_PER_EPOCH = hf_ids.EXAMPLES // (RANKS * hf_ddp_worker.PER_RANK)


def torchrun(directory: Path, name: str, *hold_at: int) -> subprocess.Popen:
    """``torchrun`` of the worker in a session of its own (its ranks start sessions of their own)."""
    directory.mkdir(parents=True, exist_ok=True)
    argv = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(RANKS), hf_ddp_worker.__file__]
    env = {**python_env(), "HF_HUB_OFFLINE": "1"}
    with open(directory / f"{name}.log", "w") as log:
        return subprocess.Popen(
            [*argv, str(directory), name, *map(str, hold_at)], env=env, stdout=log, stderr=log, start_new_session=True
        )


def finished(launch: subprocess.Popen, directory: Path, name: str) -> None:
    assert launch.wait(timeout=240) == 0, (directory / f"{name}.log").read_text()[-4000:]


def held(launch: subprocess.Popen, directory: Path, name: str) -> list[dict]:
    """Each rank's report once every rank holds at ``HOLD_AT`` with its checkpoints committed."""
    paths = [directory / f"{name}-{rank}.held.json" for rank in range(RANKS)]
    deadline = time.monotonic() + 240
    while not all(path.exists() for path in paths):
        assert launch.poll() is None, (directory / f"{name}.log").read_text()[-4000:]
        assert time.monotonic() < deadline, "the ranks never reached the step to be killed at"
        time.sleep(0.1)
    time.sleep(0.1)  # the reports are small and written in one call: complete once present
    return [json.loads(path.read_text()) for path in paths]


def kill_every_process(launch: subprocess.Popen, ranks: list[dict]) -> None:
    """SIGKILL the launcher and each rank with its loader workers (a rank leads its own session)."""
    os.killpg(launch.pid, signal.SIGKILL)
    for rank in ranks:
        os.killpg(rank["pid"], signal.SIGKILL)
    launch.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{rank['pid']}").exists() for rank in ranks):
        assert time.monotonic() < deadline, "a killed rank is still there"
        time.sleep(0.05)


def steps_of(directory: Path, name: str, rank: int) -> dict[int, list[int]]:
    lines = (directory / f"{name}-{rank}.jsonl").read_text().splitlines()
    return {line["step"]: line["ids"] for line in map(json.loads, lines)}


def report(directory: Path, name: str, rank: int, suffix: str = "json") -> dict:
    return json.loads((directory / f"{name}-{rank}.{suffix}").read_text())


@pytest.mark.slow
def test_every_rank_killed_mid_epoch_resumes_at_the_committed_position_to_the_uninterrupted_weights(
    tmp_path: Path,
) -> None:
    full_dir, run_dir = tmp_path / "full", tmp_path / "run"
    full = torchrun(full_dir, "full")
    first = torchrun(run_dir, "first", HOLD_AT)  # side by side: the machine has cores to share
    ranks = held(first, run_dir, "first")
    assert [rank["committed"] for rank in ranks] == [COMMITTED] * RANKS
    kill_every_process(first, ranks)
    finished(full, full_dir, "full")
    second = torchrun(run_dir, "second")
    finished(second, run_dir, "second")

    saved = read_manifest(run_dir / "out" / "checkpoints" / f"step-{COMMITTED:08d}").skeleton
    position = unflatten(dict(saved["dict"])["data"], {})["train"]
    assert (position["epoch"], position["position"]) == (1, 8)
    for rank in range(RANKS):
        start = report(run_dir, "second", rank, "start.json")
        assert start == {"global_step": COMMITTED + 1, **position}

    trained: list[dict[int, list[int]]] = []
    for rank in range(RANKS):
        uninterrupted = steps_of(full_dir, "full", rank)
        killed, resumed = steps_of(run_dir, "first", rank), steps_of(run_dir, "second", rank)
        assert sorted(killed) == list(range(HOLD_AT)) and sorted(resumed) == list(range(COMMITTED + 1, 10))
        kept = {step: ids for step, ids in killed.items() if step <= COMMITTED} | resumed
        assert kept == uninterrupted, f"rank {rank}"
        trained.append(kept)
    for epoch_start in range(0, 10 - STEPS_PER_EPOCH + 1, STEPS_PER_EPOCH):
        epoch = [
            i for kept in trained for step in range(epoch_start, epoch_start + STEPS_PER_EPOCH) for i in kept[step]
        ]
        assert sorted(epoch) == list(range(hf_ids.EXAMPLES)), f"epoch from step {epoch_start}"

    digests = {
        report(directory, name, rank)["digest"]
        for directory, name in ((full_dir, "full"), (run_dir, "second"))
        for rank in range(RANKS)
    }
    assert len(digests) == 1
