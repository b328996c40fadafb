"""ctx.loader: a data position in every checkpoint, the same global order on any rank count, resumes
that load nothing they skip, per-sample augmentation seeds, and the errors for what it cannot resume."""

from __future__ import annotations

import gc
import json
import multiprocessing
import random
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from benchmark_modules import load_benchmark
from conftest import mpiexec, python_env
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Sampler

from resilient_flows.checkpoint import CheckpointConfig
from resilient_flows.errors import ResilientFlowsError
from resilient_flows.training import (
    EXIT_PREEMPTED,
    DataPositions,
    MemberSpec,
    Preempted,
    ResumableLoader,
    run_member,
)

REPO = Path(__file__).resolve().parents[1]


member = load_benchmark("data_resume_member")


def ids(batch: list) -> list[int]:
    return list(batch)


def loaders(length: int, batch: int, world: int, **kwargs) -> list[ResumableLoader]:
    """One loader per rank of ``world``, as the ranks of a member build them."""
    return [
        ResumableLoader(list(range(length)), batch, seed=7, rank=r, world_size=world, collate_fn=ids, **kwargs)
        for r in range(world)
    ]


def flat(lists: Iterable[list[int]]) -> list[int]:
    return [item for part in lists for item in part]


def global_batches(ranks: list[ResumableLoader]) -> list[list[int]]:
    """The rest of the epoch's global batches: each rank's share, in rank order."""
    return [flat(shares) for shares in zip(*ranks, strict=True)]


class Counted:
    """A map-style dataset (``len`` and ``[i]`` only, as Hugging Face's) that counts its reads."""

    def __init__(self, length: int) -> None:
        self.length, self.reads = length, []

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        self.reads.append(index)
        return index


class Augmented(torch.utils.data.Dataset):
    """Sample ``i`` with a draw from each generator an augmentation uses."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> tuple[int, float, float, float]:
        return index, torch.rand(()).item(), random.random(), float(np.random.rand())


# ------------------------------------------------------------------ the order, in one process


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_every_rank_count_trains_the_same_global_batches_each_sample_once_per_epoch(world: int) -> None:
    reference = loaders(105, 10, 1, shuffle=True)[0]
    ranks = loaders(105, 10, world, shuffle=True)
    for _ in range(2):
        want = list(reference)
        got = global_batches(ranks)
        assert got == want
        assert sorted(flat(got)) == list(range(105))
    assert len(ranks[0]) == 11 and [len(batch) for batch in want] == [10] * 10 + [5]
    three = loaders(10, 10, 3)
    assert [len(share) for share in next(zip(*three, strict=True))] == [3, 3, 4]
    assert [loader.rank_weight for loader in three] == [0.9, 0.9, 1.2]  # x the rank's mean: DDP's mean is exact


def test_epochs_differ_and_come_from_the_seed_and_epoch_alone() -> None:
    first, second = (loaders(50, 5, 1, shuffle=True)[0] for _ in range(2))
    epochs = [list(first), list(first)]
    assert epochs[0] != epochs[1] and [list(second), list(second)] == epochs
    assert (first.epoch, first.position) == (1, 50)
    unshuffled = loaders(12, 5, 1)[0]
    assert list(unshuffled) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]


def test_drop_last_drops_the_short_global_batch() -> None:
    ranks = loaders(23, 5, 2, shuffle=True, drop_last=True)
    got = global_batches(ranks)
    assert [len(batch) for batch in got] == [5, 5, 5, 5] and len(ranks[0]) == 4
    assert len(set(flat(got))) == 20 and ranks[0].position == 20


def test_a_resume_on_another_rank_count_loads_only_the_samples_after_the_position() -> None:
    one = loaders(60, 8, 1, shuffle=True)[0]
    want = list(one) + list(one)
    before = loaders(60, 8, 4, shuffle=True)
    streams = [loader.batches() for loader in before]
    trained = [flat(next(stream) for stream in streams) for _ in range(5)]
    saved = json.loads(json.dumps(before[0].state_dict()))  # as a checkpoint's manifest holds it
    assert saved == {"epoch": 0, "position": 40, "seed": 7, "shuffle": True, "length": 60}
    datasets = [Counted(60) for _ in range(3)]
    after = [ResumableLoader(d, 8, shuffle=True, rank=r, world_size=3, collate_fn=ids) for r, d in enumerate(datasets)]
    for loader in after:
        loader.load_state_dict(saved)
    rest = global_batches(after) + global_batches(after)
    assert trained + rest == want
    assert sorted(flat(d.reads for d in datasets)) == sorted(flat(rest))  # nothing skipped was read
    assert after[0].state_dict() == {**saved, "epoch": 1, "position": 60}


def test_a_hugging_face_dataset_with_two_workers_resumes_on_another_rank_count_at_its_position() -> None:
    """An Arrow-backed ``datasets.Dataset`` (map-style: rows as dicts), loaded by two worker
    processes per rank: four ranks train five global batches, three resume from the saved
    position, and the two epochs are the one-rank order, each row once, nothing skipped read."""
    import datasets

    table = datasets.Dataset.from_dict({"id": list(range(60)), "text": [f"row {i}" for i in range(60)]})

    def rows(batch: list[dict]) -> list[int]:
        assert all(row["text"] == f"row {row['id']}" for row in batch)
        return [row["id"] for row in batch]

    def ranks(world: int) -> list[ResumableLoader]:
        return [
            ResumableLoader(table, 8, seed=7, shuffle=True, rank=r, world_size=world, collate_fn=rows, num_workers=2)
            for r in range(world)
        ]

    one = loaders(60, 8, 1, shuffle=True)[0]
    want = list(one) + list(one)
    before = ranks(4)
    streams = [loader.batches() for loader in before]
    trained = [flat(next(stream) for stream in streams) for _ in range(5)]
    saved = json.loads(json.dumps(before[0].state_dict()))
    after = ranks(3)
    for loader in after:
        loader.load_state_dict(saved)
    assert trained + global_batches(after) + global_batches(after) == want


def test_a_loader_closed_or_dropped_mid_epoch_stops_its_workers_at_once() -> None:
    """Closed, it goes on at its position with new workers when read again. Dropped, no cycle
    keeps it for the garbage collector (its batch sampler refers to it weakly), whose order would
    keep each worker 5 s."""
    gc.disable()
    try:
        (plain,) = loaders(40, 8, 1, shuffle=True)
        first, second = next(iter(plain)), next(iter(plain))
        (loader,) = loaders(40, 8, 1, shuffle=True, num_workers=2, persistent_workers=True)
        stream = loader.batches()
        assert next(stream) == first and len(multiprocessing.active_children()) == 2
        loader.close()
        assert multiprocessing.active_children() == []
        assert next(iter(loader)) == second and len(multiprocessing.active_children()) == 2
        del loader, stream
        assert multiprocessing.active_children() == []
    finally:
        gc.enable()


def test_augmentation_is_the_samples_whichever_rank_and_worker_loads_it() -> None:
    def drawn(world: int, workers: int) -> dict[int, tuple]:
        out = {}
        for rank in range(world):
            loader = ResumableLoader(
                Augmented(),
                8,
                shuffle=True,
                seed=3,
                rank=rank,
                world_size=world,
                num_workers=workers,
                persistent_workers=workers > 0,
                collate_fn=ids,
            )
            for batch in loader:  # one epoch
                out.update({sample[0]: sample[1:] for sample in batch})
        return out

    torch.manual_seed(0)
    before = torch.rand(3)
    one = drawn(1, 0)
    torch.manual_seed(0)
    assert torch.equal(torch.rand(3), before)  # the training process's generators are as they were
    assert one == drawn(3, 2) and len(one) == 40 and len({values[0] for values in one.values()}) == 40


def test_set_epoch_starts_another_epoch_and_keeps_the_current_one() -> None:
    loader = loaders(20, 5, 1, shuffle=True)[0]
    first = next(iter(loader))
    loader.set_epoch(0)
    assert len(list(loader)) == 3 and loader.position == 20
    loader.set_epoch(4)
    assert (loader.epoch, loader.position) == (4, 0) and next(iter(loader)) != first


def test_a_dataloader_of_the_users_gives_its_dataset_batch_and_order() -> None:
    from resilient_flows.training._loader import loader_arguments

    data = list(range(30))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True)
    dataset, kwargs = loader_arguments(DataLoader(data, 3, sampler=sampler, drop_last=True, collate_fn=ids))
    assert dataset is data
    assert (kwargs["batch_size"], kwargs["shuffle"], kwargs["drop_last"], kwargs["collate_fn"]) == (6, True, True, ids)
    assert loader_arguments(DataLoader(data, 4, shuffle=True))[1]["shuffle"] is True
    assert loader_arguments(DataLoader(data, 4))[1]["shuffle"] is False

    class Odd(Sampler):
        def __iter__(self):
            return iter(range(30))

    with pytest.raises(ResilientFlowsError, match=r"sampler \(Odd\) has an order of its own"):
        loader_arguments(DataLoader(data, 4, sampler=Odd()))


def test_what_it_cannot_resume_is_refused_in_one_line() -> None:
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ResilientFlowsError, match="an IterableDataset has no order to resume in"):
        ResumableLoader(Stream(), 2)
    with pytest.raises(ResilientFlowsError, match="int is not a map-style dataset"):
        ResumableLoader(3, 2)
    with pytest.raises(ResilientFlowsError, match="sampler decide the sample order"):
        ResumableLoader([1, 2], 2, sampler=[0, 1])
    with pytest.raises(ResilientFlowsError, match=r"a global batch of 2 sample.s. cannot give each of 3 ranks a share"):
        ResumableLoader(list(range(10)), 2, world_size=3)
    with pytest.raises(ResilientFlowsError, match=r"global batch of 1 sample.*or drop_last=True"):
        ResumableLoader(list(range(9)), 4, world_size=2)
    loader = ResumableLoader(list(range(9)), 4)
    with pytest.raises(ResilientFlowsError, match="the checkpoint's dataset had 10 samples, this one 9"):
        loader.load_state_dict({"epoch": 0, "position": 4, "seed": 0, "shuffle": False, "length": 10})
    positions = DataPositions()
    positions.add(loader)
    with pytest.raises(ResilientFlowsError, match="two loaders are named 'train'"):
        positions.add(ResumableLoader(list(range(9)), 4))


def test_a_loader_made_after_the_restore_takes_its_saved_position() -> None:
    positions = DataPositions()
    positions.load_state_dict({"train": {"epoch": 2, "position": 8, "seed": 9, "shuffle": True, "length": 12}})
    loader = ResumableLoader(list(range(12)), 4, shuffle=True, collate_fn=ids)
    positions.add(loader)
    assert (loader.epoch, loader.position, loader.seed) == (2, 8, 9)
    assert positions.state_dict() == {"train": loader.state_dict()}


# ------------------------------------------------------------------ members


def spec(**params) -> MemberSpec:
    base = {"samples": 100, "batch": 12, "workers": 2}
    return MemberSpec(
        name="d",
        workload="data_resume_member:train",
        params={**base, **params},
        seed=5,
        steps=27,
        checkpoint=CheckpointConfig(interval_steps=4),
    )


def test_a_preempted_member_with_two_workers_resumes_bit_for_bit(tmp_path: Path) -> None:
    faulted = spec(faults={"1": ["preempt", 13]})
    with pytest.raises(Preempted):
        run_member(faulted.to_dict(), str(tmp_path / "run"))
    resumed = run_member(faulted.to_dict(), str(tmp_path / "run"))
    reference = run_member(spec(workers=0).to_dict(), str(tmp_path / "reference"))
    assert resumed["digest"] == reference["digest"] and resumed["attempts"] == 2
    directory = tmp_path / "run/members/d"
    assert member.ledger(directory, 100, 3) == [
        {"epoch": e, "trained": 100, "duplicated": 0, "skipped": 0} for e in range(3)
    ]
    trained = sum(len(row["ids"]) for row in map(json.loads, (directory / "ids-a2-r0.jsonl").read_text().splitlines()))
    assert trained == 40 + 100 and sorted(member.loaded(directory, 2)) == sorted(
        i for rows in member.rows(directory).values() for row in rows if row["step"] > 13 for i in row["ids"]
    )


@pytest.mark.slow
@pytest.mark.mpi
def test_kills_and_resumes_on_4_3_2_4_ranks_train_each_sample_once_per_epoch(tmp_path: Path) -> None:
    import subprocess

    faults = {"1": ["kill", 6], "2": ["preempt", 13], "3": ["kill", 22]}
    exits = []
    for attempt, ranks in enumerate((4, 3, 2, 4), start=1):
        path = tmp_path / f"spec-{attempt}.json"
        path.write_text(json.dumps(replace(spec(faults=faults), ranks=ranks).to_dict()))
        command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "resilient_flows.training.mpi_member"]
        env = python_env()
        env["PYTHONPATH"] = f"{REPO / 'benchmarks'}:{env['PYTHONPATH']}"
        done = subprocess.run([*command, str(path), str(tmp_path / "run")], env=env, capture_output=True, timeout=240)
        exits.append(done.returncode)
    assert exits[1] == EXIT_PREEMPTED and exits[0] != 0 and exits[2] != 0 and exits[3] == 0  # kills, preempt
    directory = tmp_path / "run/members/d"
    assert json.loads((directory / "result.json").read_text())["step"] == 26
    assert member.ledger(directory, 100, 3) == [
        {"epoch": e, "trained": 100, "duplicated": 0, "skipped": 0} for e in range(3)
    ]
    assert member.augmentations_agree(directory)
    starts = [resume["step"] for resume in member.resumes(directory)]
    assert len(starts) == 4 and starts[2] == 14  # the preempted attempt committed its step: on 2 ranks mid-epoch
    last = [
        i for rows in member.rows(directory).values() for row in rows if row["step"] >= starts[3] for i in row["ids"]
    ]
    assert sorted(member.loaded(directory, 4)) == sorted(last)  # resumed at its position: nothing before it read


def test_a_checkpoint_without_a_data_position_says_its_loader_starts_over(tmp_path: Path) -> None:
    from resilient_flows.training import read_events

    with pytest.raises(Preempted):  # the usual DataLoader first: its checkpoints hold no position
        run_member(spec(plain=True, workers=0, faults={"1": ["preempt", 4]}).to_dict(), str(tmp_path))
    run_member(spec(workers=0).to_dict(), str(tmp_path))
    warnings = [e["reason"] for e in read_events(tmp_path) if e["kind"] == "warning"]
    assert warnings == ["the checkpoint of step 4 holds no data position: loader(s) train start at epoch 0, sample 0"]


@pytest.mark.slow
def test_the_quick_benchmark_finds_no_sample_trained_twice_or_skipped(tmp_path: Path) -> None:
    """``data_resume.py --quick`` as the acceptance runs it: its ranks forked from one process."""
    import subprocess

    out = tmp_path / "report.json"
    command = [sys.executable, str(REPO / "benchmarks" / "data_resume.py"), "--quick", "--json", str(out)]
    done = subprocess.run(command, env=python_env(), capture_output=True, timeout=280)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    report = json.loads(out.read_text())
    got = report["exactness"]["resumable"]
    assert (report["mode"], report["launcher"], got["ranks"], got["finished"]) == ("quick", "fork", [4, 3, 2, 4], True)
    assert got["exits"][1] == EXIT_PREEMPTED and got["exits"][0] != 0 and got["exits"][2] != 0 and got["exits"][3] == 0
    assert (got["duplicated_total"], got["skipped_total"], got["augmentation_same_on_every_rank_count"]) == (0, 0, True)
    assert got["last_attempt_samples_loaded"] == got["last_attempt_samples_trained"]
    assert got["same_layout"] == {
        "ranks": [2, 2, 2],
        "duplicated_total": 0,
        "skipped_total": 0,
        "weights_bitwise_equal_to_uninterrupted": True,
    }
    assert report["exactness"]["plain"]["finished"]  # the baseline ran beside it
    assert [row["position"] for row in report["latency"]["rows"]] == [0.0, 0.5, 0.95]
