"""``checkpoints list`` without torch, and with ``--json``; ``checkpoints export`` that says which
step it wrote and why not a newer one, takes a run directory and a member, and names the parts
there are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from resilient_flows.checkpoint import Checkpointer, scan
from resilient_flows.cli import main

REPO = Path(__file__).resolve().parents[1]


def save_steps(tier: Path, steps: tuple[int, ...] = (2, 4, 6)) -> None:
    with Checkpointer(tier) as ck:
        for step in steps:
            ck.save(step, {"model": {"w": torch.full((4, 4), float(step))}, "optimizer": {"m": torch.zeros(3)}})


def flip_model_byte(step_dir: Path) -> None:
    """Damage the data of ``model/w`` in the step's shard (the part ``export`` writes by default)."""
    shard = next(step_dir.glob("shard-*.safetensors"))
    data = bytearray(shard.read_bytes())
    size = int.from_bytes(data[:8], "little")
    begin, _ = json.loads(data[8 : 8 + size])["model/w"]["data_offsets"]
    data[8 + size + begin] ^= 0x01
    shard.write_bytes(bytes(data))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory's members ``a`` and ``b``, each with steps 2, 4 and 6."""
    for member in ("a", "b"):
        save_steps(tmp_path / "run" / "members" / member / "checkpoints")
    return tmp_path / "run"


def test_list_imports_no_torch_and_its_json_parses(run_dir: Path) -> None:
    probe = (
        "import sys\nfrom resilient_flows.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "heavy = [m for m in ('torch', 'safetensors', 'parsl') if m in sys.modules]\n"
        "print('IMPORTED', code, *heavy, file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", probe, "checkpoints", "list", "--json", str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=True,
    )
    assert done.stderr.split() == ["IMPORTED", "0"]  # exit status 0, and none of the three imported
    document = json.loads(done.stdout)
    assert (document["version"], document["verified"]) == (1, False)
    assert [tier["path"] for tier in document["tiers"]] == [str(run_dir / f"members/{m}/checkpoints") for m in "ab"]
    (newest, *_) = document["tiers"][0]["checkpoints"]
    assert [c["step"] for c in document["tiers"][0]["checkpoints"]] == [6, 4, 2]
    assert (newest["valid"], newest["problem"], newest["world_size"]) == (True, None, 1)
    assert newest["bytes"] > 0 and newest["created"] > 0


def test_list_json_says_which_newest_is_invalid_and_exits_1(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    shard = next((run_dir / "members/b/checkpoints/step-00000006").glob("shard-*"))
    shard.write_bytes(shard.read_bytes()[:-8])
    assert main(["checkpoints", "list", "--json", str(run_dir)]) == 1
    a, b = json.loads(capsys.readouterr().out)["tiers"]
    assert a["newest_valid"] and not b["newest_valid"]
    assert b["checkpoints"][0]["problem"].startswith("shard-00000-of-00001.safetensors has ")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda m: m["arrays"]["model/w"].update(dtype="F128"), "'model/w' has the unknown dtype 'F128'"),
        (lambda m: m["shards"][0].update(file="../x.safetensors"), "shards[0].file is '../x.safetensors'"),
        (lambda m: m.update(version=1), "version 1 (flat pieces, before sharded state) is no longer read"),
        (lambda m: m.pop("world_size"), "KeyError: 'world_size'"),
    ],
)
def test_list_checks_a_manifest_without_torch_as_verify_does(tmp_path: Path, change, problem: str) -> None:
    save_steps(tmp_path, (2,))
    path = tmp_path / "step-00000002" / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    (listed,) = scan(tmp_path, verify=False)
    (verified,) = scan(tmp_path, verify=True)
    assert problem in str(listed.problem) and not verified.valid


def test_export_passes_over_a_damaged_newest_and_says_so(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    flip_model_byte(run_dir / "members/a/checkpoints/step-00000006")
    out = run_dir.parent / "a.safetensors"
    assert main(["checkpoints", "export", str(run_dir), "a", "--out", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    assert stdout.strip() == f"wrote 1 tensors (64 B) of step 4 to {out}; not the newest: step 6 damaged"
    assert stderr.startswith("warning: passed over step 6, newer but damaged: shard-00000-of-00001.safetensors: ")
    assert "fails its checksum" in stderr
    with safe_open(str(out), "pt") as f:
        assert f.metadata()["step"] == "4" and torch.equal(f.get_tensor("w"), torch.full((4, 4), 4.0))
    assert main(["checkpoints", "export", str(run_dir), "a", "--out", str(out), "--step", "6"]) == 2
    assert "no valid checkpoint to export in" in capsys.readouterr().err


def test_export_takes_the_forms_list_takes(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    out = str(run_dir.parent / "x.safetensors")
    assert main(["checkpoints", "export", str(run_dir), "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {run_dir} holds the checkpoints of 2 member(s): a, b; "
        f"name one: checkpoints export {run_dir} MEMBER --out FILE"
    )
    assert main(["checkpoints", "export", str(run_dir), "c", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "has no checkpoints of a member 'c'; it holds the checkpoints of 2 member(s): a, b" in err
    for source in ([str(run_dir), "b"], [str(run_dir / "members/b")], [str(run_dir / "members/b/checkpoints")]):
        assert main(["checkpoints", "export", *source, "--out", out]) == 0, source
        assert capsys.readouterr().out.startswith("wrote 1 tensors (64 B) of step 6 to ")
    assert main(["checkpoints", "export", str(run_dir / "members/b"), "b", "--out", out]) == 2
    assert "is not a run directory (no members/): MEMBER needs one" in capsys.readouterr().err
    (run_dir / "members/b/checkpoints").rename(run_dir / "b-checkpoints")
    assert main(["checkpoints", "export", str(run_dir), "--out", out]) == 0  # its one member with checkpoints


def test_a_wrong_part_lists_the_parts_there_are(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["checkpoints", "export", str(run_dir / "members/a"), "--out", str(run_dir / "x"), "--part", "optim"]
    assert main(args) == 2
    assert capsys.readouterr().err.strip() == (
        "error: checkpoint step 6 has no arrays under --part 'optim'; its parts: model, optimizer ('' for every array)"
    )
    assert not (run_dir / "x").exists()
