"""Faults: processes killed mid-write, full and unwritable file systems, mismatched state."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import python_env
from requires import require
from trainkit import Problem, replicated_digest

from resilient_flows.checkpoint import Checkpointer, CheckpointError, StateMismatchError, TrainState, scan
from resilient_flows.errors import StorageFullError

WORKER = Path(__file__).with_name("kill_worker.py")
TOTAL = 240


class Trainers:
    """Trainers forked from one fork server (``kill_worker.py --serve``): torch is imported once."""

    def __init__(self) -> None:
        self.server = subprocess.Popen(
            [sys.executable, str(WORKER), "--serve"],
            env=python_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def start(self, directory: Path, log: Path) -> Trainer:
        return Trainer(self, int(self._ask(f"run {directory} {TOTAL} {log}", "pid")))

    def close(self) -> str:
        """Stop the server; what the trainers wrote to stderr."""
        self.server.stdin.close()
        self.server.wait(timeout=60)
        return self.server.stderr.read()

    def _ask(self, command: str, answer: str) -> str:
        self.server.stdin.write(command + "\n")
        self.server.stdin.flush()
        kind, value = self.server.stdout.readline().split()
        assert kind == answer, (kind, value)
        return value


class Trainer:
    """One forked trainer: a process of its own, killed with a real SIGKILL."""

    def __init__(self, trainers: Trainers, pid: int) -> None:
        self.trainers, self.pid = trainers, pid

    def exited(self) -> bool:
        state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state == "Z"  # not reaped until wait()

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        return int(self.trainers._ask(f"wait {self.pid}", "status"))


def events(log: Path) -> list[tuple[str, list[str]]]:
    if not log.exists():
        return []
    lines = log.read_text().splitlines()
    return [(line.split()[0], line.split()[1:]) for line in lines if line.strip()]


def wait_for(log: Path, kind: str, trainer: Trainer, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not any(k == kind for k, _ in events(log)):
        if trainer.exited():
            raise AssertionError(f"worker exited early ({trainer.wait()}): {trainer.trainers.close()[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"worker did not log {kind!r} within {timeout}s")
        time.sleep(0.01)


@pytest.mark.slow
def test_sigkill_at_random_moments_never_restores_a_partial_checkpoint(tmp_path: Path) -> None:
    """At least 20 kills; each restart restores exactly a committed state and loses no commit."""
    trainers = Trainers()
    try:
        reference_log = tmp_path / "reference.log"
        assert trainers.start(tmp_path / "reference", reference_log).wait() == 0, trainers.close()[-2000:]
        reference = dict(events(reference_log))["done"][0]

        directory = tmp_path / "killed"
        rng = random.Random(2026)
        saved: dict[int, str] = {}
        newest_commit = -1
        kills = local_debris = shared_debris = 0
        for run in range(40):
            log = tmp_path / f"run-{run:02d}.log"
            trainer = trainers.start(directory, log)
            wait_for(log, "restored", trainer)
            time.sleep(rng.uniform(0.02, 0.6))
            if not trainer.exited():
                trainer.kill()
                kills += 1
            trainer.wait()
            run_events = events(log)
            local_debris += int(run_events[0][1][0]) > 0
            shared_debris += int(run_events[0][1][1]) > 0  # killed while flushing
            (restored,) = [args for kind, args in run_events if kind == "restored"]
            if restored[0] == "None":
                assert newest_commit == -1, "a committed checkpoint was lost"
            else:
                step = int(restored[0])
                assert saved[step] == restored[1], f"restart {run} restored step {step} with a state never saved"
                assert step >= newest_commit, f"restart {run} restored {step}, but {newest_commit} was committed"
            for kind, args in run_events:
                if kind == "saved":
                    saved[int(args[0])] = args[1]
                elif kind == "committed" and args[0] != "None":
                    newest_commit = max(newest_commit, int(args[0]))
            if any(kind == "done" for kind, _ in run_events) or kills >= 22:
                break
        assert kills >= 20
        assert local_debris + shared_debris >= 3, "kills never landed during a write: the test is not testing"
        assert shared_debris >= 1, "no kill landed during a flush to the shared tier"

        final_log = tmp_path / "final.log"
        assert trainers.start(directory, final_log).wait() == 0, trainers.close()[-2000:]
        assert dict(events(final_log))["done"][0] == reference, "resumed training diverged from the uninterrupted run"
    finally:
        trainers.close()
    assert all(info.valid for info in scan(directory))


# ----------------------------------------------------------------------------- file system faults


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (needs root, as in CI, where its absence fails the test)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    require(done.returncode == 0, f"cannot mount a tmpfs here (not root?): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        unmount(mount)


def unmount(mount: Path, wait_s: float = 30.0) -> None:
    """Unmount, waiting while processes still use the file system: the worker pools of a Parsl
    run in it go on exiting for a moment after its shutdown returns, longer on a loaded machine.
    A process still in it at the deadline fails the test. A mount the kernel calls busy with no
    process in it (three times in about a dozen CI runs: a reference no process's files show,
    such as a copy of the mount in another namespace, as the multi-node cluster's nodes have) is
    detached lazily, at once: it goes once that reference does."""
    deadline = time.monotonic() + wait_s
    while True:
        done = subprocess.run(["umount", str(mount)], capture_output=True, text=True)
        if done.returncode == 0:
            return
        used_by = holders(mount) if "busy" in done.stderr else []
        if "busy" in done.stderr and not used_by:
            subprocess.run(["umount", "--lazy", str(mount)], capture_output=True, text=True, check=True)
            return
        if not used_by or time.monotonic() > deadline:
            raise RuntimeError(f"umount {mount}: {done.stderr.strip()}; used by: {used_by or 'none found'}")
        time.sleep(0.5)


def holders(mount: Path) -> list[str]:
    """The processes whose working directory, open files or mappings lie in ``mount``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            links = [os.readlink(proc / "cwd"), *(os.readlink(fd) for fd in (proc / "fd").iterdir())]
            mapped = (proc / "maps").read_text()
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(link.startswith(str(mount)) for link in links) or str(mount) in mapped:
            found.append(f"{proc.name} ({command[:120]})")
    return found


def make_unwritable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    else:
        path.chmod(0o555)


def make_writable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        path.chmod(0o755)


def sized_state(kib: int) -> dict:
    return {"w": torch.arange(kib * 256, dtype=torch.float32), "step": 0}


def test_full_disk_during_flush_reaches_the_caller_and_keeps_earlier_checkpoints(
    tmp_path: Path, small_filesystem: Path
) -> None:
    state = sized_state(400)  # 400 KiB shards: the third does not fit in 1 MiB
    with Checkpointer([tmp_path / "local", small_filesystem / "ckpt"], keep=5) as ck:
        for step in (1, 2):
            state["w"] += 1
            state["step"] = step
            ck.save(step, state)
        ck.wait()
        state["w"] += 1
        state["step"] = 3
        ck.save(3, state)
        with pytest.raises(StorageFullError, match="No space left on device"):
            ck.wait()
        assert ck.latest_step() == 3  # committed in the local tier
    infos = {i.step: i for i in scan(small_filesystem / "ckpt")}
    assert sorted(infos) == [1, 2] and all(i.valid for i in infos.values())
    assert not list((small_filesystem / "ckpt").glob("**/*.tmp")), "the failed flush left debris"
    restored = sized_state(400)
    with Checkpointer(small_filesystem / "ckpt") as ck:
        assert ck.restore(restored) == 2
    assert torch.equal(restored["w"], torch.arange(400 * 256, dtype=torch.float32) + 2)


def test_full_disk_on_the_only_tier_fails_the_next_save_and_training_can_go_on(small_filesystem: Path) -> None:
    state = sized_state(400)
    ck = Checkpointer(small_filesystem / "ckpt", keep=5)
    ck.save(1, state)
    ck.save(2, state)
    ck.save(3, state)  # does not fit; the error is reported at the next call
    time.sleep(0.5)
    with pytest.raises(StorageFullError, match=r"step 3 .* No space left on device"):
        ck.save(4, state)  # queued all the same (every rank queues the same checkpoints); fails too
    with pytest.raises(StorageFullError, match=r"step 4 .* No space left on device"):
        ck.wait()
    shutil.rmtree(small_filesystem / "ckpt" / "step-00000001")  # the operator frees space
    ck.save(5, state)
    ck.close()
    assert [i.step for i in scan(small_filesystem / "ckpt")] == [5, 2]


def test_unwritable_shared_directory_during_flush(tmp_path: Path) -> None:
    shared, local = tmp_path / "shared", tmp_path / "local"
    problem = Problem()
    ck = Checkpointer([local, shared])
    problem.step(0)
    ck.save(0, problem.state)
    ck.wait()
    at_zero = replicated_digest(problem.state)
    make_unwritable(shared)
    try:
        problem.step(1)
        ck.save(1, problem.state)
        with pytest.raises(CheckpointError, match=f"flush of step 1 to the shared tier {shared}"):
            ck.wait()
    finally:
        make_writable(shared)
    problem.step(2)
    ck.save(2, problem.state)  # the file system is back: checkpointing recovers
    ck.close()
    assert [i.step for i in scan(shared)] == [2, 0]
    with Checkpointer(shared) as only_shared:
        fresh = Problem(seed=3)
        assert only_shared.restore(fresh.state, step=0) == 0
    assert replicated_digest(fresh.state) == at_zero


def test_unwritable_directory_at_construction_is_a_clear_error(tmp_path: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    make_unwritable(parent)
    try:
        with pytest.raises(CheckpointError, match="cannot prepare the shared checkpoint directory"):
            Checkpointer(parent / "ckpt")
    finally:
        make_writable(parent)


# ----------------------------------------------------------------------------- mismatched state


@pytest.fixture
def saved_problem(tmp_path: Path) -> Path:
    problem = Problem(width=32)
    problem.step(0)
    with Checkpointer(tmp_path / "ckpt") as ck:
        ck.save(0, problem.state)
    return tmp_path / "ckpt"


def test_wrong_shape_names_the_key_and_leaves_the_state_alone(saved_problem: Path) -> None:
    other = Problem(width=48)
    before = replicated_digest(other.state)
    with (
        Checkpointer(saved_problem) as ck,
        pytest.raises(
            StateMismatchError,
            match=r"'model/0.weight' has shape \[32, 16\] in checkpoint step \d+ but \[48, 16\] in the state to",
        ),
    ):
        ck.restore(other.state)
    assert replicated_digest(other.state) == before


def test_missing_and_unexpected_keys_are_named(saved_problem: Path) -> None:
    deeper = Problem(width=32, depth=3)
    with Checkpointer(saved_problem) as ck:
        with pytest.raises(StateMismatchError, match=r"has no 'model/7.weight'"):
            ck.restore(deeper.state)
        with pytest.raises(StateMismatchError, match=r"has 'model/0.weight', which the state to restore into does not"):
            ck.restore({"model": {}})


def test_wrong_dtype_is_named(saved_problem: Path) -> None:
    problem = Problem(width=32)
    problem.model.double()
    with (
        Checkpointer(saved_problem) as ck,
        pytest.raises(StateMismatchError, match=r"is torch.float32 in checkpoint step \d+ but torch.float64"),
    ):
        ck.restore(TrainState(problem.model))


def test_optimizer_with_other_parameter_groups_is_refused_before_anything_changes(saved_problem: Path) -> None:
    problem = Problem(width=32)
    params = list(problem.model.parameters())
    optimizer = torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:]}])
    state = TrainState(problem.model, optimizer)
    before = replicated_digest(state)
    with Checkpointer(saved_problem) as ck, pytest.raises(StateMismatchError, match="parameter groups of sizes"):
        ck.restore(state)
    assert replicated_digest(state) == before
