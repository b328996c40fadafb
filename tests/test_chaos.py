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

import os
import sys
from collections import Counter
from pathlib import Path

import pytest
from benchmark_modules import load_benchmark
from requires import unmet_in_part
from rich.console import Console
from slurm import require_slurm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]


chaos = load_benchmark("chaos")

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

    assert not run.timed_out, f"the run hung; runner log:\n{log}\nthe run at its timeout:\n{run.hang}"
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


@pytest.mark.timeout(10)
def test_an_attempt_that_started_in_a_cancelled_pilot_job_is_charged_to_its_cancel() -> None:
    """A pilot job cancelled just as its pool forked a worker for another member (the worker was
    not there when the fault looked): that member's attempt dies with the job, and is found silent
    10 s later. The cancel ended it, not an unexplained loss. Another block that reused the block
    number in a later job is not doomed by it."""
    cancel = chaos.Fault("pilot-cancel", 0, time=100.0, hit={"a": 1}, running={"a": 1}, doomed=frozenset({11}), job=7)
    events = [
        {"time": 80.0, "kind": "block_started", "member": None, "block": "0", "job_id": "7", "start": 79.0},
        {**started("a", 1, 90.0, 11), "block": "0"},
        {**started("b", 1, 100.1, 12), "block": "0"},  # the forked worker took b as the job was cancelled
        {"time": 103.0, "kind": "failed", "member": "a", "cause": "lost after progress"},
        {"time": 110.2, "kind": "lost", "member": "b", "attempt": 1, "silent_s": 10.1},
        {"time": 110.3, "kind": "failed", "member": "b", "cause": "lost without progress"},
        {"time": 111.0, "kind": "block_started", "member": None, "block": "0", "job_id": "8", "start": 110.9},
        {**started("a", 2, 112.0, 21), "block": "0"},
        {**started("b", 2, 112.0, 22), "block": "0"},
        {**started("c", 1, 150.0, 23), "block": "0"},
        {"time": 155.0, "kind": "failed", "member": "c", "cause": "lost without progress"},
        {**started("c", 2, 160.0, 24), "block": "0"},
    ]
    data = chaos.RunData(["a", "b", "c"], {}, events, 0, {}, 0, 0.0)
    found = {(loss.member, loss.attempt): loss.fault for loss in chaos.losses(data, [cancel])}
    assert {key: fault and fault.kind for key, fault in found.items()} == {
        ("a", 1): "pilot-cancel",
        ("b", 1): "pilot-cancel",
        ("c", 1): None,  # in job 8: nothing of the cancel's
    }


@pytest.mark.timeout(10)
def test_a_recovery_counts_no_wait_for_a_worker_that_other_members_held() -> None:
    """Two workers, three members. a's worker is killed at 110; the replaced worker takes c, which
    never started, and a waits until b finishes at 130: of its restart, the 0.5 s before c started
    and the 0.2 s after b finished count, the 19 s that b and c held both workers do not. When the
    pool is killed with both workers, nothing else holds them: the whole wait counts."""
    kill = chaos.Fault("worker-kill", 0, time=110.0, hit={"a": 1}, running={"a": 1, "b": 1}, doomed=frozenset({11}))
    pool = chaos.Fault("pool-kill", 1, time=200.0, hit={"a": 2, "c": 1}, running={"a": 2, "c": 1})
    events = [
        started("a", 1, 100.0, 11),
        started("b", 1, 100.0, 12),
        {"time": 110.5, "kind": "failed", "member": "a", "attempt": 1, "cost": 0.0},
        started("c", 1, 111.0, 13),
        {"time": 130.0, "kind": "finished", "member": "b", "attempt": 1},
        started("a", 2, 130.2, 12),
        {"time": 130.4, "kind": "resumed", "member": "a", "attempt": 2, "step": 10},
        {"time": 200.5, "kind": "failed", "member": "a", "attempt": 2, "cost": 0.0},
        {"time": 200.6, "kind": "failed", "member": "c", "attempt": 1, "cost": 0.0},
        started("a", 3, 209.0, 21),
        started("c", 2, 209.0, 22),
        {"time": 209.5, "kind": "resumed", "member": "a", "attempt": 3, "step": 40},
        {"time": 209.6, "kind": "resumed", "member": "c", "attempt": 2, "step": 60},
    ]
    data = chaos.RunData(["a", "b", "c"], {}, events, 0, {}, 0, 0.0)
    found = {(loss.member, loss.attempt): loss for loss in chaos.losses(data, [kill, pool], slots=2)}
    first = found[("a", 1)]
    assert (first.fault.kind, first.detected_by) == ("worker-kill", "failed")
    assert first.split.restart_s == pytest.approx(19.7) and first.split.queued_s == pytest.approx(19.0)
    assert first.recovery_s == pytest.approx(0.5 + 0.7 + 0.2)  # detection, restart less the queue, restore
    assert {key: (loss.fault.kind, loss.split.queued_s) for key, loss in found.items() if key != ("a", 1)} == {
        ("a", 2): ("pool-kill", 0.0),
        ("c", 1): ("pool-kill", 0.0),
    }
    assert found[("a", 2)].recovery_s == pytest.approx(9.5)
    assert chaos.losses(data, [kill, pool])[0].recovery_s == pytest.approx(20.4)  # no workers known: all counts


@pytest.mark.timeout(10)
def test_a_recovery_ends_where_another_fault_ended_the_next_attempt_before_it_trained() -> None:
    """Killed at 100, a starts again at 101 and is struck by a pool kill at 101.5 before it
    restored anything: the kill's recovery is 1.5 s, the pool kill's runs on to 105.3."""
    kill = chaos.Fault("worker-kill", 0, time=100.0, hit={"a": 1}, running={"a": 1}, doomed=frozenset({11}))
    pool = chaos.Fault("pool-kill", 1, time=101.5, hit={"a": 2}, running={"a": 2})
    events = [
        started("a", 1, 90.0, 11),
        {"time": 100.2, "kind": "failed", "member": "a", "attempt": 1, "cost": 0.0},
        started("a", 2, 101.0, 12),
        {"time": 102.0, "kind": "failed", "member": "a", "attempt": 2, "cost": 0.0},
        started("a", 3, 105.0, 13),
        {"time": 105.3, "kind": "resumed", "member": "a", "attempt": 3, "step": 30},
    ]
    data = chaos.RunData(["a"], {}, events, 0, {}, 0, 0.0)
    first, second = chaos.losses(data, [kill, pool], slots=2)
    assert (first.fault.kind, first.split.cut, first.recovery_s) == ("worker-kill", True, pytest.approx(1.5))
    assert (second.fault.kind, second.split.cut, second.recovery_s) == ("pool-kill", False, pytest.approx(3.8))


@pytest.mark.timeout(10)
def test_a_fault_that_finds_a_member_waiting_to_restart_takes_over_the_rest_of_its_wait() -> None:
    """A pool kill ends a's attempt at 100; while a waits, the runner is killed (the next burst):
    the pool kill's recovery ends there (5 s), the runner kill's runs to training again (10.5 s),
    with nothing to detect; the steps lost and the attempts ended count a's attempt once."""
    pool = chaos.Fault("pool-kill", 0, time=100.0, hit={"a": 1}, running={"a": 1})
    runner = chaos.Fault("runner-kill", 1, time=105.0, hit={}, running={})
    events = [
        started("a", 1, 90.0, 11),
        {"time": 100.5, "kind": "failed", "member": "a", "attempt": 1, "cost": 0.0},
        {"time": 111.0, "kind": "submitted", "member": "a"},
        started("a", 2, 115.0, 12),
        {"time": 115.5, "kind": "resumed", "member": "a", "attempt": 2, "step": 30},
        {"time": 120.0, "kind": "finished", "member": "a", "attempt": 2},
    ]
    data = chaos.RunData(["a"], {"a": "d"}, events, 0, {}, 0, 0.0)
    first, then = chaos.losses(data, [pool, runner], slots=2)
    assert (first.fault.kind, first.waiting, first.split.cut, first.recovery_s) == ("pool-kill", False, True, 5.0)
    assert (then.fault.kind, then.waiting, then.detect_s, then.recovery_s) == ("runner-kill", True, None, 10.5)
    facts = chaos.SiteFacts("local", 10.0, 1.0, 2)
    run = chaos.Execution(data, 30.0, 1.0, 100.0, 2, [], 10.0, False, 0, Counter(), [], Path("log"))
    found = {f.key: f for f in chaos.figures(SMALL, facts, run, [pool, runner], {"a": "d"}, None)}
    assert found["attempts_lost"].value == 1
    assert (found["recoveries_runner-kill"].value, found["recovery_runner-kill_p95"].value) == (0, 10.5)
    assert (found["detection_runner-kill_p95"].value, found["detection_runner-kill_p95"].ok) == (None, None)
    assert (found["recovery_pool-kill_p95"].ok, found["detection_pool-kill_p95"].ok) == (True, True)


@pytest.mark.timeout(10)
def test_a_later_fault_takes_over_a_wait_only_when_it_takes_more() -> None:
    """A worker stopped at 100 and the runner killed 0.1 s later: the pool's report of the stop
    had no runner to go to, so the stop's recovery ends at the kill and its detection (the new
    runner's) is not counted; the pool killed at 103, which takes less than the runner, adds to
    the runner kill's wait."""
    stop = chaos.Fault("worker-stop", 1, time=100.0, hit={"a": 1}, running={"a": 1}, doomed=frozenset({11}))
    runner = chaos.Fault("runner-kill", 1, time=100.1, hit={"a": 1}, running={"a": 1})
    pool = chaos.Fault("pool-kill", 1, time=103.0, hit={}, running={})
    events = [
        started("a", 1, 90.0, 11),
        {"time": 106.0, "kind": "submitted", "member": "a"},
        started("a", 2, 112.0, 12),
        {"time": 112.5, "kind": "resumed", "member": "a", "attempt": 2, "step": 30},
    ]
    data = chaos.RunData(["a"], {}, events, 0, {}, 0, 0.0)
    found = [
        (loss.fault.kind, loss.waiting, loss.detect_s, loss.recovery_s)
        for loss in chaos.losses(data, [stop, runner, pool], 2)
    ]
    assert found == [("worker-stop", False, None, pytest.approx(0.1)), ("runner-kill", True, None, pytest.approx(12.4))]


@pytest.mark.timeout(10)
def test_the_targets_are_ten_seconds_of_recovery_and_five_of_detection_for_every_kind() -> None:
    kill = chaos.Fault("worker-kill", 0, time=100.0, hit={"a": 1}, running={"a": 1}, doomed=frozenset({11}))
    events = [
        started("a", 1, 90.0, 11),
        {"time": 105.5, "kind": "failed", "member": "a", "attempt": 1, "cost": 0.0},
        started("a", 2, 106.0, 12),
        {"time": 106.5, "kind": "resumed", "member": "a", "attempt": 2, "step": 30},
    ]
    data = chaos.RunData(["a"], {}, events, 0, {}, 0, 0.0)
    (loss,) = chaos.losses(data, [kill], slots=2)
    found = {f.key: (f.value, f.target, f.ok) for f in chaos.recovery_figures("worker-kill", [loss])}
    assert found["recovery_worker-kill_p95"] == (pytest.approx(6.5), "<= 10", True)
    assert found["detection_worker-kill_p95"] == (pytest.approx(5.5), "<= 5", False)
    assert found["queued_worker-kill_median"] == (0.0, "", None)


@pytest.mark.timeout(10)
def test_restores_after_node_losses_are_judged_by_where_their_bytes_came_from() -> None:
    """A two-node member that lost one node must read nothing from the shared tier; one that lost a
    node and its buddy must read everything from it. A member that lost no node is not listed."""
    lose_one = chaos.Fault("node-loss", 0, time=150.0, hit={"p": 1}, running={"p": 1, "m": 1}, nodes=("n1",))
    lose_two = chaos.Fault("node-and-buddy-loss", 1, time=350.0, hit={"q": 1, "r": 1}, nodes=("n2", "n3"))
    two = {"hosts": ["n1", "n2"]}
    events = [
        {**started("p", 1, 100.0, 11), **two},
        started("m", 1, 100.0, 12),
        {"time": 160.0, "kind": "failed", "member": "p", "cause": "lost after progress"},
        {"time": 160.0, "kind": "failed", "member": "m", "cause": "lost after progress"},
        {**started("p", 2, 170.0, 13), "hosts": ["n2", "n3"]},
        started("m", 2, 170.0, 14),
        {
            "time": 171.0,
            "kind": "resumed",
            "member": "p",
            "attempt": 2,
            "step": 59,
            "bytes_from": {"local on n2": 100, "peer on n2": 100},
        },
        {**started("q", 1, 300.0, 21), **two},
        {**started("r", 1, 300.0, 22), **two},
        {"time": 360.0, "kind": "failed", "member": "q", "cause": "lost after progress"},
        {"time": 360.0, "kind": "failed", "member": "r", "cause": "lost after progress"},
        {**started("q", 2, 400.0, 23), **two},  # ended by another fault before it restored
        {**started("r", 2, 400.0, 24), **two},
        {"time": 402.0, "kind": "failed", "member": "q", "cause": "lost without progress"},
        {**started("q", 3, 410.0, 25), **two},
        {"time": 411.0, "kind": "resumed", "member": "q", "attempt": 3, "step": 29, "bytes_from": {"shared": 200}},
        {
            "time": 401.0,
            "kind": "resumed",
            "member": "r",
            "attempt": 2,
            "step": 59,
            "bytes_from": {"shared": 100, "peer on n1": 100},
        },
    ]
    data = chaos.RunData(["p", "q", "r", "m"], {}, events, 0, {}, 0, 0.0, {"p", "q", "r"})
    resumes = {r.member: r for r in chaos.node_loss_resumes(data, [lose_one, lose_two], data.spanning)}
    assert {name: (r.kind, r.attempt, r.as_expected) for name, r in resumes.items()} == {
        "p": ("node-loss", 2, True),
        "q": ("node-and-buddy-loss", 3, True),
        "r": ("node-and-buddy-loss", 2, False),  # a copy of a lost node's shard cannot be on n1
    }
    assert resumes["p"].lost == ("n1",) and resumes["p"].sources == {"local", "peer"}


@pytest.mark.timeout(10)
def test_an_attempt_a_drain_stopped_is_no_loss_and_one_killed_on_a_drained_block_is_counted() -> None:
    """Member a stops when the runner drains its block (committed, exit 75, free) and redoes one
    step on the next block; member b, on the same block, is killed when it is cancelled: a loss
    that no fault explains, and an attempt killed by the walltime."""
    walltime = "block 0 ends in 20 s (walltime)"
    events = [
        {"time": 95.0, "kind": "block_started", "member": None, "block": "0", "job_id": "7", "start": 90.0},
        {**started("a", 1, 100.0, 11), "block": "0"},
        {**started("b", 1, 100.0, 12), "block": "0"},
        {"time": 150.0, "kind": "preempted", "member": "a", "attempt": 1, "step": 10, "reason": walltime},
        {"time": 151.0, "kind": "failed", "member": "a", "cause": "preempted", "cost": 0.0},
        {"time": 157.0, "kind": "drained", "member": None, "block": "0", "job_id": "7"},
        {"time": 158.0, "kind": "failed", "member": "b", "cause": "lost after progress", "cost": 0.0},
        {"time": 166.0, "kind": "block_started", "member": None, "block": "0", "job_id": "8", "start": 165.0},
        {**started("a", 2, 170.0, 13), "block": "0"},
        {**started("b", 2, 170.0, 14), "block": "0"},
    ]
    metrics = {
        "a": [(s, 1, 100.0 + s) for s in range(11)] + [(s, 2, 170.0 + s) for s in range(10, 20)],
        "b": [(s, 1, 100.0 + s) for s in range(11)] + [(s, 2, 170.0 + s) for s in range(5, 20)],
    }
    data = chaos.RunData(["a", "b"], {}, events, 0, metrics, 0, 0.0)
    assert [(loss.member, loss.attempt, loss.fault) for loss in chaos.losses(data, [])] == [("b", 1, None)]
    drained = chaos.drains(data, [], {7: "CANCELLED", 8: "COMPLETED"})
    assert (drained.blocks_drained, drained.stops, drained.retries, drained.redone) == (1, 1, 0.0, [1])
    assert (drained.timeouts, drained.killed) == (0, ["b attempt 1 (job 7)"])


@pytest.mark.timeout(10)
def test_the_walltime_copy_of_a_site_sets_the_providers_limit_and_the_fact(tmp_path: Path) -> None:
    for site in ("local-slurm", "local-slurm-nodes"):
        text = chaos.walltime_site(site, 120, tmp_path).read_text()
        assert '      walltime: "00:02:00"' in text and "\n  walltime: 2m\n" in text, site


def test_an_ensemble_survives_every_kind_of_fault_on_emulated_nodes(tmp_path: Path) -> None:
    survive_chaos(tmp_path, "local-nodes", chaos.NODES_KINDS)


@pytest.mark.slurm
def test_an_ensemble_survives_every_kind_of_fault_on_a_slurm_cluster(tmp_path: Path) -> None:
    require_slurm()
    survive_chaos(tmp_path, "local-slurm", chaos.SLURM_KINDS)
