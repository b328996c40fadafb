"""The Checkpointer's contract on one process: exact resume, overlap, tiers, retention, stats."""

from __future__ import annotations

import copy
import json
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
from trainkit import Problem, digest, replicated_digest

from resilient_flows.checkpoint import Checkpointer, CheckpointError, TierSpec, TrainState
from resilient_flows.checkpoint._heartbeat import FILENAME


def run(problem: Problem, steps: range) -> list[float]:
    return [problem.step(s) for s in steps]


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
@pytest.mark.parametrize("two_tiers", [False, True], ids=["shared-only", "local+shared"])
def test_resume_continues_bit_for_bit(tiers: tuple[Path, Path], overlap: bool, two_tiers: bool) -> None:
    shared, local = tiers
    reference = Problem()
    expected = run(reference, range(30))

    first = Problem()
    with Checkpointer([local, shared] if two_tiers else shared) as ck:
        run(first, range(12))
        ck.save(11, first.state, overlap=overlap)
        run(first, range(12, 15))  # work after the checkpoint is lost on restart

    resumed = Problem(seed=99)  # different initial weights and generators: all must be restored
    with Checkpointer([local, shared] if two_tiers else shared) as ck:
        assert ck.restore(resumed.state) == 11
    assert resumed.state.extra == {"step": 11, "seen": 12 * 32}
    assert run(resumed, range(12, 30)) == expected[12:]


def test_overlap_commits_the_state_at_save_time(tiers: tuple[Path, Path]) -> None:
    """Parameters copied behind the next steps must still be those of the moment of save()."""
    shared, _ = tiers
    problem = Problem(width=256, depth=4)
    run(problem, range(3))
    at_save = copy.deepcopy(problem.state.state_dict())
    at_save.pop("rank_local")
    with Checkpointer(shared) as ck:
        ck.save(2, problem.state, overlap=True)
        run(problem, range(3, 6))  # forward passes change BatchNorm statistics, steps change weights
    loaded = Checkpointer(shared).load()
    loaded.pop("rank_local")
    assert digest(loaded) == digest(at_save)
    assert digest(loaded) != digest({k: v for k, v in problem.state.state_dict().items() if k != "rank_local"})


def test_overlap_needs_an_optimizer(tiers: tuple[Path, Path]) -> None:
    with Checkpointer(tiers[0]) as ck, pytest.raises(ValueError, match="optimizer"):
        ck.save(0, {"w": torch.zeros(3)}, overlap=True)


def test_dict_state_restores_in_place_and_keeps_identity(tiers: tuple[Path, Path]) -> None:
    shared, local = tiers
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    a = np.arange(5, dtype=np.int16)
    state = {"w": w, "nested": {"a": a, "ids": [1, 2, 3], "key": (0, "x")}, "lr": 0.1, "n": 7, "inf": float("inf")}
    with Checkpointer([local, shared]) as ck:
        ck.save(5, state)
    w.zero_()
    a[:] = -1
    state["lr"], state["n"] = 9.0, 0
    with Checkpointer([local, shared]) as ck:
        assert ck.restore(state) == 5
    assert state["w"] is w and torch.equal(w, torch.arange(12, dtype=torch.float32).reshape(3, 4))
    assert state["nested"]["a"] is a and a.tolist() == [0, 1, 2, 3, 4]
    assert state["lr"] == 0.1 and state["n"] == 7 and state["inf"] == float("inf")
    assert state["nested"]["key"] == (0, "x") and isinstance(state["nested"]["key"], tuple)


def test_load_returns_cpu_tensors_and_numpy_arrays(tiers: tuple[Path, Path]) -> None:
    shared, _ = tiers
    with Checkpointer(shared) as ck:
        ck.save(1, {"t": torch.ones(2, dtype=torch.bfloat16), "a": np.eye(2), "opt": {0: {"m": torch.zeros(1)}}})
        loaded = ck.load()
    assert loaded["t"].dtype == torch.bfloat16 and loaded["t"].tolist() == [1.0, 1.0]
    assert isinstance(loaded["a"], np.ndarray) and (loaded["a"] == np.eye(2)).all()
    assert list(loaded["opt"]) == [0]  # integer keys survive


def test_nothing_to_restore_returns_none(tiers: tuple[Path, Path]) -> None:
    with Checkpointer([tiers[1], tiers[0]]) as ck:
        assert ck.latest_step() is None
        assert ck.restore(Problem().state) is None
        assert ck.load() is None
        with pytest.raises(CheckpointError, match="no valid checkpoint of step 3"):
            ck.load(step=3)


def test_retention_keeps_the_newest_per_tier_and_latest_points_at_newest(tiers: tuple[Path, Path]) -> None:
    shared, local = tiers
    problem = Problem()
    with Checkpointer([local, TierSpec(shared, persist_every=3)], keep=2) as ck:
        for s in range(10):
            problem.step(s)
            ck.save(s, problem.state)
        ck.wait()
        assert ck.latest_step() == 9
    assert sorted(p.name for p in local.iterdir()) == ["latest", "step-00000008", "step-00000009"]
    # every 3rd save is persisted: saves 3, 6, 9 are steps 2, 5, 8
    assert sorted(p.name for p in shared.iterdir()) == [FILENAME, "latest", "step-00000005", "step-00000008"]
    assert (local / "latest").read_text().strip() == "9"
    assert (shared / "latest").read_text().strip() == "8"


def test_restore_prefers_the_fastest_tier_holding_the_newest(tiers: tuple[Path, Path]) -> None:
    shared, local = tiers
    problem = Problem()
    with Checkpointer([local, TierSpec(shared, persist_every=2)]) as ck:
        for s in range(4):
            problem.step(s)
            ck.save(s, problem.state, persist=s == 3)
    # local holds 1..3 (keep=3); shared holds 1 and 3: step 3 comes from local's copy
    shard = next((local / "step-00000003").glob("shard-*"))
    with Checkpointer([local, shared]) as ck:
        assert ck.restore(Problem().state) == 3
        assert ck.restored.read_from == {shard.name: [f"local on {socket.gethostname()}"]}
    # a local copy that fails its checksum gives way to shared's copy of the same step: nothing skipped
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    restored = Problem()
    with Checkpointer([local, shared]) as ck:
        assert ck.restore(restored.state) == 3 and not ck.skipped
        assert ck.restored.read_from == {shard.name: ["shared"]}
    assert digest(restored.model.state_dict()) == digest(problem.model.state_dict())


def test_backpressure_and_bounded_staging_memory(tiers: tuple[Path, Path]) -> None:
    problem = Problem(width=512, depth=3)
    model_bytes = sum(t.numel() * t.element_size() for t in problem.model.state_dict().values())
    param_bytes = sum(p.numel() * p.element_size() for p in problem.model.parameters())
    problem.step(0)
    with Checkpointer([tiers[1], tiers[0]]) as ck:
        for s in range(1, 6):
            problem.step(s)
            stats = ck.save(s, problem.state)
        ck.wait()
        # model + two Adam moments (+ small RNG/step tensors), allocated once and reused
        assert model_bytes + 2 * param_bytes <= stats.staging_bytes <= model_bytes + 2 * param_bytes + 64 * 1024
        assert stats.arena_allocations == 1
        assert stats.saves == 5 and stats.committed == 5 and stats.persisted == 5
        assert stats.total_wait >= 0 and stats.last_wait <= stats.last_stall


def test_prepare_allocates_the_arena_ahead_and_the_first_save_reuses_it(tiers: tuple[Path, Path]) -> None:
    problem = Problem(width=256, depth=2)
    problem.step(0)  # Adam's moments exist from the first step on: the layout is final
    with Checkpointer(tiers[0]) as ck:
        ck.prepare(problem.state)
        problem.step(1)
        expected = replicated_digest(problem.state)
        stats = ck.save(1, problem.state)
        assert stats.arena_allocations == 1  # prepare's arena, not a new one
        ck.prepare(problem.state)  # the arena is busy or already laid out: nothing changes
        ck.wait()
        assert ck.stats.arena_allocations == 1
    fresh = Problem(width=256, depth=2)
    fresh.step(0)
    with Checkpointer(tiers[0]) as ck:
        assert ck.restore(fresh.state) == 1
    assert replicated_digest(fresh.state) == expected


def test_saving_a_committed_step_again_keeps_the_committed_one(tiers: tuple[Path, Path]) -> None:
    with Checkpointer(tiers[0]) as ck:
        ck.save(4, {"x": torch.zeros(2)})
        ck.wait()
        ck.save(4, {"x": torch.ones(2)})
        ck.wait()
        assert ck.load()["x"].tolist() == [0.0, 0.0]


def test_manifest_format_and_shards_readable_by_safetensors(tiers: tuple[Path, Path]) -> None:
    from safetensors import safe_open

    shared, _ = tiers
    with Checkpointer(shared) as ck:
        ck.save(120, {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "epoch": 3})
    step_dir = shared / "step-00000120"
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert manifest["format"] == "resilient-flows-checkpoint" and manifest["step"] == 120
    assert manifest["world_size"] == 1 and manifest["shards"][0]["file"] == "shard-00000-of-00001.safetensors"
    assert manifest["arrays"]["model/w"]["shape"] == [2, 3]
    assert (shared / "latest").read_text() == "120\n"
    with safe_open(step_dir / "shard-00000-of-00001.safetensors", framework="pt") as f:
        assert f.get_tensor("model/w").tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keep": 0}, "^keep must be an integer >= 1"),
        ({"local_dir": "l"}, "unexpected keyword argument 'local_dir'"),
    ],
)
def test_bad_arguments_name_the_problem(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        Checkpointer(tmp_path, **kwargs)


def test_bad_steps_and_states_name_the_problem(tmp_path: Path) -> None:
    with Checkpointer(tmp_path / "c") as ck:
        with pytest.raises(ValueError, match="step must be a non-negative integer"):
            ck.save(-1, {"x": torch.zeros(1)})
        with pytest.raises(TypeError, match="cannot checkpoint a str"):
            ck.save(1, "weights")
        with pytest.raises(CheckpointError, match="cannot checkpoint fn of type builtin_function"):
            ck.save(1, {"fn": print})
    with pytest.raises(ValueError, match="same directory"):
        Checkpointer([tmp_path / "c", tmp_path / "c"])


def test_closed_checkpointer_refuses_to_save(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path)
    ck.close()
    ck.close()
    with pytest.raises(CheckpointError, match="closed"):
        ck.save(1, {"x": torch.zeros(1)})


def test_state_dict_of_any_stateful_object(tiers: tuple[Path, Path]) -> None:
    model = torch.nn.Linear(3, 2)
    with Checkpointer(tiers[0]) as ck:
        ck.save(1, model)
        other = torch.nn.Linear(3, 2)
        assert ck.restore(other) == 1
    assert torch.equal(other.weight, model.weight) and torch.equal(other.bias, model.bias)


def test_trainstate_without_rng_leaves_generators_alone(tiers: tuple[Path, Path]) -> None:
    model = torch.nn.Linear(2, 2)
    with Checkpointer(tiers[0]) as ck:
        ck.save(1, TrainState(model, rng=False))
        torch.manual_seed(5)
        expected = torch.rand(3)
        torch.manual_seed(5)
        ck.restore(TrainState(model, rng=False))
        assert torch.equal(torch.rand(3), expected)


def test_optimizer_step_right_after_an_overlap_save_waits_for_the_copy(tiers: tuple[Path, Path]) -> None:
    """No forward pass to hide behind: the step pre-hook must hold the update until the copy is done."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2048, 2048)
    optimizer = torch.optim.Adam(model.parameters())
    state = TrainState(model, optimizer)
    for _ in range(2):
        model(torch.randn(4, 2048)).sum().backward()
        optimizer.step()
    expected = digest({k: v for k, v in copy.deepcopy(state.state_dict()).items() if k != "rank_local"})
    with Checkpointer(tiers[0]) as ck:
        for step in range(3):
            ck.save(step, state, overlap=True)
            optimizer.step()  # changes every parameter and moment in place, at once
            ck.wait()
            loaded = ck.load(step)
            loaded.pop("rank_local")
            assert digest(loaded) == expected
            expected = digest({k: v for k, v in copy.deepcopy(state.state_dict()).items() if k != "rank_local"})


def test_a_new_optimizer_at_a_recycled_address_is_still_guarded(tiers: tuple[Path, Path]) -> None:
    """Hooks are kept per optimizer object, not per id(): a garbage-collected one's id comes back."""
    model = torch.nn.Linear(1024, 1024)
    with Checkpointer(tiers[0], keep=1) as ck:
        for step in range(12):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model(torch.randn(2, 1024)).sum().backward()
            state = TrainState(model, optimizer, rng=False)
            expected = digest(copy.deepcopy(model.state_dict()))
            ck.save(step, state, overlap=True)
            optimizer.step()
            ck.wait()
            assert digest(ck.load(step)["model"]) == expected
            del optimizer, state


def test_prune_of_a_node_local_tier_shared_by_two_ranks_leaves_nothing_behind(tmp_path: Path) -> None:
    from resilient_flows.checkpoint._tiers import Tier, shard_filename

    tier = Tier(tmp_path, "local")
    for step in range(1, 6):
        step_dir = tier.step_dir(step)
        step_dir.mkdir()
        (step_dir / "manifest.json").write_text("{}")
        for rank in range(2):
            (step_dir / shard_filename(rank, 2)).write_bytes(b"x")
    for rank in range(2):  # each rank removes its own shards; the first also the manifests
        tier.prune(2, protect=set(), own_files=[shard_filename(rank, 2)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000005"]


def test_rolling_back_to_an_older_checkpoint_needs_the_newer_ones_discarded(tiers: tuple[Path, Path]) -> None:
    shared, local = tiers
    problem = Problem()
    with Checkpointer([local, shared]) as ck:
        for s in range(1, 6):
            problem.step(s)
            ck.save(s, problem.state)
    rolled_back = Problem(seed=4)
    with Checkpointer([local, shared]) as ck:
        assert ck.restore(rolled_back.state, step=3) == 3
        rolled_back.step(4)
        with pytest.raises(CheckpointError, match=r"step 4 is older than step 5,.* discard_newer_than\(3\)"):
            ck.save(4, rolled_back.state)
        assert ck.discard_newer_than(3) == [4, 5]
        ck.save(4, rolled_back.state)
        expected = replicated_digest(rolled_back.state)
    assert (shared / "latest").read_text().strip() == "4" and (local / "latest").read_text().strip() == "4"
    fresh = Problem(seed=8)
    with Checkpointer([local, shared]) as ck:
        assert ck.restore(fresh.state) == 4
    assert replicated_digest(fresh.state) == expected


class _TwoHeads(torch.nn.Module):
    """A model whose second head gets no gradient in training, so Adam keeps no state for it."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def test_restore_creates_optimizer_state_only_where_the_checkpoint_has_some(tiers: tuple[Path, Path]) -> None:
    torch.manual_seed(0)
    model = _TwoHeads()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).square().sum().backward()
        optimizer.step()
    state = TrainState(model, optimizer, rng=False)
    with Checkpointer([tiers[1], tiers[0]]) as ck:
        ck.save(3, state)
    torch.manual_seed(1)
    fresh = _TwoHeads()
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    unused_before = digest(fresh.unused.state_dict())
    with Checkpointer([tiers[1], tiers[0]]) as ck:
        assert ck.restore(TrainState(fresh, fresh_optimizer, rng=False)) == 3
    assert set(fresh_optimizer.state) == {fresh.used.weight, fresh.used.bias}
    assert digest(fresh_optimizer.state_dict()) == digest(optimizer.state_dict())
    assert digest(fresh.used.state_dict()) == digest(model.used.state_dict())
    assert digest(fresh.unused.state_dict()) == digest(model.unused.state_dict()) != unused_before
    for param, moments in fresh_optimizer.state.items():
        assert moments["exp_avg"].shape == param.shape and moments["step"].device.type == "cpu"
