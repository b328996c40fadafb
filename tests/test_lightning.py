"""The PyTorch Lightning integration: ResilientCheckpointIO under ModelCheckpoint, snapshots that hold
the state at the call (and what Lightning's AsyncCheckpointIO does), a member killed mid-epoch and
resumed to the same weights, and a DDP member on two CPU processes stopped by a signal and resumed."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from requires import require_module

require_module("pytorch_lightning", "pytorch-lightning is not installed: pip install 'resilient-flows[lightning]'")

import pytorch_lightning as pl  # noqa: E402
from pytorch_lightning.callbacks import ModelCheckpoint  # noqa: E402
from pytorch_lightning.plugins.io import async_plugin  # noqa: E402
from pytorch_lightning.plugins.io.async_plugin import AsyncCheckpointIO  # noqa: E402
from pytorch_lightning.plugins.io.torch_plugin import TorchCheckpointIO  # noqa: E402

from resilient_flows.checkpoint import CheckpointConfig  # noqa: E402
from resilient_flows.checkpoint._tiers import Tier  # noqa: E402
from resilient_flows.checkpoint._tree import flatten  # noqa: E402
from resilient_flows.errors import CheckpointError  # noqa: E402
from resilient_flows.integrations.lightning import ResilientCallback, ResilientCheckpointIO  # noqa: E402
from resilient_flows.integrations.pathstore import load, read_ref  # noqa: E402
from resilient_flows.training import MemberSpec, RunContract, read_events  # noqa: E402
from resilient_flows.training._members import register_member  # noqa: E402
from resilient_flows.training._spec import FaultSpec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "workflows" / "lightning_digits.py"
#: Seconds one Lightning process may take: tens on an idle core, minutes with every core busy
#: (torch, Lightning and two loader workers per rank start on each).
SUBPROCESS_S = 300


def committed(directory: Path) -> list[int]:
    """Steps committed in a tier, newest first."""
    return Tier(directory, "tier").committed_steps()


def checkpoint_of(step: int, weights: torch.Tensor, **extra: Any) -> dict[str, Any]:
    """A checkpoint dict shaped like Lightning's."""
    return {"epoch": 0, "global_step": step, "state_dict": {"w": weights}, "loops": {"n": step}, **extra}


# ------------------------------------------------------------------------------- snapshot semantics


@pytest.mark.parametrize("plugin", ["resilient", "async"])
def test_a_save_holds_the_weights_at_the_call_while_training_changes_them(tmp_path: Path, plugin: str) -> None:
    if plugin == "async" and not hasattr(async_plugin, "_clone_tensor"):
        pytest.xfail("this Lightning's AsyncCheckpointIO hands the live tensors to its thread: the write tears")
    weights = torch.zeros(16 << 20)  # 64 MiB: the background write takes a while
    path = tmp_path / "ckpts" / "a.ckpt"
    io = ResilientCheckpointIO(tmp_path / "store") if plugin == "resilient" else AsyncCheckpointIO(TorchCheckpointIO())
    io.save_checkpoint(checkpoint_of(1, weights), path)
    for _ in range(5):  # what optimizer steps do while the write runs
        weights.add_(1.0)
    io.teardown()
    loaded = io.load_checkpoint(path) if plugin == "resilient" else torch.load(path, weights_only=True)
    assert torch.equal(loaded["state_dict"]["w"], torch.zeros(16 << 20))
    assert loaded["global_step"] == 1


def test_a_value_json_cannot_hold_is_refused_by_its_key_path(tmp_path: Path) -> None:
    io = ResilientCheckpointIO(tmp_path / "store")
    ckpt = checkpoint_of(3, torch.ones(2), hyper_parameters={"started": datetime.date(2026, 1, 1)})
    with pytest.raises(CheckpointError, match=r"hyper_parameters/started of type date"):
        io.save_checkpoint(ckpt, tmp_path / "x.ckpt")
    io.teardown()
    assert not (tmp_path / "x.ckpt").exists() and not list((tmp_path / "store").glob("step-*"))
    with pytest.raises(CheckpointError, match=r"global_step 0: .* none has run yet"):
        io.save_checkpoint(checkpoint_of(0, torch.ones(2)), tmp_path / "x.ckpt")


def test_paths_saved_at_one_step_share_a_checkpoint_and_removing_the_last_name_removes_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    io = ResilientCheckpointIO([tmp_path / "local", store], keep=1)
    weights = torch.arange(4.0)
    io.save_checkpoint(checkpoint_of(1, weights, callbacks={"last_model_path": ""}), tmp_path / "top.ckpt")
    io.save_checkpoint(
        checkpoint_of(1, weights, callbacks={"last_model_path": "second.ckpt"}), tmp_path / "second.ckpt"
    )
    weights.mul_(10)  # a callback changing weights within one global step
    io.save_checkpoint(checkpoint_of(1, weights), tmp_path / "other.ckpt")
    io.save_checkpoint(checkpoint_of(2, weights), tmp_path / "two.ckpt")
    io.wait()
    assert committed(store) == [1, 0] and committed(tmp_path / "local") == [1, 0]  # one checkpoint of step 0
    assert committed(store / "lane-1") == [0]  # the changed tensors could not share it
    top, second, other = (io.load_checkpoint(tmp_path / n) for n in ("top.ckpt", "second.ckpt", "other.ckpt"))
    assert top["callbacks"] == {"last_model_path": ""} and second["callbacks"] == {"last_model_path": "second.ckpt"}
    assert torch.equal(top["state_dict"]["w"], torch.arange(4.0)) and torch.equal(
        top["state_dict"]["w"], second["state_dict"]["w"]
    )
    assert torch.equal(other["state_dict"]["w"], torch.arange(4.0) * 10)

    io.remove_checkpoint(tmp_path / "top.ckpt")
    assert committed(store) == [1, 0]  # second.ckpt still names step 0
    io.remove_checkpoint(tmp_path / "second.ckpt")
    io.remove_checkpoint(tmp_path / "other.ckpt")
    assert committed(store) == [1] and committed(tmp_path / "local") == [1] and committed(store / "lane-1") == []
    assert not (tmp_path / "top.ckpt").exists() and not (tmp_path / "second.ckpt").exists()
    io.teardown()


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def tiny_data() -> torch.utils.data.DataLoader:
    data = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=data)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def test_model_checkpoint_top_k_and_last_work_unchanged_on_the_plugin(tmp_path: Path) -> None:
    io = ResilientCheckpointIO([tmp_path / "local", tmp_path / "shared"])
    ckpts = ModelCheckpoint(
        tmp_path / "ckpts", every_n_train_steps=5, save_top_k=2, monitor="train_loss", save_last=True
    )
    trainer = pl.Trainer(
        max_steps=40,
        accelerator="cpu",
        plugins=[io],
        callbacks=[ckpts, ResilientCallback()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), tiny_data())

    named = {Path(p) for p in ckpts.best_k_models} | {Path(ckpts.last_model_path)}
    assert {p for p in (tmp_path / "ckpts").iterdir()} == named  # the removed top-k files are gone
    steps = {read_ref(p).step for p in named}
    for tier in ("shared", "local"):  # every tier holds what a path names, and the 2 newest (keep)
        assert set(committed(tmp_path / tier)) == steps | {34, 39}
    for path in named:
        assert io.load_checkpoint(path)["global_step"] == read_ref(path).step + 1  # steps count from 0

    resumed = pl.Trainer(
        max_steps=45, accelerator="cpu", plugins=[ResilientCheckpointIO(tmp_path / "shared")],
        callbacks=[ModelCheckpoint(tmp_path / "ckpts", save_last=True), ResilientCallback()],
        logger=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    resumed.fit(Tiny(), tiny_data(), ckpt_path="last")
    assert resumed.ckpt_path == str(tmp_path / "ckpts" / "last.ckpt") and resumed.global_step == 45


UNIFIED = """
import sys
import torch
import lightning.pytorch as L  # the unified package's Lightning, imported first
from resilient_flows.integrations.lightning import LIGHTNING, ResilientCallback, ResilientCheckpointIO

assert LIGHTNING is L and "pytorch_lightning" not in sys.modules


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
for steps in (6, 10):
    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", plugins=[ResilientCheckpointIO(sys.argv[1])],
        callbacks=[L.callbacks.ModelCheckpoint(sys.argv[1], every_n_train_steps=3, save_last=True),
                   ResilientCallback()],
        logger=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Tiny(), data, ckpt_path="last")
    print(steps, trainer.ckpt_path is not None, trainer.global_step)
"""


@pytest.mark.timeout(SUBPROCESS_S + 60)
def test_the_unified_lightning_package_gets_classes_of_its_own(tmp_path: Path) -> None:
    require_module(
        "lightning", "the unified lightning package is not installed: pip install 'resilient-flows[lightning]'"
    )
    done = subprocess.run(
        [sys.executable, "-c", UNIFIED, str(tmp_path)], capture_output=True, text=True, timeout=SUBPROCESS_S, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["6 False 6", "10 True 10"]  # the second run resumed from step 6
    assert committed(tmp_path) == [8, 5]  # global steps 9 and 6, the two kept


# ------------------------------------------------------------------------------- as a workflow member


def member(run_dir: Path, name: str, steps: int, faults: tuple[FaultSpec, ...] = (), interval: int = 10) -> MemberSpec:
    spec = MemberSpec(
        name=name,
        workload="",
        params={"lr": 0.05},
        seed=3,
        steps=steps,
        checkpoint=CheckpointConfig(interval_steps=interval, keep=2),
        faults=faults,
        command=[sys.executable, str(SCRIPT)],
    )
    register_member(run_dir, spec)
    return spec


def attempt(spec: MemberSpec, run_dir: Path, number: int, *args: str) -> subprocess.CompletedProcess:
    (run_dir / "members" / spec.name / "attempts").write_text(str(number))
    env = {**os.environ, **RunContract.for_member(spec, run_dir, number).to_env()}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=SUBPROCESS_S, cwd=ROOT
    )


def report(run_dir: Path, name: str) -> dict[str, Any]:
    return json.loads((run_dir / "members" / name / "command-result.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(3 * SUBPROCESS_S)
def test_a_member_killed_mid_epoch_resumes_from_its_newest_checkpoint_to_the_same_weights(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    spec = member(run_dir, "m", steps=60, faults=(FaultSpec("kill", 35),))  # 23 batches an epoch: mid-epoch 2
    first = attempt(spec, run_dir, 1)
    assert first.returncode == -9, first.stderr[-2000:]
    newest = committed(run_dir / "members" / "m" / "checkpoints")[0]
    assert newest in (19, 29)  # 29 (global step 30) unless its write was still in flight 6 steps later

    second = attempt(spec, run_dir, 2)
    assert second.returncode == 0, second.stderr[-2000:]
    resumed = [e for e in read_events(run_dir) if e["kind"] == "resumed"]
    assert [(e["attempt"], e["step"]) for e in resumed] == [(2, newest)]
    lines = [json.loads(line) for line in (run_dir / "members" / "m" / "metrics.jsonl").read_text().splitlines()]
    assert {line["attempt"] for line in lines} == {1, 2} and lines[-1]["step"] == 59 and "loss" in lines[-1]

    threads = torch.get_num_threads()
    argv = sys.argv
    sys.path.insert(0, str(SCRIPT.parent))
    try:  # the same script, uninterrupted, in this process
        import lightning_digits

        sys.argv = [str(SCRIPT), "--dir", str(tmp_path / "plain"), "--steps", "60", "--every", "10", "--seed", "3"]
        model = lightning_digits.main()
    finally:
        sys.argv = argv
        sys.path.remove(str(SCRIPT.parent))
        torch.set_num_threads(threads)
    from resilient_flows.training import state_digest

    assert report(run_dir, "m")["digest"] == state_digest(model)  # bit for bit, dataloader position included


@pytest.mark.slow
@pytest.mark.timeout(3 * SUBPROCESS_S)
def test_a_member_stopped_by_a_signal_resumes_as_ddp_on_two_cpu_processes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    spec = member(run_dir, "ddp", steps=24, faults=(FaultSpec("preempt", 12),), interval=5)
    first = attempt(spec, run_dir, 1)  # sends itself SIGTERM after step 12, as a batch system would
    assert first.returncode == 75, first.stderr[-3000:]
    checkpoints = run_dir / "members" / "ddp" / "checkpoints"
    assert committed(checkpoints)[0] == 12  # the stop's own checkpoint, committed before the exit
    assert read_ref(checkpoints / "last.ckpt").step == 12

    second = attempt(spec, run_dir, 2, "--devices", "2")  # every rank reads it; rank 0 writes the next ones
    assert second.returncode == 0, second.stderr[-3000:]
    kinds = [(e["kind"], e.get("step")) for e in read_events(run_dir) if e["kind"] in ("preempted", "resumed")]
    assert kinds == [("preempted", 12), ("resumed", 12)]
    assert committed(checkpoints)[:2] == [19, 14]  # written under DDP by rank 0 (global steps 20 and 15)
    result = report(run_dir, "ddp")
    assert result["step"] == 23 and result["ranks_agree"] is True  # rank 1 restored what rank 0 did


@pytest.mark.slow
@pytest.mark.timeout(3 * SUBPROCESS_S)
def test_an_fsdp2_member_stopped_by_a_signal_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path: Path) -> None:
    fsdp = ("--devices", "2", "--strategy", "fsdp")
    plain = tmp_path / "plain"  # the uninterrupted run, beside the first attempt
    argv = [sys.executable, str(SCRIPT), "--dir", str(plain), "--steps", "24", "--every", "5", "--seed", "3", *fsdp]
    uninterrupted = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    run_dir = tmp_path / "run"
    spec = member(run_dir, "fsdp", steps=24, faults=(FaultSpec("preempt", 12),), interval=5)
    first = attempt(spec, run_dir, 1, *fsdp)
    assert first.returncode == 75, first.stderr[-3000:]
    checkpoints = run_dir / "members" / "fsdp" / "checkpoints"
    assert committed(checkpoints)[0] == 12 and read_ref(checkpoints / "last.ckpt").step == 12

    second = attempt(spec, run_dir, 2, *fsdp)  # shards the full checkpoint it reads back
    assert second.returncode == 0, second.stderr[-3000:]
    kinds = [(e["kind"], e.get("step")) for e in read_events(run_dir) if e["kind"] in ("preempted", "resumed")]
    assert kinds == [("preempted", 12), ("resumed", 12)]

    output, _ = uninterrupted.communicate(timeout=SUBPROCESS_S)
    assert uninterrupted.returncode == 0, output[-3000:]
    _, resumed_state = load(checkpoints / "last.ckpt")
    _, plain_state = load(plain / "last.ckpt")
    for part in ("state_dict", "optimizer_states"):  # weights and Adam moments, bit for bit
        names, resumed_leaves = flatten(resumed_state[part])
        assert names == flatten(plain_state[part])[0]
        for key, value in resumed_leaves.items():
            assert torch.equal(value, flatten(plain_state[part])[1][key]), key
    assert report(run_dir, "fsdp")["ranks_agree"] is True
