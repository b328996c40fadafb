"""Cloning: exact continuation, overrides applied after the state, clear errors, fallback when the
source dies mid-transfer."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import python_env

from resilient_flows.checkpoint import CheckpointConfig, read_checkpoint
from resilient_flows.cli import main
from resilient_flows.clone import request_clone
from resilient_flows.errors import CloneError
from resilient_flows.training import MemberSpec, read_events, run_member, state_digest
from resilient_flows.training._members import read_spec, register_member
from resilient_flows.training._workloads import batch_indices, builtin_model
from resilient_flows.workflow._status import loss_curve

SOURCE = MemberSpec(
    name="src",
    workload="cnn-digits",
    params={"lr": 0.05, "dropout": 0.2},
    seed=11,
    steps=160,
    checkpoint=CheckpointConfig(interval_steps=25, keep=2),
)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    register_member(tmp_path, SOURCE)
    return tmp_path


def test_an_unchanged_clone_continues_bit_for_bit_like_its_source(run_dir: Path) -> None:
    (clone,) = request_clone(run_dir, "src", at_step=80)
    source = run_member(SOURCE.to_dict(), str(run_dir))  # forks after step 80 and keeps training
    result = run_member(read_spec(run_dir, clone).to_dict(), str(run_dir))
    mine, theirs = loss_curve(run_dir, clone), loss_curve(run_dir, "src")
    assert min(mine) == 81 and len(mine) == 160 - 81
    assert all(mine[s] == theirs[s] for s in range(81, 131))  # the next 50 steps, and all the rest
    assert mine == {s: v for s, v in theirs.items() if s > 80}
    assert result["digest"] == source["digest"]
    forked = [e for e in read_events(run_dir) if e["kind"] in ("forked", "cloned")]
    assert [(e["kind"], e["member"], e["step"]) for e in forked] == [("forked", "src", 80), ("cloned", clone, 80)]
    assert forked[1]["transport"] == "shared tier (hard link)" and forked[1]["fallback"] is None
    assert forked[0]["stall_ms"] < 1000 and forked[1]["readiness_s"] >= forked[1]["standby_s"] > 0


def test_an_lr_override_applies_from_the_first_step_and_changes_nothing_else(run_dir: Path) -> None:
    request_clone(run_dir, "src", n=2, overrides=[{"lr": 0.2, "steps": 82}, {"lr": 0.2}], at_step=80)
    run_member(SOURCE.to_dict(), str(run_dir))
    one_step = run_member(read_spec(run_dir, "src.c1").to_dict(), str(run_dir))
    run_member(read_spec(run_dir, "src.c2").to_dict(), str(run_dir))

    # Reference: the source's state after step 80, lr set to 0.2, one step 81 by hand.
    _, state = read_checkpoint(run_dir / "members/src.c1/checkpoints", step=80)
    model, data, _ = builtin_model("cnn-digits", SOURCE.params)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rank_local"]["rng"]["torch"])
    for group in optimizer.param_groups:
        group["lr"] = 0.2
    model.train()
    index = batch_indices(11, 81, len(data.x_train), 64)
    loss = torch.nn.functional.cross_entropy(model(data.x_train[index]), data.y_train[index])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    assert one_step["digest"] == state_digest(model)
    assert loss_curve(run_dir, "src.c1") == {81: loss.item()}
    assert loss_curve(run_dir, "src.c2")[81] == loss_curve(run_dir, "src")[81]  # same weights going into step 81
    assert loss_curve(run_dir, "src.c2")[82] != loss_curve(run_dir, "src")[82]
    _, final = read_checkpoint(run_dir / "members/src.c2/checkpoints")
    assert [g["lr"] for g in final["optimizer"]["param_groups"]] == [0.2]
    assert [g["momentum"] for g in final["optimizer"]["param_groups"]] == [0.9]


@pytest.mark.parametrize(
    ("member", "overrides", "message"),
    [
        ("nope", {}, r"has no member 'nope'; its members: src"),
        ("src", {"lrr": 0.1}, r"unknown hyperparameter 'lrr' for member src; allowed: .*batch_size.*lr.*seed.*steps"),
        ("src", {"hidden": 128}, r"override 'hidden' would change the shape of src's model"),
        ("src", [{}, {}], r"2 sets of overrides for 1 clones"),
    ],
)
def test_bad_clone_requests_are_refused_before_anything_is_written(run_dir: Path, member, overrides, message) -> None:
    with pytest.raises(CloneError, match=message):
        request_clone(run_dir, member, overrides=overrides)
    assert sorted(p.name for p in (run_dir / "members").iterdir()) == ["src"]
    assert not list((run_dir / "members/src").glob("clone-order.*"))


def test_a_finished_member_cannot_be_cloned(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    run_member(SOURCE.to_dict(), str(run_dir))
    with pytest.raises(CloneError, match=r"member 'src' has finished: only a running member can be cloned"):
        request_clone(run_dir, "src")


def tier_fingerprint(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_a_source_killed_mid_transfer_leaves_the_clone_its_newest_committed_checkpoint(run_dir: Path) -> None:
    long_source = SOURCE.__class__(**{**SOURCE.__dict__, "steps": 100_000})
    register_member(run_dir, long_source)
    (clone,) = request_clone(run_dir, "src", overrides={"steps": 300}, at_step=60)
    source = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("clone_source.py")), str(run_dir), "src"], env=python_env()
    )
    deadline = time.monotonic() + 60
    while not list((run_dir / "members/src").glob("clone-order.*.forking")):
        assert time.monotonic() < deadline and source.poll() is None, "the source never started forking"
        time.sleep(0.005)
    time.sleep(0.3)  # its checkpoint of step 60 commits; the hand-off sleeps in the slow adopt
    source.send_signal(signal.SIGKILL)
    source.wait()
    source_tier = run_dir / "members/src/checkpoints"
    before = tier_fingerprint(source_tier)

    result = run_member(read_spec(run_dir, clone).to_dict(), str(run_dir))
    seed = json.loads((run_dir / f"members/{clone}/seed.json").read_text())
    newest = max(int(p.name.split("-")[1]) for p in source_tier.glob("step-*") if (p / "manifest.json").exists())
    assert seed["step"] == newest >= 60 and seed["transport"] == "shared tier (fallback)"
    assert f"died before its checkpoint of step 60 committed; took step {newest}" in seed["fallback"]
    assert result["step"] == 299
    assert tier_fingerprint(source_tier) == before  # the source's checkpoints are untouched
    (cloned,) = [e for e in read_events(run_dir) if e["kind"] == "cloned"]
    assert cloned["fallback"] == seed["fallback"]


def test_the_cli_clones_and_draws_the_lineage(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    from resilient_flows.rundir import run_layout

    run_layout(run_dir).plan.write_text(
        json.dumps(
            {
                "site": "local",
                "workflow": {"name": "t", "members": [{"name": "src", "workload": "cnn-digits", "steps": 160}]},
                "members": [SOURCE.to_dict()],
            }
        )
    )
    assert main(["clone", str(run_dir), "src", "-n", "2", "--set", "lr=0.01", "--set", "seed=7"]) == 0
    assert "cloning src into src.c1, src.c2" in capsys.readouterr().out
    spec = read_spec(run_dir, "src.c2")
    assert (spec.seed, spec.params["lr"], spec.parent.overrides) == (7, 0.01, {"lr": 0.01, "seed": 7})
    assert main(["clone", str(run_dir), "src", "--set", "lr"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err
    assert main(["lineage", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "src.c1" in out and "waiting for its state; lr=0.01, seed=7" in out


def test_a_clone_that_starts_while_its_source_hands_it_a_checkpoint_keeps_the_hand_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clone's Checkpointer cleans its tiers as it starts; the source's adopt into the clone's
    tier (another process, still running) is not debris to it. Under load the runner starts the
    clone as soon as the order is served, and the clone then waited out its seed timeout."""
    from trainkit import Problem

    from resilient_flows.checkpoint import Checkpointer, Tier

    problem = Problem()
    problem.step(0)
    with Checkpointer(tmp_path / "source") as ck:
        ck.save(0, problem.state)
    clone_tier = tmp_path / "clone"
    starts = []
    real_link = os.link

    def link_while_the_clone_starts(src: Path, dst: Path) -> None:
        if not starts:  # the clone's first Checkpointer, in a process of its own, mid-adopt
            starts.append(subprocess.run([sys.executable, "-c", CLONE_STARTS, str(clone_tier)], env=python_env()))
        real_link(src, dst)

    monkeypatch.setattr(os, "link", link_while_the_clone_starts)
    target = Tier(clone_tier, "shared").adopt(Tier(tmp_path / "source", "shared").step_dir(0), 0)
    monkeypatch.undo()
    assert starts[0].returncode == 0
    source_files = {p.name: p.read_bytes() for p in (tmp_path / "source" / target.name).iterdir()}
    assert {p.name: p.read_bytes() for p in target.iterdir()} == source_files
    restored = Problem(seed=5)
    with Checkpointer(clone_tier) as ck:
        assert ck.restore(restored.state) == 0
    assert all(torch.equal(a, b) for a, b in zip(restored.model.parameters(), problem.model.parameters(), strict=True))


CLONE_STARTS = "import sys; from resilient_flows.checkpoint import Checkpointer; Checkpointer(sys.argv[1]).close()"


def test_what_a_dead_or_long_silent_outside_writer_left_in_a_tier_is_cleaned(tmp_path: Path) -> None:
    import socket

    from resilient_flows.checkpoint import Tier
    from resilient_flows.checkpoint import _tiers as tiers

    ended = subprocess.Popen(["true"])  # a process id that has ended
    ended.wait()
    here, pid = socket.gethostname(), os.getpid()
    names = {
        f".adopt-7-{here}.{pid + 10**7}": False,  # no such process
        f"latest.{here}.{ended.pid}.tmp": False,
        f".adopt-7-{here}.{os.getppid()}": True,  # a writer of this host that runs
        f"latest.{here}.{os.getppid()}.tmp": True,
        ".adopt-7-elsewhere.example.12": True,  # another host's, written just now
        ".adopt-8-elsewhere.example.12": False,  # another host's, silent for longer than allowed
        ".adopt-7-4242": False,  # the old naming: nobody to ask
    }
    for name in names:
        (tmp_path / name).mkdir() if name.startswith(".adopt") else (tmp_path / name).write_text("7\n")
    old = time.time() - tiers.FOREIGN_WRITER_S - 60
    os.utime(tmp_path / ".adopt-8-elsewhere.example.12", (old, old))
    Tier(tmp_path, "shared").clean_debris()
    assert {name: (tmp_path / name).exists() for name in names} == names


def test_a_hand_off_that_fails_sends_the_clone_to_the_newest_checkpoint_at_once(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainkit import Problem

    from resilient_flows.checkpoint import Checkpointer, Tier
    from resilient_flows.rundir._control import read_clone_orders
    from resilient_flows.training._fork import Handoff, mark_forking, wait_for_seed

    (clone,) = request_clone(run_dir, "src", at_step=4)
    problem = Problem()
    problem.step(0)
    source_tier = run_dir / "members/src/checkpoints"
    with Checkpointer(source_tier) as ck:
        ck.save(4, problem.state)
    (order,) = read_clone_orders(run_dir / "members/src")
    mark_forking(run_dir, "src", order, 4, 1)  # served by this process, which lives on

    def full(self: Tier, source: Path, step: int) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Tier, "adopt", full)
    Handoff(run_dir, "src", [order], 0, 1)(Tier(source_tier, "shared"), 4)
    monkeypatch.undo()
    started = time.monotonic()
    with Checkpointer(run_dir / f"members/{clone}/checkpoints") as ck:
        seed = wait_for_seed(run_dir, read_spec(run_dir, clone), ck, timeout=120)
    assert time.monotonic() - started < 10  # not the seed timeout
    assert seed.step == 4 and seed.transport == "shared tier (fallback)"
    assert seed.fallback == "the hand-off failed: shared tier: [Errno 28] No space left on device; took step 4"
