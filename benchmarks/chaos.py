"""Chaos harness: an ensemble of deterministic members under many faults at once, from outside.

A workflow of N members (default 128 of about 5 s each on a 2-core machine; ``--full``: 1,000 with
tiny steps) runs twice through the real ``resilient-flows`` command, on the ``local`` site
(``--slurm``: ``local-slurm``, a one-node Slurm cluster, started with ``.ci/slurm-up`` when none
answers and stopped afterwards; ``--slurm-nodes N``: ``local-slurm-nodes``, a cluster of N nodes
in network namespaces that ``.ci/slurm-up --nodes N`` starts for the run, blocks of two nodes,
node-local scratch per node): first without faults (the reference), then under a seeded chaos
schedule. Every member trains the same weights whatever happens to it, so the run passes only if
every member's final digest (``members/<name>/result.json``) equals the reference's. ``--quick``
runs 4 paced members (:func:`paced`: a short step, then a pause) under two bursts over 8 s, and
trains their reference weights in this process: it has no fault-free run to compare wall time
and runner CPU with.

The schedule (``--seed``) spreads bursts of faults over the first 60 % of the reference's
training time, counted from the chaos run's first checkpoint. A burst strikes several faults at
once, each from its own thread, from outside the processes as an operator or a failing machine
would. Targets are found by walking ``/proc`` and ``<run_dir>/heartbeats``, restricted to this
run (pools whose command line holds the run's ``parsl/`` directory, their spawned processes, our
runners' interchanges); a fault without a target waits for one for up to 90 s (as long as the run
lasts in ``--quick`` runs, whose members wait for every fault to strike):

``worker-kill``           SIGKILL of a worker that runs a member;
``pool-kill``             SIGKILL of a worker pool (``process_worker_pool.py``, the HTEX manager);
``manager-process-kill``  SIGKILL of a pool's multiprocessing manager process (its oldest spawned
                          child): the pool's main thread dies, its heartbeat thread lives on;
``interchange-kill``      SIGKILL of the runner's interchange;
``worker-stop``           SIGSTOP of a busy worker for the site's heartbeat threshold + 5 s, then
                          SIGCONT: a hung node;
``runner-kill``           SIGKILL of the runner (last in its burst), then ``resilient-flows resume``;
``pilot-cancel``          ``scancel`` of the run's newest running pilot job (``--slurm``, ``--slurm-nodes``);
``node-loss``             ``--nodes``: an emulated node's block killed and its node-local directories
                          deleted; ``--slurm-nodes``: the node of a busy pool crashes
                          (``.ci/slurm-node down``: every process in its namespace SIGKILLed, its
                          scratch deleted), Slurm marks it down and ends its block, Parsl starts
                          another on the nodes left, and the node boots again 45 s later;
``storage-full``          the shared tier full (ENOSPC) for 4 s: the chaos run's directory is a
                          tmpfs that a ballast file fills, then frees (root only; skipped with a
                          message otherwise);
``shard-flip``            a flipped byte in a running member's newest committed checkpoint shard
                          (every copy of it: node-local ones too), then SIGKILL of its worker, so
                          that the retry must detect the damage by checksum and restore an older
                          checkpoint;
``node-and-buddy-loss``   ``--slurm-nodes --peer``: both nodes of a running two-node member crash at
                          once, each with the copy it kept of the other's shards, after the member
                          committed a checkpoint to the shared tier; they boot again 45 s later
                          (a block needs two nodes: on three, none runs until then).

``--peer`` (with ``--slurm-nodes``): half the members span the two nodes of a block (``nodes: 2``,
their ranks started by ``srun``) and checkpoint to ``tiers: [local, peer, shared]``: each node
keeps a copy of the other's shards. A ``node-loss`` then crashes one node of a running two-node
member that committed two checkpoints in its attempt (either of its nodes: the worker pool's or
the other), so that its next attempt must read the lost node's shards from the survivor's peer
copy. The resumes after node losses are listed with the bytes they read per source (the
``resumed`` events' ``bytes_from``); figures: resumes after losing one node that read nothing from
the shared tier (target: all), resumes after losing a node and its buddy that read everything
from it (target: all). Their references are trained here on as many local processes as ranks.
The two kinds of member alternate in the workflow (a block runs two at once), and in a held run
each kind waits at its own gate, opened once the faults meant for it struck (node losses for the
two-node members, the other kinds, which find their targets among workers, for the rest).

``--walltime D`` (``--slurm``, ``--slurm-nodes``; whole minutes, at least ``1m``): the run's copy
of the site gives every block that walltime (the provider's and the ``walltime`` fact), so the
runner drains each block before its end: its members commit, exit 75 and continue on a fresh
block. Paced members (``--quick``) are slowed to outlast a block (1.2 walltimes of steps each),
and are not held at a gate (a member waiting there could not stop for a drain). Figures: blocks
drained and members stopped by a drain (target: at least one), starts declined near a drain,
retries spent on drained attempts (target 0), steps redone per drain (target: at most 3, a few
steps, not an interval), blocks that Slurm ended at their walltime (``TIMEOUT``, the run's jobs
watched every 3 s) and attempts killed by the walltime (targets 0). An attempt a drain stopped,
or that declined to start, is no loss. ``--kinds none`` runs it without other faults (``--kinds
K,K``: only those kinds, for any run).

Every run has a hard timeout: a run that hangs is killed and reported as a FAIL, never waited on.
Once it ended, what of the run still lives 10 s later is counted as left over and killed (pools,
their processes, interchanges, block scripts, Slurm jobs whose batch script is in the run's
directory), stopped processes are continued, and the tmpfs is unmounted.

Figures (printed; with ``--json PATH`` written with their units), checked against the targets of
issues 13 and 34 where they set one:

- members finished / N; digests equal to the reference / N (targets: N/N); runs killed at their
  timeout; faults injected by kind, and skipped for want of a target (target: 0);
- steps lost per attempt that a fault ended: steps that the attempt logged (``metrics.jsonl``)
  and a later attempt logged again. Each lost attempt is charged to the first fault before the
  first sign of its loss that struck it directly, else the latest that found it running; none is a FAIL
  (``attempts lost that no fault explains``). Targets: median <= one checkpoint interval, max
  <= two (a fault during a checkpoint, which cannot be told from outside), three after a flipped
  shard (the restore falls back one checkpoint). Attempts that lived through a full file system
  are reported apart: their checkpoints could not be written;
- recovery per fault kind, median and p95, with its split as ``goodput.py`` splits it
  (``recovery_split``), for each attempt a fault of the kind ended: detection (the fault ->
  ``failed``, ``lost``, or a new runner's ``submitted``), restart (-> the next attempt's
  ``started``), restore (-> ``resumed``: training again) and redone steps. The recovery is the
  fault -> training again (the steps redone after it are reported apart), less the part of the
  restart during which the member's retry waited for a worker while every worker of the site
  (``SiteFacts.workers``) ran another member's attempt (each counted until the fault that ended
  it, if one did: a struck worker trains nothing): an ensemble larger than its workers queues a
  retry as it queues a member that never started, and a held run's members (``--quick``) keep
  their workers at the gate. That queue is shown beside it, not counted; the seconds with a
  worker free, or gone with the fault, are. The recovery also ends at training again, not at
  the first step, which a member resuming past its hold step takes only once the gate opens; and
  where another fault ended the next attempt before it trained, it ends at that fault, whose own
  recovery the rest is (an outage is never counted twice). A later fault that takes more of
  what a waiting member needs (a pool, then the interchange, then the runner: ``SHARED_FAULTS``)
  takes over the rest of that member's wait in the same way: its recovery lists it as a member
  found waiting, with nothing to detect (the earlier fault's detection, if it came only after,
  is not counted). Targets (issue 34): recovery p95 <= 10 s and
  detection p95 <= 5 s, for every kind; detection counts from when the attempt fell silent where
  that came after the fault (the ``lost`` event's ``silent_s``: a pool whose manager process
  died runs its tasks on, beating, until they need it). A fault that ended no attempt by itself
  (each attempt it struck was charged to an earlier fault) reports instead, without a target,
  the time until a member started after it (a hung pool takes no work), or for a full file
  system waited out, until the first step after it;
- retries spent (``cost`` of the ``failed`` events), members that ran out of retries (target 0),
  ``lost`` events of the runner's watchdog, members trained again after they had finished;
- runner CPU-seconds (``/proc/<pid>/stat`` of every runner process, summed over resumes, read
  exactly once each exits) in all, per member and as a share of the members' CPU (the workers'),
  and peak runner RSS (``VmHWM``), for both runs. Target (default and ``--full``, fault-free run):
  runner CPU <= 1 % of the members';
- wall time against the reference; the size of Parsl's logs in the run directory; torn lines
  (that do not parse as JSON) in ``events.jsonl`` and every ``metrics.jsonl`` and leftovers of
  every kind (targets: 0).

``--agent`` runs the preemption agent's faults instead (seconds; the agent of ``resilient-flows
cosched agent`` against the tests' fake PBS Pro commands and served ``squeue --json`` output):
the agent SIGKILLed between requeueing its victim held and releasing it, then restarted (target:
the victim released within 2 polls); jobs whose heartbeats are a FIFO and a 1 GiB file (target:
the poll's heartbeat reads within the deadline, neither believed, a sound one beside them
believed); markers forged in comments (in a path, glued to another word) and in a PBS job's
environment (target: none taken for a request, none shielding a running job).

``python benchmarks/chaos.py [--quick | --full | --agent] [--slurm | --nodes | --slurm-nodes N [--peer]]
[--walltime D] [--kinds K,K | none] [--seed N] [--json PATH] [--dir DIR] [--keep] [--timeout S]``;
``--quick`` takes about a minute (``--slurm-nodes 3 --peer``: about four, ``--walltime 2m``: about
eight), the default about 15. The tests (``tests/test_chaos.py``) drive the same functions with a
small paced ensemble (:func:`paced`) and a reference trained in their own process, and check the
analysis of node-loss restores and drains on made-up events.
"""

from __future__ import annotations

import sys
from pathlib import Path

# chaoslib and the modules it shares (harness, recovery_split, clusterenv), also when the tests
# load this file by its path, and in the workers that import ``chaos:paced``
sys.path.append(str(Path(__file__).resolve().parent))
from chaoslib import cli
from chaoslib.agent import agent_chaos
from chaoslib.config import (
    MODES,
    NODES_KINDS,
    PEER_CHECKPOINTS,
    REPO,
    SLURM_KINDS,
    Config,
    SiteFacts,
    walltime_site,
    workflow_yaml,
)
from chaoslib.drains import drains
from chaoslib.execution import Execution, execute, run_chaos
from chaoslib.faults import Chaos
from chaoslib.figures import figures, notes, recovery_figures
from chaoslib.losses import losses
from chaoslib.members import fault_free_digests, paced
from chaoslib.procs import Watcher, read_proc, send
from chaoslib.report import print_report, write_json
from chaoslib.resumes import node_loss_resumes
from chaoslib.rundata import RunData
from chaoslib.runner import Runner
from chaoslib.schedule import Fault
from chaoslib.slurm import slurm_job_of, slurm_nodes_cluster
from chaoslib.targets import EventTail, running_members

#: What the tests, ``goodput.py`` and the workers (``chaos:paced``) take from ``chaos``.
__all__ = [
    "MODES",
    "NODES_KINDS",
    "PEER_CHECKPOINTS",
    "REPO",
    "SLURM_KINDS",
    "Chaos",
    "Config",
    "EventTail",
    "Execution",
    "Fault",
    "RunData",
    "Runner",
    "SiteFacts",
    "Watcher",
    "agent_chaos",
    "drains",
    "execute",
    "fault_free_digests",
    "figures",
    "losses",
    "node_loss_resumes",
    "notes",
    "paced",
    "print_report",
    "read_proc",
    "recovery_figures",
    "run_chaos",
    "running_members",
    "send",
    "slurm_job_of",
    "slurm_nodes_cluster",
    "walltime_site",
    "workflow_yaml",
    "write_json",
]


def main(argv: list[str] | None = None) -> int:
    return cli.main(__doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
