"""An ordered list of tiers, and the flush from the host arena: what each tier holds, what restore
picks, how a flush reads its bytes, and what a flusher killed mid-write leaves behind.

Run as ``python test_tiers.py flusher DIR TIER`` it is the child that the SIGKILL test kills.
"""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import python_env
from trainkit import Problem

from resilient_flows.checkpoint import CheckpointConfig, Checkpointer, CheckpointStats, TierSpec, scan
from resilient_flows.checkpoint import _shardfile as shardfile
from resilient_flows.checkpoint._shardfile import ShardEntry, header_bytes, send_shard, write_shard
from resilient_flows.checkpoint._snapshot import HostArena
from resilient_flows.errors import CheckpointConfigError, CorruptCheckpointError
from resilient_flows.training import _autotune as autotune

KIB = 1 << 10


def three(tmp_path: Path, every: tuple[int, int] = (1, 1)) -> list[TierSpec]:
    """A /dev/shm-like, an SSD-like and a shared tier, all under ``tmp_path``."""
    return [
        TierSpec(tmp_path / "shm"),
        TierSpec(tmp_path / "ssd", persist_every=every[0]),
        TierSpec(tmp_path / "shared", persist_every=every[1]),
    ]


def state_at(step: int, kib: int = 256) -> dict:
    """A state whose every byte depends on ``step``: three arrays of mixed dtypes, and a scalar."""
    g = torch.Generator().manual_seed(step)
    return {
        "w": torch.randn(kib * 128, generator=g),
        "b": torch.randint(0, 1 << 30, (kib * 64,), generator=g, dtype=torch.int64),
        "h": torch.randn(kib * 256, generator=g).half(),
        "step": step,
    }


def same(a: dict, b: dict) -> bool:
    return a["step"] == b["step"] and all(torch.equal(a[k], b[k]) for k in ("w", "b", "h"))


def shard_bytes(tier: Path, step: int) -> bytes:
    (shard,) = (tier / f"step-{step:08d}").glob("shard-*.safetensors")
    return shard.read_bytes()


# ----------------------------------------------------------------------------- the public form


@pytest.mark.parametrize(
    ("tiers", "message"),
    [
        ([], r"^tiers must be a path or a non-empty list"),
        ([1], r"^tiers\[0\] must be a TierSpec or a path, got 1"),
        (["a", "b", "a"], r"^tiers\[2\].path and tiers\[0\].path are the same directory"),
        ([TierSpec("a"), TierSpec("b", persist_every=0)], r"^tiers\[1\].persist_every must be an integer >= 1, got 0"),
        ([TierSpec("a"), TierSpec("b", persist_every=1.5)], r"^tiers\[1\].persist_every must be an integer"),
        ([TierSpec("a", persist_every=2), TierSpec("b")], r"^tiers\[0\].persist_every must be 1"),
        ([TierSpec("a", name="x"), TierSpec("b", name="x")], r"^tiers\[1\].name 'x' is also tiers\[0\]'s"),
        ([TierSpec("a", capacity=10), TierSpec("b")], r"^tiers\[0\].capacity bounds a peer tier's bytes"),
        ([TierSpec("a"), TierSpec("p", peer=True, capacity=0), TierSpec("b")], r"^tiers\[1\].capacity must be"),
        ([TierSpec("p", peer=True), TierSpec("b")], r"^tiers\[0\] is a peer tier: it goes after"),
        ([TierSpec("")], r"^tiers\[0\].path must be a directory"),
    ],
)
def test_bad_tiers_are_one_line_errors_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiers: list, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    for make in (lambda: Checkpointer(tiers), lambda: CheckpointConfig(tiers=tuple(tiers))):
        with pytest.raises(CheckpointConfigError, match=message) as caught:
            make()
        assert "\n" not in str(caught.value)
    assert not any(tmp_path.iterdir()), "a refused configuration created directories"


def test_a_path_is_one_tier_and_a_list_names_its_tiers(tmp_path: Path) -> None:
    with Checkpointer(tmp_path / "s") as one:
        assert [(t.name, t.path) for t in one.tiers] == [("shared", tmp_path / "s")] and one.local is None
    with Checkpointer([tmp_path / "l", TierSpec(tmp_path / "s", persist_every=3)]) as two:
        assert [(t.name, t.path) for t in two.tiers] == [("local", tmp_path / "l"), ("shared", tmp_path / "s")]
        assert two.local is two.tiers[0] and two.shared is two.tiers[1] and two.shared_every == 3
    with Checkpointer(tiers=three(tmp_path)) as ck:
        assert [t.name for t in ck.tiers] == ["local", "local-1", "shared"] and ck.local is ck.tiers[0]


def test_each_tier_persists_every_nth_checkpoint_sent_to_the_tier_before(tmp_path: Path) -> None:
    with Checkpointer(tiers=three(tmp_path, every=(2, 2)), keep=20) as ck:
        for step in range(8):
            ck.save(step, state_at(step, kib=4))
        ck.save(8, state_at(8, kib=4), persist=True)  # through every tier
        ck.wait()
        held = [sorted(tier.committed_steps()) for tier in ck.tiers]
        assert held == [list(range(9)), [1, 3, 5, 7, 8], [3, 7, 8]]
        assert ck.stats.tier_commits == [9, 5, 3] and ck.stats.persisted == 3
        assert ck.stats.flushes_from_arena + ck.stats.flushes_reread == 8
        assert all(bw is not None and bw > 0 for bw in map(ck.stats.bandwidth, range(3)))
    assert all(info.valid for tier in ("shm", "ssd", "shared") for info in scan(tmp_path / tier))


def test_three_tier_restore_picks_the_newest_step_in_any_tier(tmp_path: Path) -> None:
    tiers = three(tmp_path, every=(1, 2))
    with Checkpointer(tiers=tiers, keep=5) as ck:
        for step in (1, 2, 3):
            ck.save(step, state_at(step, kib=8))
    # shm holds 1 2 3, ssd 1 2 3, shared 2 only
    with Checkpointer(tmp_path / "shared") as shared_only:  # another writer puts a newer step there
        shared_only.save(9, state_at(9, kib=8))
    restored = state_at(0, kib=8)
    with Checkpointer(tiers=tiers) as ck:
        assert ck.latest_step() == 9 and ck.restore(restored) == 9
    assert same(restored, state_at(9, kib=8))

    for tier in ("shm", "shared"):  # lose /dev/shm (a reboot) and step 9: ssd holds the newest
        with Checkpointer(tmp_path / tier) as one:
            one.discard_newer_than(2 if tier == "shared" else -1)
    with Checkpointer(tiers=tiers) as ck:
        assert [t.committed_steps()[:1] for t in ck.tiers] == [[], [3], [2]]
        assert ck.restore(restored) == 3
    assert same(restored, state_at(3, kib=8))


def test_resume_through_three_tiers_continues_bit_for_bit(tmp_path: Path) -> None:
    reference = Problem()
    expected = [reference.step(s) for s in range(20)]
    first = Problem()
    with Checkpointer(tiers=three(tmp_path, every=(2, 1))) as ck:
        for s in range(10):
            first.step(s)
            ck.save(s, first.state, overlap=s % 2 == 0)
    for lost in ("shm", "ssd"):  # only the shared copy survives: the node is gone
        with Checkpointer(tmp_path / lost) as one:
            one.discard_newer_than(-1)
    resumed = Problem(seed=7)
    with Checkpointer(tiers=three(tmp_path)) as ck:
        assert ck.restore(resumed.state) == 9
    assert [resumed.step(s) for s in range(10, 20)] == expected[10:]


# ----------------------------------------------------------------------------- where a flush reads


def test_flush_from_the_arena_and_the_reread_give_identical_verified_files(tmp_path: Path) -> None:
    """A flush held up until two newer saves have reused the arena re-reads the node-local file;
    the others write from memory; every copy is byte-identical and verifies."""
    release = threading.Event()

    def hold_first(tier: object, step: int) -> None:
        if getattr(tier, "name", None) == "shared" and step == 0:
            release.wait(30)  # runs in the flusher: it cannot start the next flush meanwhile

    shared, local = tmp_path / "shared", tmp_path / "local"
    with Checkpointer([local, shared], keep=5) as ck:
        ck.save(0, state_at(0), on_commit=hold_first)
        deadline = time.monotonic() + 30
        while ck.stats.persisted < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert ck.flushing, "the flusher should be held in on_commit"
        ck.save(1, state_at(1))  # committed locally, queued for the flusher
        ck.save(2, state_at(2))  # takes the arena: step 1's flush must read the local file
        release.set()
        ck.wait()
        assert not ck.flushing
        assert (ck.stats.flushes_from_arena, ck.stats.flushes_reread) == (2, 1)
    for step in (0, 1, 2):
        assert shard_bytes(shared, step) == shard_bytes(local, step)
    assert all(info.valid for info in scan(shared)) and len(scan(shared)) == 3
    restored = state_at(5)
    with Checkpointer(shared) as ck:
        assert ck.restore(restored, step=1) == 1
    assert same(restored, state_at(1))


class Lease:
    """An arena lease that a newer save wants back after ``chunks`` chunks."""

    def __init__(self, chunks: int) -> None:
        self.left, self.given_back = chunks, False

    @property
    def wanted(self) -> bool:
        self.left -= 1
        return self.left < 0

    def give_back(self) -> None:
        self.given_back = True


@pytest.fixture
def shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A shard of several entries written with 16 KiB chunks from a page-aligned arena (direct
    I/O where the file system has it), as the writer writes it."""
    monkeypatch.setattr(shardfile, "CHUNK", 16 * KIB)
    monkeypatch.setattr(shardfile, "SEND_CHUNK", 16 * KIB)
    sizes = ((3000, torch.float32), (0, torch.int8), (9001, torch.int16), (20000, torch.float64))
    arrays = [torch.arange(n, dtype=dtype) for n, dtype in sizes]
    entries = [ShardEntry(f"a{i}", a.dtype, tuple(a.shape)) for i, a in enumerate(arrays)]
    packed = torch.cat([a.view(torch.uint8) for a in arrays])
    data = torch.frombuffer(mmap.mmap(-1, packed.numel()), dtype=torch.uint8)
    data.copy_(packed)
    head = header_bytes(entries, {"step": "1"})
    src = tmp_path / "src.safetensors"
    record, pieces = write_shard(src, head, entries, data)
    return {"src": src, "head": head, "entries": entries, "data": data, "record": record, "pieces": pieces}


@pytest.mark.parametrize("chunks", [100, 0, 1, 3], ids=["all-memory", "all-file", "switch-in-a2", "switch-in-a3"])
def test_send_shard_switches_to_the_file_at_any_chunk_and_writes_the_same_bytes(
    tmp_path: Path, shard: dict, chunks: int
) -> None:
    lease = Lease(chunks)
    dst = tmp_path / "dst.safetensors"
    s = shard
    came = send_shard(dst, s["head"], s["entries"], s["data"], s["record"], s["pieces"], s["src"], lease)
    assert dst.read_bytes() == s["src"].read_bytes() and lease.given_back
    expected = min(len(s["head"]) + chunks * 16 * KIB, s["record"].nbytes)
    assert came == expected
    shardfile.MappedShard(dst, s["record"]).verify()


@pytest.mark.parametrize("before", [False, True], ids=["after-the-switch", "before-the-switch"])
def test_send_shard_refuses_a_damaged_file_even_before_the_switch_point(
    tmp_path: Path, shard: dict, before: bool
) -> None:
    """The switch (after 3 chunks) falls inside entry a3: its bytes before the switch point are
    read back and hashed too, though memory supplied them."""
    s = shard
    raw = bytearray(s["src"].read_bytes())
    raw[len(s["head"]) + 3 * 16 * KIB - 9 if before else len(raw) - 1] ^= 0x10
    s["src"].write_bytes(bytes(raw))
    dst = tmp_path / "dst.safetensors"
    with pytest.raises(CorruptCheckpointError, match=r"entries \['a3'\] changed since it was committed"):
        send_shard(dst, s["head"], s["entries"], s["data"], s["record"], s["pieces"], s["src"], Lease(3))
    assert not dst.exists() and not dst.with_name(dst.name + ".tmp").exists()


def test_a_save_takes_the_arena_back_from_the_flusher_within_a_chunk() -> None:
    arena = HostArena(pin_memory=False)
    first = arena.acquire()
    arena.release(first)
    assert arena.lend(first) and not arena.wanted
    taken = threading.Event()
    saver = threading.Thread(target=lambda: (arena.acquire(), taken.set()))
    saver.start()
    deadline = time.monotonic() + 10
    while not arena.wanted and time.monotonic() < deadline:
        time.sleep(0.001)
    assert arena.wanted and not taken.is_set()  # the save waits while the flusher reads
    arena.give_back()
    saver.join(10)
    assert taken.is_set() and not arena.lend(first), "the flusher may not read a checkpoint the save replaced"


# ----------------------------------------------------------------------------- measuring the flush's interference


def test_autotuner_charges_each_step_the_slowdown_of_the_flush_seconds_it_overlapped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Steps of 0.1 s of compute; a flush slows compute by 20 %: a step it covers whole takes
    0.125 s, one it overlaps for 0.05 s takes 0.11 s (0.2 x 0.05 longer). Both measure 0.2, so
    flushes shorter than a step are measured too. Steps with a save in them are no samples, nor are
    overlaps under a fifth of a step (their extra time is within a step's jitter)."""
    clock, flushed = [0.0], [0.0]
    monkeypatch.setattr(autotune.time, "monotonic", lambda: clock[0])
    tuner = autotune.AutoTuner(600.0, 7200.0, steps=100)

    def step(seconds: float, flush: float) -> None:
        clock[0] += seconds
        flushed[0] += flush
        tuner.stepped(len(tuner.samples), flushed[0])

    step(5.0, 0.0)  # the first step: start-up, no sample
    for _ in range(3):
        step(0.1, 0.0)
        step(0.125, 0.125)  # covered whole
        tuner.saved(CheckpointStats(last_stall=0.5))
        step(0.9, 0.3)  # holds the save: its stall is l1_cost, not interference
        step(0.11, 0.05)  # overlapped in part
        step(0.1004, 0.002)  # a flush's last 2 ms: too brief to tell
    assert tuner.l2_slowdown() == pytest.approx(0.2)
    observed = tuner.observed(CheckpointStats())
    assert (observed["steps_with_flush"], observed["steps_without_flush"]) == (9, 3)
    idle = autotune.AutoTuner(600.0, 7200.0, steps=100)
    for i in range(5):
        idle.stepped(i, 0.0)
    assert idle.l2_slowdown() == 0.0  # nothing seen with a flush: no interference claimed


def test_the_checkpointer_counts_the_seconds_its_flusher_works(tmp_path: Path) -> None:
    state = {"w": torch.zeros(1 << 20)}
    with Checkpointer([tmp_path / "local", tmp_path / "shared"]) as ck:
        assert ck.flush_seconds == 0.0
        began = time.perf_counter()
        for step in range(3):
            ck.save(step, state)
        ck.wait()
        spent = ck.flush_seconds
        assert 0.0 < spent <= time.perf_counter() - began
        time.sleep(0.05)
        assert ck.flush_seconds == spent  # idle: the counter stands still


# ----------------------------------------------------------------------------- a flusher killed mid-write


def flusher_child(directory: Path, tier: int) -> None:
    """Commit step 0 everywhere, then get killed while step 1's shard is half written to ``tier``."""
    real = shardfile._write_durably
    tiers = three(directory)
    target = Path(tiers[tier].path) / "step-00000001"

    def stall_midway(path: Path, head: bytes, chunks: object, digest: object, aligned: bool) -> int:
        if Path(path).parent != target:
            return real(path, head, chunks, digest, aligned)

        def then_stop() -> object:
            for i, chunk in enumerate(chunks):
                yield chunk
                if i == 1:  # renamed into place: the test never reads a half-written name
                    (directory / "midway.tmp").write_text(str(path))
                    (directory / "midway.tmp").rename(directory / "midway")
                    time.sleep(60)  # the test kills us here

        return real(path, head, then_stop(), digest, aligned)

    shardfile._write_durably = stall_midway
    shardfile.CHUNK = shardfile.SEND_CHUNK = 64 * KIB
    ck = Checkpointer(tiers=tiers, keep=5)
    ck.save(0, state_at(0), persist=True)
    ck.wait()
    ck.save(1, state_at(1), persist=True)
    ck.wait()


@pytest.mark.parametrize("tier", [1, 2], ids=["to-ssd", "to-shared"])
def test_a_flusher_killed_mid_write_leaves_no_half_written_committed_checkpoint(tmp_path: Path, tier: int) -> None:
    child = subprocess.Popen(
        [sys.executable, __file__, "flusher", str(tmp_path), str(tier)], env=python_env(), stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "midway").exists():
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the child never reached the middle of the flush"
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    half = Path((tmp_path / "midway").read_text())
    assert half.name.endswith(".tmp") and 0 < half.stat().st_size < len(shard_bytes(tmp_path / "shm", 1))
    assert not (half.parent / "manifest.json").exists(), "a half-written shard sits in a committed checkpoint"
    names = ("shm", "ssd", "shared")
    for name in names:
        infos = scan(tmp_path / name)
        assert all(info.valid for info in infos), infos
        assert sorted(info.step for info in infos) == ([0, 1] if names.index(name) < tier else [0])
    restored = state_at(7)
    with Checkpointer(tiers=three(tmp_path)) as ck:  # the restart cleans the debris up
        assert ck.restore(restored) == 1
    assert same(restored, state_at(1))
    assert not list(tmp_path.glob("*/**/*.tmp")) and not (half.parent).exists()


if __name__ == "__main__" and sys.argv[1:2] == ["flusher"]:
    torch.set_num_threads(1)
    flusher_child(Path(sys.argv[2]), int(sys.argv[3]))
