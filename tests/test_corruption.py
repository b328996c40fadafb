"""Damaged checkpoints are detected by restore and by the CLI, which fall back and say why."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from trainkit import Problem, digest, replicated_digest

from resilient_flows.checkpoint import Checkpointer, CheckpointError, scan
from resilient_flows.cli import main


def shard_of(step_dir: Path) -> Path:
    return next(step_dir.glob("shard-*.safetensors"))


def flip_byte(step_dir: Path) -> None:
    shard = shard_of(step_dir)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))


def flip_header_byte(step_dir: Path) -> None:
    shard = shard_of(step_dir)
    data = bytearray(shard.read_bytes())
    data[20] ^= 0x20
    shard.write_bytes(bytes(data))


def truncate(step_dir: Path) -> None:
    shard = shard_of(step_dir)
    shard.write_bytes(shard.read_bytes()[:-100])


def remove_shard(step_dir: Path) -> None:
    shard_of(step_dir).unlink()


def malform_manifest(step_dir: Path) -> None:
    (step_dir / "manifest.json").write_text('{"format": "resilient-flows-checkpoint", "version": 1, "step": ')


def wrong_manifest_field(step_dir: Path) -> None:
    path = step_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["shards"][0]["bytes"] = "many"
    path.write_text(json.dumps(manifest))


def manifest_from_another_step(step_dir: Path) -> None:
    path = step_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["step"] = 1
    path.write_text(json.dumps(manifest))


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "flipped data byte": (flip_byte, "fails its checksum"),
    "flipped header byte": (flip_header_byte, "fails its checksum"),
    "truncated shard": (truncate, "has .* bytes, the manifest says"),
    "missing shard": (remove_shard, "is missing"),
    "malformed manifest": (malform_manifest, "manifest is not valid JSON"),
    "wrong manifest field": (wrong_manifest_field, "malformed manifest"),
    "manifest of another step": (manifest_from_another_step, "the manifest says step 1"),
}


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict[int, str]]:
    """Steps 2, 4 and 6 committed in one tier, with the digest of the state each one holds."""
    problem = Problem()
    digests = {}
    with Checkpointer(tmp_path / "ckpt", keep=5) as ck:
        for s in range(7):
            problem.step(s)
            if s % 2 == 0 and s:
                ck.save(s, problem.state)
                digests[s] = replicated_digest(problem.state)
    return tmp_path / "ckpt", digests


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_restore_falls_back_to_the_previous_valid_checkpoint(saved: tuple[Path, dict[int, str]], damage: str) -> None:
    directory, digests = saved
    harm, reason = DAMAGES[damage]
    harm(directory / "step-00000006")
    fresh = Problem(seed=5)
    with Checkpointer(directory) as ck:
        assert ck.restore(fresh.state) == 4
        (skipped,) = ck.skipped
    assert skipped.step == 6 and skipped.tier == "shared"
    assert re.search(reason, skipped.reason), skipped.reason
    assert replicated_digest(fresh.state) == digests[4]


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_verify_reports_the_damage_and_fails_when_the_newest_is_invalid(
    saved: tuple[Path, dict[int, str]], damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _ = saved
    harm, _reason = DAMAGES[damage]
    harm(directory / "step-00000006")
    assert main(["checkpoints", "verify", str(directory)]) == 1
    out = capsys.readouterr().out
    assert "step 6" in out and "is invalid" in out
    infos = {i.step: i for i in scan(directory)}
    assert not infos[6].valid and infos[4].valid and infos[2].valid


def test_an_older_damaged_checkpoint_does_not_fail_verify(saved: tuple[Path, dict[int, str]]) -> None:
    directory, _ = saved
    flip_byte(directory / "step-00000002")
    assert main(["checkpoints", "verify", str(directory)]) == 0
    assert main(["checkpoints", "list", str(directory)]) == 0  # list only checks sizes: a flip passes


def test_list_checks_sizes_without_reading_data(saved: tuple[Path, dict[int, str]]) -> None:
    directory, _ = saved
    truncate(directory / "step-00000006")
    assert main(["checkpoints", "list", str(directory)]) == 1


def test_step_directory_without_manifest_is_not_a_checkpoint_and_is_cleaned(
    saved: tuple[Path, dict[int, str]],
) -> None:
    directory, _ = saved
    (directory / "step-00000006" / "manifest.json").unlink()
    (directory / "step-00000006" / "shard-00000-of-00001.safetensors.tmp").write_bytes(b"partial")
    assert [i.step for i in scan(directory)] == [4, 2]
    with Checkpointer(directory) as ck:
        assert not (directory / "step-00000006").exists()
        assert ck.latest_step() == 4


def test_every_checkpoint_damaged_restores_nothing_and_says_why(saved: tuple[Path, dict[int, str]]) -> None:
    directory, _ = saved
    for step in (2, 4, 6):
        flip_byte(directory / f"step-{step:08d}")
    with Checkpointer(directory) as ck:
        assert ck.restore(Problem().state) is None
        assert [s.step for s in ck.skipped] == [6, 4, 2]
        with pytest.raises(CheckpointError, match="no valid checkpoint of step 4"):
            ck.restore(Problem().state, step=4)


def test_cli_on_a_missing_directory_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoints", "list", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "nope is not a directory" in err and "Traceback" not in err


def test_cli_finds_tiers_below_a_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    problem = Problem()
    problem.step(0)
    for member in ("a", "b"):
        with Checkpointer(tmp_path / "run" / member / "ckpt") as ck:
            ck.save(0, problem.state)
    assert main(["checkpoints", "verify", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "run" / "a" / "ckpt") in out and str(tmp_path / "run" / "b" / "ckpt") in out


def test_a_member_whose_newest_checkpoints_are_damaged_trains_on_and_saves_them_again(tmp_path: Path) -> None:
    """Restore falls back below two damaged checkpoints; training goes on from there, writes those
    steps afresh (it used to refuse: an older step than one already committed) and ends bitwise
    like a run that never broke."""
    from resilient_flows.checkpoint import CheckpointConfig
    from resilient_flows.training import MemberSpec, run_member

    spec = MemberSpec(
        name="m", workload="userworkload:train", params={}, steps=30, checkpoint=CheckpointConfig(interval_steps=10)
    )
    run_member(spec.to_dict(), str(tmp_path / "run"))
    tier = tmp_path / "run/members/m/checkpoints"
    for step in (19, 29):
        flip_byte(tier / f"step-{step:08d}")
    (tmp_path / "run/members/m/result.json").unlink()
    longer = replace(spec, steps=50)
    result = run_member(longer.to_dict(), str(tmp_path / "run"))
    assert result["digest"] == run_member(longer.to_dict(), str(tmp_path / "reference"))["digest"]
    assert [i.step for i in scan(tier) if i.valid] == [49, 39, 29]
    assert all(i.valid for i in scan(tier, verify=True))


def flip_last_data_byte(step_dir: Path) -> None:
    shard = shard_of(step_dir)
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))


def saved_steps_two_and_four(directory: Path, fallback: bool) -> dict | None:
    """A trained problem's step 4, and with ``fallback`` its step 2, saved in ``directory``; step 2
    as saved (its replicated part), to compare a fallback restore with."""
    problem = Problem(width=768)
    with Checkpointer(directory, keep=5) as ck:
        for s in range(1, 5):
            problem.step(s)
            if s in (2, 4) and (fallback or s == 4):
                ck.save(s, problem.state)
        ck.wait()
    if not fallback:
        return None
    at_two = Checkpointer(directory).load(2)
    at_two.pop("rank_local")
    return at_two


@pytest.mark.parametrize("fallback", [False, True], ids=["no-fallback", "fallback"])
def test_a_damaged_checkpoint_changes_no_byte_of_a_trained_state_or_restores_the_fallback_whole(
    tmp_path: Path, fallback: bool
) -> None:
    """Pieces large enough for their memory to be faulted in ahead of the copy, the damage in the
    last one: the pieces before it pass their checksums, and still none of them is copied."""
    at_two = saved_steps_two_and_four(tmp_path, fallback)
    flip_last_data_byte(tmp_path / "step-00000004")
    live = Problem(width=768, seed=3)
    for s in range(3):
        live.step(s)
    before = replicated_digest(live.state)
    with Checkpointer(tmp_path) as ck:
        assert ck.restore(live.state) == (2 if fallback else None)
        assert "fails its checksum" in ck.skipped[0].reason
    if fallback:
        assert replicated_digest(live.state) == digest(at_two)
    else:
        assert replicated_digest(live.state) == before


def flip_byte_of(step_dir: Path, array: str) -> None:
    """Flip the last byte of the piece that holds ``array``."""
    manifest = json.loads((step_dir / "manifest.json").read_text())
    ((index, key, *_),) = manifest["arrays"][array]["pieces"]
    shard = step_dir / manifest["shards"][index]["file"]
    data = bytearray(shard.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    _, end = json.loads(data[8 : 8 + length])[key]["data_offsets"]
    data[8 + length + end - 1] ^= 0x01
    shard.write_bytes(bytes(data))


@pytest.mark.parametrize("fallback", [False, True], ids=["no-fallback", "fallback"])
def test_optimizer_state_filled_while_it_is_verified_is_dropped_when_a_piece_fails(
    tmp_path: Path, fallback: bool
) -> None:
    """A state that has not stepped gets its optimizer state created for the restore and filled
    as it is hashed: a damaged moment leaves the optimizer without state, or with the fallback's."""
    at_two = saved_steps_two_and_four(tmp_path, fallback)
    flip_byte_of(tmp_path / "step-00000004", "optimizer/state/4.weight/exp_avg_sq")
    fresh = Problem(width=768, seed=3)
    before = replicated_digest(fresh.state)
    with Checkpointer(tmp_path) as ck:
        assert ck.restore(fresh.state) == (2 if fallback else None)
        assert "fails its checksum" in ck.skipped[0].reason
    if fallback:
        assert replicated_digest(fresh.state) == digest(at_two)
    else:
        assert not fresh.optimizer.state
        assert replicated_digest(fresh.state) == before
