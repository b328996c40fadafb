"""Members on one node each lose their node, on the multi-node cluster of ``.ci/slurm-up --nodes 3
DIR``, and resume from the copy a buddy node's transfer service kept of their checkpoints.

The site is ``local-slurm-nodes`` with blocks of one node, a worker each, so that the two members
run on two nodes; see ``tests/test_multinode.py`` for how the cluster is found and used.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import REPO
from slurm import node_local_tier, remove_node_scratch
from test_multinode import (
    SITE,
    _command,
    _crashing,
    _events,
    _planned,
    _slurm_node,
    _wait_for,
    cluster,
)

from resilient_flows.checkpoint import TierSpec
from resilient_flows.training import run_member

__all__ = ["cluster"]  # the fixture, shared with tests/test_multinode.py

#: ``x`` is crashed; ``y`` trains on meanwhile on another node, whose service keeps x's copies
#: (started with y, seconds after x: x runs long enough to send it a copy). y's steps outlast any
#: recovery of x's; the test stops it once x finished.
ONE_NODE_MEMBERS = """\
name: buddies
site: local-slurm-nodes
retries: 2
checkpoint: {interval: 4, tiers: [local, peer, shared]}
members:
  - {name: x, workload: "chaos:paced", steps: 60, seed: 3, params: {hidden: 32, pause_ms: 250}}
  - {name: y, workload: "chaos:paced", steps: 600, seed: 4, params: {hidden: 32, pause_ms: 250}}
"""


def _one_node_blocks(site: str) -> str:
    """The site with blocks of one node, one worker each, up to three blocks, two at the start."""
    for old, new in (
        ("nodes_per_block: &nodes 2", "nodes_per_block: &nodes 1"),
        ("max_blocks: 1", "max_blocks: 3"),
        ("init_blocks: 1", "init_blocks: 2"),
        ("max_workers_per_node: 2", "max_workers_per_node: 1"),
    ):
        assert old in site, old
        site = site.replace(old, new)
    return site


def _copy_record(run_dir: Path) -> dict | None:
    path = run_dir / "peer-services" / "copies" / "x.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _crash_x_once_copied(runner: subprocess.Popen, run_dir: Path, env: dict[str, str]) -> tuple[str, str, str, int]:
    """Crash x's node once a buddy holds a copy of x; the runner's output, the node, the copy's step."""
    with _crashing(runner, env) as down:

        def x_started() -> list[dict]:
            return [e for e in _events(run_dir) if e["kind"] == "started" and e["member"] == "x"]

        def x_finished() -> bool:
            return any(e["kind"] == "finished" and e["member"] == "x" for e in _events(run_dir))

        _wait_for("x to start", x_started, 240)
        lost = x_started()[0]["host"]
        _wait_for("a copy of x on another node", lambda: _copy_record(run_dir) is not None, 180)
        copy = _copy_record(run_dir)
        assert copy["host"] != lost
        _slurm_node("down", lost, env)
        down.append(lost)
        _wait_for("x to finish", x_finished, 300)
        runner.send_signal(signal.SIGINT)  # y only kept x's copy: it stops at a checkpoint, as on a Ctrl-C
        out, err = runner.communicate(timeout=120)
    return out, err, lost, copy["step"]


def _remove_node_scratch(run_dir: Path, cluster: dict[str, str]) -> None:
    """The run's node-local directories (checkpoints, peer copies), from every node."""
    if not (run_dir / "members" / "x" / "spec.json").exists():
        return
    remove_node_scratch(node_local_tier(_planned(run_dir, "x")), cluster)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(480)
def test_slurm_members_on_one_node_resume_a_lost_node_from_a_buddys_copy(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """Member x's node crashes once x's rank 0 had a checkpoint kept by another node's transfer
    service (every process of the node killed, its scratch deleted). x resumes on another node
    from that copy, fetched from the buddy and verified: 0 bytes from the shared tier, and the
    weights of an uninterrupted run, bit for bit."""
    env = {**cluster, "PYTHONPATH": os.pathsep.join([str(REPO / "benchmarks"), cluster["PYTHONPATH"]])}
    (tmp_path / "wf.yaml").write_text(ONE_NODE_MEMBERS)
    (tmp_path / "site.yaml").write_text(_one_node_blocks((REPO / "site-configs" / f"{SITE}.yaml").read_text()))
    run_dir = tmp_path / "run"
    command = _command(tmp_path / "wf.yaml", run_dir, "--site", str(tmp_path / "site.yaml"))
    runner = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err, lost, copied = _crash_x_once_copied(runner, run_dir, env)
    finally:
        _remove_node_scratch(run_dir, cluster)
    events = _events(run_dir)
    assert runner.returncode == 130, (out[-2000:], err[-3000:], events)
    finished = {e["member"] for e in events if e["kind"] == "finished"}
    assert finished == {"x"}, events
    second = [e for e in events if e["kind"] == "started" and e["member"] == "x"][-1]
    assert second["host"] != lost, second
    (resumed,) = [e for e in events if e["kind"] == "resumed" and e["member"] == "x"]
    assert resumed["step"] >= copied, (resumed, copied)  # the newest copy when the node crashed, or newer
    assert list(resumed["bytes_from"]) == [f"peer on {second['host']}"], resumed
    assert resumed["bytes_from"][f"peer on {second['host']}"] > 0
    spec = _planned(run_dir, "x")
    alone = replace(spec, checkpoint=replace(spec.checkpoint, tiers=(TierSpec("checkpoints"),)), faults=())
    reference = run_member(alone.to_dict(), str(tmp_path / "reference"))
    result = json.loads((run_dir / "members" / "x" / "result.json").read_text())
    assert result["digest"] == reference["digest"]
