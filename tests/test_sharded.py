"""Sharded (FSDP2) and replicated (DDP) state saved on some ranks and restored on others, bit for bit.

Real ranks: each is a process of its own with a gloo process group, started as ``torchrun`` would
start it (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import python_env
from rank_launch import run_ranks
from safetensors.torch import load_file
from sharded_worker import WIDTHS, full_tensors, model

from resilient_flows.checkpoint import Checkpointer, StateMismatchError, TrainState, export
from resilient_flows.cli import main

WORKER = Path(__file__).with_name("sharded_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(ranks: int, mode: str, directory: Path, *args: str, worker: Path = WORKER) -> list[dict]:
    """Run ``worker`` (``MODE DIR ARGS...``) on ``ranks`` processes as torchrun would (forked from
    a server that imported torch once: :mod:`rank_launch`); each rank's report."""
    port = free_port()
    environs = [
        {**python_env(), "RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank)}
        | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        for rank in range(ranks)
    ]
    with tempfile.TemporaryDirectory(prefix="ranks-") as logs_dir:
        logs = [Path(logs_dir) / f"rank-{rank}.log" for rank in range(ranks)]
        statuses = run_ranks(worker, [mode, str(directory), *args], environs, logs)
        outputs = [log.read_text() for log in logs]
    assert statuses == [0] * ranks, outputs
    for text in outputs:  # the exit hook closed a Checkpointer after destroy_process_group, silently
        assert "Traceback" not in text and "Exception ignored" not in text, text
    return [json.loads((directory / f"{mode}-{ranks}-{r}.json").read_text()) for r in range(ranks)]


@pytest.fixture(scope="module")
def saved_on_four(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("sharded")
    reports = launch(4, "save", directory)
    state_bytes = sum(
        t.numel() * t.element_size() for t in load_file(str(directory / "reference-fsdp.safetensors")).values()
    )
    # Adam's step counters are plain tensors, replicated: each written once, by one rank.
    assert sum(r["fsdp_bytes"] for r in reports) >= state_bytes
    return directory


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_fsdp_checkpoint_of_four_ranks_reshards_bitwise(saved_on_four: Path, ranks: int) -> None:
    reports = launch(ranks, "restore", saved_on_four)
    for rank, report in enumerate(reports):
        for case in ("fsdp->fsdp", "fsdp->ddp", "ddp->fsdp", "hsdp->fsdp"):
            assert report[f"{case} step"] == 3
            assert report[f"{case} differ"] == [], (case, rank)
            assert report[f"{case} extra"] == [{"epoch": 2}, {"rank": rank % 4}]
        assert (
            "global shape [29, 37] in checkpoint step 3 but [31, 37] in the state to restore into" in report["mismatch"]
        )
        assert report["mismatch untouched"]


@pytest.mark.slow
def test_fsdp_checkpoint_of_four_ranks_restores_in_one_process(saved_on_four: Path) -> None:
    net = model()
    state = TrainState(net, torch.optim.Adam(net.parameters(), lr=0.5))
    with Checkpointer(saved_on_four / "fsdp") as ck:
        assert ck.restore(state) == 3
    now = full_tensors(state)
    reference = load_file(str(saved_on_four / "reference-fsdp.safetensors"))
    assert sorted(now) == sorted(reference)
    assert all(torch.equal(now[name], reference[name]) for name in reference)
    assert state.extra == {"epoch": 2} and state.rank_extra == {"rank": 0}

    other = model((13, 40, 29, 5))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with Checkpointer(saved_on_four / "fsdp") as ck, pytest.raises(StateMismatchError, match=r"0\.weight"):
        ck.restore(TrainState(other, torch.optim.Adam(other.parameters())))
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())


@pytest.mark.slow
def test_hsdp_replicas_share_the_writing_of_each_shard_and_write_nothing_twice(saved_on_four: Path) -> None:
    manifest = json.loads((saved_on_four / "hsdp" / "step-00000003" / "manifest.json").read_text())
    weight = manifest["arrays"]["model/2.weight"]  # 29 x 37: two shard boxes, each held by two replicas
    assert sorted((p[2], p[3]) for p in weight["pieces"]) == [([0, 0], [15, 37]), ([15, 0], [14, 37])]
    writers = {p[0] for a in manifest["arrays"].values() for p in a["pieces"] if a["shape"]}
    assert writers == {0, 1, 2, 3}  # every rank writes a share; replicas never write the same box
    reference = load_file(str(saved_on_four / "reference-hsdp.safetensors"))
    elements = sum(math.prod(a["shape"]) for name, a in manifest["arrays"].items() if name.startswith("model/"))
    assert elements == sum(t.numel() for name, t in reference.items() if name.startswith("model."))


@pytest.mark.slow
def test_each_rank_writes_only_its_share_and_shards_hold_real_shapes(saved_on_four: Path) -> None:
    manifest = json.loads((saved_on_four / "fsdp" / "step-00000003" / "manifest.json").read_text())
    assert manifest["world_size"] == 4 and manifest["version"] == 2
    weight = manifest["arrays"]["model/2.weight"]  # 29 x 37, rows 8+8+8+5 over four ranks
    assert weight["shape"] == [29, 37]
    boxes = sorted((p[0], p[2], p[3]) for p in weight["pieces"])
    assert boxes == [(0, [0, 0], [8, 37]), (1, [8, 0], [8, 37]), (2, [16, 0], [8, 37]), (3, [24, 0], [5, 37])]
    step = manifest["arrays"]["optimizer/state/0.weight/step"]  # replicated: one piece, one writer
    assert len(step["pieces"]) == 1
    shard = load_file(str(saved_on_four / "fsdp" / "step-00000003" / "shard-00003-of-00004.safetensors"))
    assert tuple(shard["model/2.weight@24,0"].shape) == (5, 37)
    assert WIDTHS == (13, 37, 29, 5)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_export_of_four_fsdp_shards_loads_strictly_into_a_plain_model(
    saved_on_four: Path, tmp_path: Path, fmt: str
) -> None:
    out = tmp_path / f"model.{fmt}"
    args = ["checkpoints", "export", str(saved_on_four / "fsdp"), "--out", str(out), "--format", fmt]
    assert main(args) == 0
    tensors = load_file(str(out)) if fmt == "safetensors" else torch.load(out, weights_only=True)
    net = model()
    net.load_state_dict(tensors, strict=True)
    reference = load_file(str(saved_on_four / "reference-fsdp.safetensors"))
    for name, value in net.state_dict().items():
        assert torch.equal(value, reference[f"model.{name}"])

    everything = export(saved_on_four / "fsdp", tmp_path / "all.safetensors", part="")
    saved = load_file(str(everything.path))
    assert torch.equal(saved["optimizer/state/2.weight/exp_avg_sq"], reference["optim.2.weight.exp_avg_sq"])
    assert not any(name.startswith("rank_local/") for name in saved)
    assert everything.step == 3 and everything.tensors == len(saved)


def test_export_refuses_a_bad_format_and_a_missing_step(tmp_path: Path) -> None:
    with Checkpointer(tmp_path / "ck") as ck:
        ck.save(5, {"model": {"w": torch.ones(2, 2)}})
    assert main(["checkpoints", "export", str(tmp_path / "ck"), "--out", str(tmp_path / "x"), "--step", "4"]) == 2
    with pytest.raises(ValueError, match="format must be one of safetensors, torch"):
        export(tmp_path / "ck", tmp_path / "x", format="npz")
    assert not (tmp_path / "x").exists()
    result = export(tmp_path / "ck", tmp_path / "x.safetensors")
    (name, value), *others = load_file(str(result.path)).items()
    assert (name, others, result.step) == ("w", [], 5) and torch.equal(value, torch.ones(2, 2))


def test_export_streams_array_by_array(tmp_path: Path) -> None:
    """Peak memory of an export stays near its largest array, not the checkpoint's size."""
    arrays = {f"w{i}": torch.full((16 << 20,), float(i)) for i in range(8)}  # 8 x 64 MiB
    with Checkpointer(tmp_path / "ck") as ck:
        ck.save(1, {"model": arrays})
    del arrays
    script = (  # ru_maxrss would carry the forking parent's peak: reset the peak (VmHWM) instead
        "import sys\n"
        "from resilient_flows.checkpoint import export\n"
        "def kib(field):\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(field))\n"
        "open('/proc/self/clear_refs', 'w').write('5')\n"
        "base = kib('VmRSS:')\n"
        "export(sys.argv[1], sys.argv[2])\n"
        "print((kib('VmHWM:') - base) // 1024)\n"
    )
    out = tmp_path / "model.safetensors"
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "ck"), str(out)], env=python_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    grown_mib = int(done.stdout.split()[-1])
    assert grown_mib < 3 * 64, f"export grew by {grown_mib} MiB for a 512 MiB checkpoint of 64 MiB arrays"
    assert torch.equal(load_file(str(out))["w7"], torch.full((16 << 20,), 7.0))
