"""The chaos harness (``benchmarks/chaos.py``) at its ``--quick`` size: every kind of fault at
least once, several at a time, from outside the processes, and nothing lost.

Four paced members (``chaos:paced``: the ``mlp-digits`` step, then a pause) live long enough for
two bursts of faults while leaving the two cores mostly idle; their fault-free digests are
trained in this process without the pause, in seconds. Each run must end with every member
finished with the reference's weights, no torn line in ``events.jsonl`` or ``metrics.jsonl``, no
attempt lost that no fault explains, and no pool, interchange or Slurm job of the run left
behind. One run is on three emulated nodes (``local-nodes``: a node lost with its node-local
checkpoints is among the faults), one on the one-node Slurm cluster (a pilot job cancelled).
Timings are the harness's business (``python benchmarks/chaos.py``): on a loaded CI machine they
are not something to assert.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
from requires import unmet_in_part
from rich.console import Console
from slurm import require_slurm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

REPO = Path(__file__).resolve().parents[1]


def _load_harness() -> ModuleType:
    """``benchmarks/chaos.py`` as the module ``chaos``: workers import its workload by that name."""
    spec = importlib.util.spec_from_file_location("chaos", REPO / "benchmarks" / "chaos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos"] = module
    spec.loader.exec_module(module)
    return module


chaos = _load_harness()

SMALL = chaos.MODES["quick"]


def survive_chaos(tmp_path: Path, site: str, kinds: tuple[str, ...]) -> None:
    if os.geteuid() != 0:  # storage-full mounts a tmpfs: the harness leaves it out, saying so
        unmet_in_part("not root: the chaos run cannot mount a tmpfs and leaves out the storage-full fault")
        kinds = tuple(k for k in kinds if k != "storage-full")
    workflow = tmp_path / "reference.yaml"
    workflow.write_text(chaos.workflow_yaml(SMALL, site))
    reference = chaos.fault_free_digests(workflow, tmp_path / "reference")
    console = Console(file=sys.stdout, width=150, highlight=False)
    run, faults = chaos.run_chaos(
        SMALL,
        tmp_path / "chaos",
        site,
        span_s=SMALL.span_s,
        seed=1,
        shared_mib=256,
        timeout_s=360,  # a hang's bound, not a speed target: faults wait for their targets
        console=console,
        keep=True,
    )
    found = {f.key: f for f in chaos.figures(SMALL, chaos.SiteFacts.of(site), run, faults, reference, None)}
    # The report, printed (shown when the test fails) and written beside the run's copy in chaos/chaos-run.
    chaos.print_report(console, f"chaos on {site}", list(found.values()), faults, chaos.notes(run, faults))
    chaos.write_json(tmp_path / "chaos.json", {"site": site}, list(found.values()), faults, chaos.notes(run, faults))
    log = run.log.read_text()[-6000:]

    assert not run.timed_out, f"the run hung; runner log:\n{log}"
    assert run.returncode == 0 and not run.runner_exits, log
    assert found["members_finished"].value == SMALL.members, log
    assert found["digests_equal"].value == SMALL.members
    assert {f.kind for f in faults if f.skipped is None} == set(kinds), [(f.kind, f.skipped) for f in faults]
    assert found["torn_events"].value == 0 and found["torn_metrics"].value == 0
    assert found["attempts_unexplained"].value == 0
    assert found["members_out_of_retries"].value == 0
    assert found["flips_detected"].ok, "a damaged checkpoint was restored"
    assert sum(run.leftovers.values()) == 0, run.leftover_details


def started(name: str, attempt: int, time: float, pid: int) -> dict:
    return {"time": time, "kind": "started", "member": name, "attempt": attempt, "pid": pid}


@pytest.mark.timeout(10)
def test_every_attempt_a_fault_ended_is_charged_to_it_even_one_started_after_it() -> None:
    """A worker stopped (a hang): its member is found silent and its block cancelled, which stops
    another member that had started on that block after the stop; a pool killed after it had
    taken a task that then started; a block cancelled because none of its tasks beat. None of the
    losses is left unexplained."""
    stop = chaos.Fault("worker-stop", 0, time=100.0, hit={"a": 1}, running={"a": 1}, doomed=frozenset({11}))
    kill = chaos.Fault("pool-kill", 0, time=200.0, hit={"c": 1}, running={"c": 1}, doomed=frozenset({21, 22}))
    events = [
        started("a", 1, 90.0, 11),
        started("b", 1, 105.0, 12),
        {"time": 112.5, "kind": "lost", "member": "a", "attempt": 1, "silent_s": 13.0},
        {"time": 113.0, "kind": "failed", "member": "b", "cause": "preempted"},
        {"time": 113.1, "kind": "failed", "member": "a", "cause": "lost after progress"},
        started("a", 2, 120.0, 13),
        started("b", 2, 121.0, 14),
        started("c", 1, 190.0, 21),
        started("d", 1, 200.5, 22),  # the killed pool's other worker took a task just before it died
        {"time": 203.0, "kind": "failed", "member": "c", "cause": "lost after progress"},
        {"time": 203.1, "kind": "failed", "member": "d", "cause": "lost without progress"},
        started("c", 2, 210.0, 31),
        started("d", 2, 211.0, 32),
        started("e", 1, 299.5, 41),  # on a block whose tasks never beat: cancelled whole
        {"time": 300.0, "kind": "lost", "member": None, "block": "3"},
        {"time": 300.4, "kind": "failed", "member": "e", "cause": "preempted"},
        started("e", 2, 305.0, 42),
    ]
    data = chaos.RunData(["a", "b", "c", "d", "e"], {}, events, 0, {}, 0, 0.0)
    found = {(loss.member, loss.attempt): loss for loss in chaos.losses(data, [stop, kill])}
    assert {key: loss.fault.kind for key, loss in found.items()} == {
        ("a", 1): "worker-stop",
        ("b", 1): "worker-stop",
        ("c", 1): "pool-kill",
        ("d", 1): "pool-kill",
        ("e", 1): "worker-stop",
    }
    assert found[("a", 1)].detect_s == 12.5  # from the fault: it fell silent when it struck
    assert found[("d", 1)].detect_s == pytest.approx(3.1)  # from the kill, not from its start


@pytest.mark.alone
def test_an_ensemble_survives_every_kind_of_fault_on_emulated_nodes(tmp_path: Path) -> None:
    survive_chaos(tmp_path, "local-nodes", chaos.NODES_KINDS)


@pytest.mark.alone
@pytest.mark.slurm
def test_an_ensemble_survives_every_kind_of_fault_on_a_slurm_cluster(tmp_path: Path) -> None:
    require_slurm()
    survive_chaos(tmp_path, "local-slurm", chaos.SLURM_KINDS)
