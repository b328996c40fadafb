"""Data-parallel members: two real MPI ranks share one checkpointer, directly and through Parsl."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import mpiexec, python_env

from resilient_flows.checkpoint import CheckpointConfig
from resilient_flows.cli import main
from resilient_flows.training import FaultSpec, MemberSpec, read_events
from resilient_flows.training._contract import EXIT_PEER_LOST, EXIT_PREEMPTED
from resilient_flows.training._faults import PEER_LOST, attempt_fault
from resilient_flows.workflow._status import loss_curve

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

SPEC = MemberSpec(
    name="dp",
    workload="mlp-digits",
    params={"hidden": 48},
    seed=1,
    steps=60,
    checkpoint=CheckpointConfig(interval_steps=10),
    ranks=2,
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An uninterrupted run on two ranks: each rank trains half of every global batch."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    assert mpi_member(SPEC, run_dir) == 0
    return json.loads((run_dir / "members/dp/result.json").read_text())


def mpi_member(spec: MemberSpec, run_dir: Path) -> int:
    spec_path = run_dir.parent / f"{spec.name}.json"
    spec_path.write_text(json.dumps(spec.to_dict()))
    command = [
        mpiexec(),
        "-n",
        "2",
        sys.executable,
        "-m",
        "resilient_flows.training.mpi_member",
        str(spec_path),
        str(run_dir),
    ]
    done = subprocess.run(command, env=python_env(), timeout=180, capture_output=True, text=True)
    if done.returncode not in (0, EXIT_PREEMPTED):
        print(done.stdout[-4000:], done.stderr[-8000:], sep="\n")  # shown when the test fails
    return done.returncode


def test_two_ranks_preempted_then_resumed_end_like_two_uninterrupted_ranks(tmp_path: Path, reference: dict) -> None:
    preempted = replace(SPEC, faults=(FaultSpec("preempt", 26),))  # SIGTERM on both ranks' first attempt
    run_dir = tmp_path / "run"
    assert mpi_member(preempted, run_dir) == EXIT_PREEMPTED
    latest = run_dir / "members/dp/checkpoints/step-00000026"
    assert sorted(p.name for p in latest.iterdir()) == [
        "manifest.json",
        "shard-00000-of-00002.safetensors",
        "shard-00001-of-00002.safetensors",
    ]
    assert mpi_member(preempted, run_dir) == 0
    result = json.loads((run_dir / "members/dp/result.json").read_text())
    assert result["digest"] == reference["digest"]
    kinds = [(e["kind"], e.get("step")) for e in read_events(run_dir) if e["kind"] in ("preempted", "resumed")]
    assert kinds == [("preempted", 26), ("resumed", 26)]  # rank 0 reports for both


def test_a_two_rank_member_in_a_workflow_is_requeued_free_after_preemption(
    tmp_path: Path, capsys, reference: dict
) -> None:
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(
        "name: dp\nretries: 0\ncheckpoint: {interval: 10}\n"
        "members:\n  - {name: dp, workload: mlp-digits, steps: 60, seed: 1, params: {hidden: 48}, ranks: 2}\n"
        "faults:\n  - {preempt: dp, at_step: 26}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["run", str(workflow), "--run-dir", str(run_dir)]) == 0  # retries: 0, yet it continued
    (failed,) = [e for e in read_events(run_dir) if e["kind"] == "failed"]
    assert failed["cause"] == "preempted" and failed["cost"] == 0.0 and failed["checkpoint"] == 26
    assert json.loads((run_dir / "members/dp/result.json").read_text())["digest"] == reference["digest"]


def test_an_fsdp_member_sigkilled_mid_run_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    fsdp = replace(SPEC, parallel="fsdp")
    assert mpi_member(fsdp, tmp_path / "ref") == 0
    reference = json.loads((tmp_path / "ref/members/dp/result.json").read_text())
    killed = replace(fsdp, faults=(FaultSpec("kill", 33),))  # SIGKILL on both ranks, mid-interval
    run_dir = tmp_path / "run"
    assert mpi_member(killed, run_dir) != 0
    committed = sorted((run_dir / "members/dp/checkpoints").glob("step-*/manifest.json"))
    assert committed, "a checkpoint was committed before the kill"
    manifest = json.loads(committed[-1].read_text())
    sharded = [a for name, a in manifest["arrays"].items() if name.startswith("model/") and len(a["pieces"]) == 2]
    assert sharded, "FSDP parameters are saved as one piece per rank"
    assert mpi_member(killed, run_dir) == 0
    result = json.loads((run_dir / "members/dp/result.json").read_text())
    assert result["digest"] == reference["digest"]  # bit for bit, parameters gathered from both shards
    resumed = [e["step"] for e in read_events(run_dir) if e["kind"] == "resumed"]
    assert resumed == [manifest["step"]]


def test_clones_of_an_fsdp_member_on_the_same_and_on_another_rank_count(tmp_path: Path) -> None:
    """Same layout: bit for bit. One rank instead of two: within reduction-order noise."""
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(
        "name: dp\ncheckpoint: {interval: 10}\n"
        "members:\n  - {name: dp, workload: mlp-digits, steps: 60, seed: 1, params: {hidden: 48}, ranks: 2, "
        "parallel: fsdp}\n"
        "clones:\n  - {member: dp, at_step: 20}\n  - {member: dp, at_step: 20, ranks: 1}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["run", str(workflow), "--run-dir", str(run_dir)]) == 0
    result = {n: json.loads((run_dir / f"members/{n}/result.json").read_text()) for n in ("dp", "dp.c1", "dp.c2")}
    assert result["dp.c1"]["digest"] == result["dp"]["digest"]
    source, other = loss_curve(run_dir, "dp"), loss_curve(run_dir, "dp.c2")
    assert min(other) == 21 and max(other) == 59
    for step, loss in other.items():
        assert loss == pytest.approx(source[step], rel=1e-5), step
    spec = json.loads((run_dir / "members/dp.c2/spec.json").read_text())
    assert spec["ranks"] == 1 and spec["parallel"] == "fsdp"


def rank_processes(spec_path: Path) -> dict[int, int]:
    """rank -> pid of the Python processes of the member launched with ``spec_path``."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ranks = [v.split(b"=", 1)[1] for v in environ if v.startswith(b"PMI_RANK=")]
        if str(spec_path).encode() in command and ranks:  # the shell around it holds the command in one word
            found[int(ranks[0])] = int(entry)
    return found


def test_a_rank_whose_peer_is_sigkilled_exits_peer_lost_at_once(tmp_path: Path) -> None:
    """Rank 1 SIGKILLed mid-run: rank 0 sees its connection reset in the next collective, records
    the peer's loss and exits with EXIT_PEER_LOST, not after torch's 30-minute collective timeout.
    The launcher is told not to kill the survivor first (``-disable-auto-cleanup``, SIGUSR1 ignored):
    the survivor's own status is what is checked."""
    run_dir = tmp_path / "run"
    spec_path = tmp_path / "dp.json"
    spec_path.write_text(json.dumps(replace(SPEC, steps=100_000).to_dict()))
    member = shlex.join([sys.executable, "-m", "resilient_flows.training.mpi_member", str(spec_path), str(run_dir)])
    # hydra tells the survivors of a failed rank with SIGUSR1, which would end the shell before it writes
    rank = f'trap "" USR1; {member}; echo $? > "{tmp_path}/status-$PMI_RANK"'
    launcher = subprocess.Popen(
        [mpiexec(), "-disable-auto-cleanup", "-n", "2", "sh", "-c", rank],
        env=python_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while not list((run_dir / "members/dp/checkpoints").glob("step-*/manifest.json")):
            assert time.monotonic() < deadline and launcher.poll() is None, "no checkpoint"
            time.sleep(0.2)
        ranks = rank_processes(spec_path)
        assert sorted(ranks) == [0, 1]
        os.kill(ranks[1], signal.SIGKILL)
        launcher.wait(timeout=120)  # generous on a loaded machine; the default timeout is 30 minutes
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert (tmp_path / "status-0").read_text().strip() == str(EXIT_PEER_LOST)
    fault = attempt_fault(run_dir / "members/dp")
    assert fault is not None and fault["kind"] == PEER_LOST and fault["rank"] == 0
