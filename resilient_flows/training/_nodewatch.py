"""Launch a member's ranks across nodes and notice, within a second, that one of their nodes died.

``python -m resilient_flows.training._nodewatch NODES MEMBER_DIR RUN_DIR -- LAUNCH...`` runs the
launch (``srun ...``, PALS's ``mpiexec ...``) and exits with its status. When a node of the step
dies, the launcher learns it only once the batch system declares the node down (Slurm: after
``SlurmdTimeout``, tens of seconds), but the surviving ranks see their peer's connection reset at
once, or its node fall silent within seconds (:mod:`~._peerwatch`), and record a ``peer-lost``
fault (:mod:`resilient_flows.training._faults`). On that record, or on the launch failing, this
probes the block's nodes (:func:`~._lostnodes.dead_hosts`): the dead ones, and those a rank found
silent, are recorded for the block (:mod:`~._lostnodes`), the fault record says which nodes were
lost and how many the block has left, and the launch is killed without waiting for the batch
system, so the retry starts on a spare node within seconds. The retry handler reads that fault
record: a block with nodes enough left is kept, not retired (see
:func:`resilient_flows.apps.ResumingRetryHandler`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from resilient_flows.rundir import TaskLayout
from resilient_flows.rundir._block import current_block
from resilient_flows.training._faults import PEER_LOST
from resilient_flows.training._lostnodes import dead_hosts, job_hosts, probe_port, record_lost

#: Seconds between looks at the member's fault record while its ranks run.
POLL_S = 0.1
#: How much a rank's clock, on another node, may be behind this one's: a fault recorded that long
#: before this launch began is still its own (the retry handler removes the previous attempt's).
CLOCK_SLACK_S = 30.0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 5 or args[3] != "--":
        print(f"usage: python -m {__spec__.name} NODES MEMBER_DIR RUN_DIR -- LAUNCH...", file=sys.stderr)
        return 2
    needed, member, run_dir, command = int(args[0]), Path(args[1]), args[2], args[4:]
    started = time.time()
    launch = subprocess.Popen(command)  # in this process group: whoever ends the app's group ends it too
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda s, _f: _signal(launch, s))
    while launch.poll() is None:
        fault = _peer_lost_since(member, started)
        if fault is not None and _record_deaths(member, run_dir, needed, fault):
            _signal(launch, signal.SIGKILL)
            launch.wait()
            return 1
        time.sleep(POLL_S)
    status = launch.returncode
    if status not in (0, 75):
        _record_deaths(member, run_dir, needed, _peer_lost_since(member, started))
    return 1 if status < 0 else status


def _signal(launch: subprocess.Popen, signum: int) -> None:
    """``signum`` to the launch (srun forwards a stop signal to the ranks)."""
    with contextlib.suppress(ProcessLookupError):
        launch.send_signal(signum)


def _peer_lost_since(member: Path, started: float) -> dict[str, Any] | None:
    """The member's fault record, when a rank of this launch recorded a peer gone."""
    try:
        record = TaskLayout(member).read_fault()
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("kind") != PEER_LOST:
        return None
    when = record.get("time")
    return record if isinstance(when, int | float) and when >= started - CLOCK_SLACK_S else None


def _record_deaths(member: Path, run_dir: str, needed: int, fault: dict[str, Any] | None) -> bool:
    """Probe the block's nodes; record the dead ones (for the block, and in the member's fault
    record, with the nodes the block has left). Whether any node of the block is dead."""
    env = os.environ
    hosts = job_hosts(env)
    dead = dead_hosts(hosts, probe_port(env))
    dead += [h for h in silent_hosts(fault) if h in hosts and h not in dead]
    if not dead:
        return False
    lost = record_lost(run_dir, env, dead)
    layout = TaskLayout(member)
    record = dict(fault) if fault is not None else _fault_of_launch(layout, dead)
    left = len([h for h in hosts if h not in lost])
    record.update(lost_nodes=dead, nodes_left=left, nodes_needed=needed)
    layout.write_fault(record)
    print(f"nodewatch: node(s) {', '.join(dead)} of block {current_block()} lost; {left} left", file=sys.stderr)
    return True


def silent_hosts(fault: dict[str, Any] | None) -> list[str]:
    """The nodes a rank found silent (:mod:`resilient_flows.training._peerwatch`): lost, though a
    stopped node's kernel still accepts the probe's connection."""
    named = fault.get("silent_hosts") if isinstance(fault, dict) else None
    return [str(h) for h in named] if isinstance(named, list) else []


def _fault_of_launch(layout: TaskLayout, dead: list[str]) -> dict[str, Any]:
    """A ``peer-lost`` record for an attempt whose ranks recorded nothing (the launch failed as
    the node died, before any rank could see it)."""
    try:
        attempt = layout.read_attempts()
    except (OSError, ValueError):
        attempt = None
    return {
        "attempt": attempt,
        "kind": PEER_LOST,
        "rank": None,
        "host": dead[0],
        "block": current_block(),
        "reason": f"node(s) {', '.join(dead)} stopped answering",
        "time": round(time.time(), 3),
    }


if __name__ == "__main__":
    sys.exit(main())
