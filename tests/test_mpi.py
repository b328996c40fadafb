"""Sharded checkpoints with real MPI ranks: balanced writes, exact resume, restore on 1, 2, 3 ranks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_worker

from resilient_flows.checkpoint import Checkpointer

pytestmark = [pytest.mark.mpi, pytest.mark.slow]
WORKER = Path(__file__).with_name("mpi_worker.py")


def mpirun(ranks: int, mode: str, directory: Path) -> list[dict]:
    return run_worker(WORKER, ranks, mode, directory)


@pytest.fixture(scope="module")
def saved_by_two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    directory = tmp_path_factory.mktemp("mpi")
    return directory, mpirun(2, "save", directory)


def test_each_rank_writes_about_half_the_bytes(saved_by_two: tuple[Path, list[dict]]) -> None:
    directory, ranks = saved_by_two
    written = [r["bytes_written"] for r in ranks]
    assert min(written) > 0.8 * sum(written) / 2
    manifest = json.loads((directory / "shared" / "step-00000011" / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    assert [s["bytes"] for s in manifest["shards"]] == written
    assert len(list((directory / "local" / "step-00000011").glob("shard-*"))) == 2
    assert ranks[0]["digest"] == ranks[1]["digest"]  # replicated state really is replicated


def test_resume_on_two_ranks_continues_bit_for_bit(saved_by_two: tuple[Path, list[dict]], tmp_path: Path) -> None:
    directory, _ = saved_by_two
    reference = mpirun(2, "reference", tmp_path)
    resumed = mpirun(2, "resume", directory)
    assert [r["restored"] for r in resumed] == [11, 11]
    assert resumed[0]["losses"] == reference[0]["losses"][12:]


@pytest.mark.parametrize("ranks", [1, 3])
def test_restore_on_a_different_number_of_ranks(saved_by_two: tuple[Path, list[dict]], ranks: int) -> None:
    directory, saved = saved_by_two
    loaded = mpirun(ranks, "load", directory)
    assert all(r["restored"] == 11 for r in loaded)
    assert all(r["digest"] == saved[0]["digest"] for r in loaded)
    # per-rank values: rank r takes saved rank r % 2
    assert [r["rank_extra"]["rank"] for r in loaded] == [r % 2 for r in range(ranks)]


def test_single_process_reads_a_two_rank_checkpoint(saved_by_two: tuple[Path, list[dict]]) -> None:
    directory, _ = saved_by_two
    with Checkpointer(directory / "shared") as ck:
        state = ck.load()
    assert state["extra"]["step"] == 11
    assert state["rank_local"]["extra"] == {"rank": 0}


def test_each_rank_verifies_what_it_reads_and_all_agree_to_skip(
    saved_by_two: tuple[Path, list[dict]], tmp_path: Path
) -> None:
    directory, _ = saved_by_two
    shutil.copytree(directory / "shared", tmp_path / "shared")
    shard = tmp_path / "shared" / "step-00000011" / "shard-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    ranks = mpirun(2, "damaged", tmp_path)
    assert [r["restored"] for r in ranks] == [None, None]
    for r in ranks:
        ((step, tier, reason),) = r["skipped"]
        assert (step, tier) == (11, "shared")
        # the damaged byte is in rank 1's own values (its RNG state): only rank 1 reads, checks and sees it
        assert reason.startswith("rank 1: shard-00001-of-00002.safetensors: entry 'rank_local/1/")
        assert reason.endswith(")") and "fails its checksum" in reason
