"""ctx.loader over an iterable dataset: torchdata's StatefulDataLoader keeps its place in every
checkpoint, per rank. A resume on the same rank count goes on at the next sample (workers
included), another rank count is refused in one line, and without torchdata the error says which
extra to install."""

from __future__ import annotations

import gc
import json
import multiprocessing
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
import torch
from conftest import mpiexec, python_env
from requires import require_module
from streamworkload import Stream
from torch.utils.data import DataLoader

from resilient_flows.checkpoint import CheckpointConfig, TrainState
from resilient_flows.errors import ResilientFlowsError
from resilient_flows.training import EXIT_PREEMPTED, DataPositions, MemberSpec, Preempted, run_member
from resilient_flows.training._stream import StreamLoader, is_stream, stream_loader


@pytest.fixture
def torchdata() -> ModuleType:
    return require_module("torchdata.stateful_dataloader", "torchdata is not installed (the data extra)")


def spec(**params) -> MemberSpec:
    base = {"samples": 46, "batch": 4, "workers": 2}
    return MemberSpec(
        name="s",
        workload="streamworkload:train",
        params={**base, **params},
        seed=3,
        steps=30,
        checkpoint=CheckpointConfig(interval_steps=4),
    )


def trained(directory: Path) -> dict[int, list[dict]]:
    """Each step's rows (one per rank) from the last attempt that trained it."""
    by_step: dict[int, tuple[int, list[dict]]] = {}
    for path in sorted(directory.glob("ids-a*-r*.jsonl")):
        attempt = int(path.name.split("-")[1][1:])
        for row in map(json.loads, path.read_text().splitlines()):
            held = by_step.get(row["step"])
            if held is None or held[0] < attempt:
                by_step[row["step"]] = (attempt, [row])
            elif held[0] == attempt:
                held[1].append(row)
    return {step: rows for step, (_, rows) in sorted(by_step.items())}


def loader(length: int = 23, **kwargs) -> StreamLoader:
    return stream_loader(Stream(length), 4, seed=1, rank=0, world_size=1, name="train", **kwargs)


@pytest.mark.parametrize(("stateful", "preempt"), [(True, 15), (True, 11), (False, 15)])
def test_a_preempted_stream_with_two_workers_resumes_at_the_next_sample(
    torchdata: ModuleType, tmp_path: Path, stateful: bool, preempt: int
) -> None:
    """Mid-epoch, and after an epoch's last batch (step 11: 12 batches an epoch); a dataset with
    its own state_dict, and one the loader fast-forwards."""
    faulted = spec(stateful=stateful, preempt=preempt)
    with pytest.raises(Preempted):
        run_member(faulted.to_dict(), str(tmp_path / "run"))
    resumed = run_member(faulted.to_dict(), str(tmp_path / "run"))
    reference = run_member(spec(stateful=stateful).to_dict(), str(tmp_path / "reference"))
    got, want = trained(tmp_path / "run/members/s"), trained(tmp_path / "reference/members/s")
    assert got == want and sorted(got) == list(range(30))
    assert sorted(i for step in range(12) for i in want[step][0]["ids"]) == list(range(46))  # an epoch: each once
    second = json.loads((tmp_path / "run/members/s/ids-a2-r0.jsonl").read_text().splitlines()[0])
    assert second["step"] == preempt + 1
    assert resumed["digest"] == reference["digest"] and resumed["attempts"] == 2


def test_a_members_loader_workers_are_gone_when_its_run_returns_or_raises(
    torchdata: ModuleType, tmp_path: Path
) -> None:
    """Without the garbage collector: its order (the queues before the iterator) would keep each
    worker 5 s, in the Parsl worker that trains the next member."""
    gc.disable()
    try:
        with pytest.raises(Preempted):
            run_member(spec(preempt=5).to_dict(), str(tmp_path / "run"))
        assert multiprocessing.active_children() == []
        run_member(spec().to_dict(), str(tmp_path / "run"))
        assert multiprocessing.active_children() == []
    finally:
        gc.enable()


def test_a_streams_position_is_its_ranks_in_the_checkpoint(torchdata: ModuleType) -> None:
    stream = loader()
    positions = DataPositions()
    positions.add(stream)
    batches = stream.batches()
    first = [next(batches).tolist() for _ in range(3)]
    state = TrainState(torch.nn.Linear(1, 1), data=positions, rank_data=positions.per_rank).state_dict()
    assert "data" not in state  # nothing replicated: a stream's position is per rank
    saved = state["rank_local"]["data"]["train"]
    assert (saved["rank"], saved["world_size"], saved["epoch"]) == (0, 1, 0)
    again = loader()
    restored = DataPositions()
    restored.per_rank.load_state_dict(json.loads(json.dumps({"train": saved})))
    restored.add(again)  # made after the restore: takes its saved position
    assert restored.restored and restored.names() == ["train"]
    rest = [batch.tolist() for batch in again]
    assert first + rest == [batch.tolist() for batch in loader()]
    assert again.epoch == 1
    with pytest.raises(ResilientFlowsError, match="two loaders are named 'train'"):
        positions.add(loader())


def test_a_stream_refuses_another_rank_count_and_what_it_cannot_do(torchdata: ModuleType) -> None:
    saved = {"rank": 1, "world_size": 2, "epoch": 0, "loader": {}}
    with pytest.raises(
        ResilientFlowsError,
        match=r"^loader 'train': the checkpoint holds the stream positions of 2 rank\(s\) and this member runs on 1: "
        r"an iterable dataset's position is per rank and does not reshard; resume on 2 rank\(s\)",
    ):
        loader().load_state_dict(saved)
    with pytest.raises(ResilientFlowsError, match="a stream is read in its own order; shuffle it in the dataset"):
        loader(shuffle=True)
    with pytest.raises(ResilientFlowsError, match="a global batch of 6 does not split evenly over 4 ranks"):
        stream_loader(Stream(10), 6, seed=1, rank=0, world_size=4, name="train")
    built = torchdata.StatefulDataLoader(Stream(10), batch_size=2)
    with pytest.raises(ResilientFlowsError, match="a StatefulDataLoader comes built"):
        stream_loader(built, 4, seed=1, rank=0, world_size=1, name="train")
    assert stream_loader(built, None, seed=1, rank=0, world_size=1, name="train").loader is built
    users = stream_loader(
        DataLoader(Stream(10), batch_size=3, num_workers=2), None, seed=1, rank=0, world_size=2, name="train"
    )
    assert isinstance(users.loader, torchdata.StatefulDataLoader)
    assert (users.loader.batch_size, users.loader.num_workers) == (3, 2)  # a DataLoader's batch is per rank


def test_without_torchdata_a_stream_says_to_install_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchdata", None)  # import torchdata... raises ImportError
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)
    assert is_stream(Stream(10)) and is_stream(DataLoader(Stream(10))) and not is_stream(list(range(3)))
    with pytest.raises(
        ResilientFlowsError,
        match=r"^loader 'train': an IterableDataset resumes through torchdata's StatefulDataLoader, which is not "
        r"installed: pip install 'resilient-flows\[data\]'$",
    ):
        loader()


@pytest.mark.slow
@pytest.mark.mpi
def test_a_stream_saved_on_2_ranks_is_refused_on_1(torchdata: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(replace(spec(preempt=5), ranks=2).to_dict()))
    command = [mpiexec(), "-n", "2", sys.executable, "-m", "resilient_flows.training.mpi_member"]
    done = subprocess.run([*command, str(path), str(tmp_path)], env=python_env(), capture_output=True, timeout=240)
    assert done.returncode == EXIT_PREEMPTED, done.stderr.decode()[-2000:]
    gc.disable()  # the workers the restore's state_dict() started are stopped by the run, not the collector
    try:
        with pytest.raises(ResilientFlowsError, match=r"stream positions of 2 rank\(s\) and this member runs on 1"):
            run_member(spec().to_dict(), str(tmp_path))
        assert multiprocessing.active_children() == []
    finally:
        gc.enable()
