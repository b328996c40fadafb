"""Cloning over MPI point to point: a clone continues bit for bit, each source rank sends its share."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_worker

from resilient_flows.clone._mpi import StagingBuffer

pytestmark = [pytest.mark.mpi, pytest.mark.slow]
WORKER = Path(__file__).with_name("clone_mpi_worker.py")


def mpirun(ranks: int, mode: str, directory: Path) -> list[dict]:
    return run_worker(WORKER, ranks, mode, directory)


@pytest.fixture(scope="module")
def two_sources_one_clone(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Ranks 0 and 1 send in the background (start_send_state) and train on; rank 2 is the clone."""
    return mpirun(3, "background", tmp_path_factory.mktemp("clone-mpi"))


def test_a_clone_of_a_data_parallel_source_continues_bit_for_bit(two_sources_one_clone: list[dict]) -> None:
    source0, source1, clone = two_sources_one_clone
    assert [r["error"] for r in two_sources_one_clone] == [None, None, None]
    assert source0["digest"] == source1["digest"] == clone["digest"]
    assert len(clone["losses"]) == 50
    assert clone["losses"] == source0["losses"] == source1["losses"]  # floats through JSON: exact
    assert clone["rank_extra"] == {"rank": 0}  # clone 0 takes source rank 0 % 2's per-rank values
    assert clone["extras_match"]  # bfloat16, 0-d, transposed, strided numpy, empty
    assert clone["in_place"]  # received straight into the live parameters


def test_each_source_rank_sends_about_half_the_bytes(two_sources_one_clone: list[dict]) -> None:
    source0, source1, clone = two_sources_one_clone
    assert source0["split_arrays"] > 0  # the largest arrays travel in pieces from both ranks
    sent = [source0["stats"]["payload_bytes"], source1["stats"]["payload_bytes"]]
    assert sum(sent) == clone["stats"]["payload_bytes"]
    assert min(sent) > 0.8 * sum(sent) / 2
    for source in (source0, source1):  # the caller waited for the copy, not for the transfer
        assert source["stats"]["staging_bytes"] >= source["stats"]["payload_bytes"]
        assert source["returned_s"] <= source["stats"]["total_s"]
        assert source["staging_allocations"] == 1


def test_one_source_one_clone_blocking_after_a_refused_attempt(tmp_path: Path) -> None:
    source, clone = mpirun(2, "blocking", tmp_path)
    # first attempt: the clone's model is narrower; both sides say which array and why, nobody hangs
    assert clone["refused"].startswith("StateMismatchError: 'model/0.weight' has shape [640, 16]")
    assert source["refused"].startswith("CloneError: the clone refused the state (clone rank 1: 'model/0.weight'")
    # second attempt over the same communicator: exact
    assert source["error"] is None and clone["error"] is None
    assert source["digest"] == clone["digest"]
    assert clone["losses"] == source["losses"]
    assert clone["extras_match"] and clone["in_place"]
    assert source["stats"]["payload_bytes"] == clone["stats"]["payload_bytes"]
    assert source["stats"]["staging_bytes"] < 100  # zero copy: only the transposed and strided extras


def test_a_data_parallel_clone_takes_each_source_ranks_generators(tmp_path: Path) -> None:
    """Two source ranks with their own dropout masks, two clone ranks: clone j gets source j's RNG."""
    ranks = mpirun(4, "sliced", tmp_path)
    assert [r["error"] for r in ranks] == [None] * 4
    sources, clones = ranks[:2], ranks[2:]
    assert [c["rank_extra"] for c in clones] == [{"rank": 0}, {"rank": 1}]
    assert all(c["losses"] == sources[0]["losses"] for c in clones)
    sent = [s["stats"]["payload_bytes"] for s in sources]
    assert sum(sent) == sum(c["stats"]["payload_bytes"] for c in clones)
    assert min(sent) > 0.8 * sum(sent) / 2


def test_a_staging_buffer_is_reused_and_never_shared_by_two_transfers_in_flight() -> None:
    staging = StagingBuffer(pin_memory=False)
    first = staging.acquire(1000)
    with pytest.raises(RuntimeError, match="still holds a transfer in flight"):
        staging.acquire(10)
    staging.release()
    smaller = staging.acquire(600)  # same memory, no new allocation
    assert smaller.data_ptr() == first.data_ptr() and smaller.numel() == 600
    staging.release()
    assert staging.acquire(4000).numel() == 4000 and staging.nbytes == 4000
    assert staging.allocations == 2


def test_an_fsdp_source_on_two_ranks_clones_into_fsdp_on_three_receiving_only_what_each_needs(tmp_path: Path) -> None:
    reports = run_worker(Path(__file__).with_name("clone_fsdp_worker.py"), 5, "reshard", tmp_path)
    sources, clones = reports[:2], reports[2:]
    assert len({r["digest"] for r in reports}) == 1  # full parameters and moments equal bitwise
    sent = sum(r["stats"]["payload_bytes"] for r in sources)
    received = [r["stats"]["payload_bytes"] for r in clones]
    assert sent == sum(received)
    for clone in clones:  # exactly its own shard of parameters and both moments, plus the 6 step counters
        assert clone["stats"]["payload_bytes"] == 3 * clone["local_bytes"] + 6 * 4
