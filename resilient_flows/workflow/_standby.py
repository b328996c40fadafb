"""Standby blocks: a lost worker pool's tasks go at once to a pool that is already started and preloaded.

A block whose pool dies (the pool or its multiprocessing manager killed, the watchdog retiring it)
is replaced by Parsl with a new block: on this machine the pool's start and its fork server's
imports of torch and the workloads take seconds, tens of them on busy cores, while the lost
members wait. An executor with ``standby_pool: true`` (warm workers on a ``LocalProvider``) keeps
one more block than it runs: its pool imports everything, then waits, unknown to the
interchange and costing no CPU, for its go file (:mod:`resilient_flows.sites._warmpool`). Each
look of the runner:

- activates the oldest waiting blocks while fewer blocks run than the provider's ``max_blocks``
  (the first block of a run too, within a look of its start): the pool joins the interchange and
  forks its workers from a server that has long finished importing, in well under a second;
- starts a new standby block once none waits, a block runs and tasks are outstanding, and the run
  is under way: its first block has run for the site's ``standby_after`` (30 s unless it says),
  or a block was lost. A run that ends sooner never pays for a standby (a pool's start and
  imports: several seconds of CPU), and one whose pool is lost sooner waits for a block started
  cold, as it would without a standby, seconds on this machine. After a loss it starts at once,
  because faults come in bursts (a pool lost seconds after the last one should find its
  replacement preloaded). Its imports run at the lowest CPU priority
  (:mod:`resilient_flows.sites._warmpool`): they take no core from the running blocks or from
  the restores of the members that a lost block's replacement took over;
- holds the provider's ``max_blocks`` at the running count plus the waiting ones, so that Parsl's
  strategy, which counts a waiting block as a block, starts a block only for a running one that
  is missing. Should the strategy and the runner start one at the same moment, the extra block
  waits too, idle, until it is needed.

A runner killed while members waited to restart (a resume finds no live attempt to adopt) leaves
its standby pool waiting too: the runner that resumes the run takes it over in the same way
(:func:`left_waiting`) instead of cancelling it with the rest and starting its first block cold;
its go file then also carries the new runner's token, which the pool's workers take on (tasks
check it: :func:`~resilient_flows.rundir.superseded`).

A lost block is retired as before (:func:`~resilient_flows.workflow._blocks.retire_block`);
its Parsl status turns terminal, and the next look activates the standby.

A lost interchange takes its Parsl instance with it: the runner starts a new one, whose blocks
would all start cold. A waiting pool has not met the interchange yet, so it can serve the new one:
:meth:`Standby.keep` takes it out of the lost instance before that is shut down (which would
cancel it), and :meth:`Standby.adopt` makes it the first block of the new instance's executor
of the same label, in place of the one its strategy would start cold; its go file then carries
the new executor's launch command, whose arguments (ports, certificates, block id, log
directory) the pool runs with. Moving a block between Parsl instances relies on Parsl's
internals: :mod:`resilient_flows.sites._parsl` does it (:func:`~resilient_flows.sites._parsl.take_block`,
:func:`~resilient_flows.sites._parsl.add_block`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from parsl.executors.status_handling import BlockProviderExecutor
from parsl.providers import LocalProvider

from resilient_flows.rundir import process_start_time
from resilient_flows.sites._parsl import (
    add_block,
    block_launch_command,
    foreign_job,
    go_file,
    is_standby,
    set_job_record,
    take_block,
    tell_go,
)

logger = logging.getLogger(__name__)

#: How many blocks of an executor wait as standbys.
STANDBY_BLOCKS = 1


@dataclass(frozen=True)
class Kept:
    """A waiting block taken out of a Parsl instance that is shut down: its executor's label, its
    block id and go file there, its provider's record of the job, and the runner token its
    processes carry where that is not the adopting runner's."""

    label: str
    block: str
    go: str
    job_id: str
    resource: dict[str, Any]
    token: str | None = None


class Standby:
    """Call :meth:`update` from the runner's loop, one instance per Parsl instance (block ids and
    go files are those of its executors). ``environ`` goes to the pools adopted from elsewhere.
    ``after_s``: how long an executor's first running block runs before its first standby starts
    (the site's ``standby_after``; 0 for an instance that replaces a lost one: a burst)."""

    def __init__(self, environ: Mapping[str, str] | None = None, after_s: float = 0.0) -> None:
        self._environ = dict(environ or {})
        self._after_s = after_s
        self._since: dict[str, float] = {}  # executor -> when its first block was told to go
        self._running: dict[str, set[str]] = {}  # executor -> the blocks told to go
        self._target: dict[str, int] = {}  # executor -> the blocks it runs (the site's max_blocks)
        self._adopted: dict[tuple[str, str], str] = {}  # (executor, block) -> the go file of a kept pool

    def keep(self, executors: Iterable[Any]) -> list[Kept]:
        """Take one waiting block of each standby executor out of its (lost) Parsl instance, so that
        its shutdown spares it; each kept block must be adopted or cancelled (:func:`cancel_kept`)."""
        kept = []
        for executor in _standbys(executors):
            told = self._running.get(executor.label, set())
            waiting = sorted(
                (b for b, s in executor.status_facade.items() if not s.terminal and b not in told), key=_block_order
            )
            taken = take_block(executor, waiting[0]) if waiting else None
            if taken is None:
                continue
            block, (job_id, resource) = waiting[0], taken
            go = self._adopted.get((executor.label, block)) or go_file(executor.worker_logdir, block)
            kept.append(Kept(executor.label, block, go, job_id, resource, resource.get("token")))
        return kept

    def adopt(self, executors: Iterable[Any], kept: Iterable[Kept]) -> list[Kept]:
        """Make each kept block the first block of the started executor of its label (before
        anything is submitted to it); those no executor took."""
        left = []
        by_label = {e.label: e for e in _standbys(executors)}
        for old in kept:
            executor = by_label.pop(old.label, None)
            if executor is None:
                left.append(old)
                continue
            # what the block ledger records of it: the go file it waits for, the token it carries
            block = add_block(executor, old.job_id, {**old.resource, "go": old.go, "token": old.token})
            self._adopted[(executor.label, block)] = old.go
            logger.info(
                "block %s of %s is the waiting pool of the lost instance's block %s", block, old.label, old.block
            )
        return left

    def update(self, executors: Iterable[Any]) -> list[tuple[str, str]]:
        """Activate and start standby blocks as the module says; the (executor, block) pairs activated."""
        activated = []
        for executor in _standbys(executors):
            activated.extend((executor.label, block) for block in self._update_one(executor))
        return activated

    def _update_one(self, executor: Any) -> list[str]:
        label, provider = executor.label, executor.provider
        target = self._target.setdefault(label, max(1, int(provider.max_blocks)))
        told = self._running.setdefault(label, set())
        alive = sorted((b for b, s in executor.status_facade.items() if not s.terminal), key=_block_order)
        running = [b for b in alive if b in told]
        waiting = [b for b in alive if b not in told]
        lost = len(running) < len(told)  # a block told to go has ended: the run is under way
        activated = []
        while len(running) < target and waiting:
            block = waiting.pop(0)
            self._go(executor, block)
            told.add(block)
            running.append(block)
            activated.append(block)
            self._since.setdefault(label, time.monotonic())
        wanted = (
            len(waiting) < STANDBY_BLOCKS
            and executor.outstanding() > 0
            and bool(running)
            and len(alive) < target + STANDBY_BLOCKS
            and (lost or self._ran_for_after_s(label))
        )
        if wanted:
            provider.max_blocks = target + len(waiting) + 1
            new = executor.scale_out_facade(1)
            waiting.extend(new)
            logger.info("started standby block %s of %s", ", ".join(new) or "(none)", label)
        provider.max_blocks = target + len(waiting)
        return activated

    def _ran_for_after_s(self, label: str) -> bool:
        """Whether the first block of the executor ``label`` was told to go ``after_s`` ago."""
        since = self._since.get(label)
        return since is not None and time.monotonic() - since >= self._after_s

    def _go(self, executor: Any, block: str) -> None:
        """Create the go file of ``block``: its pool joins the interchange. An adopted pool's file
        (the one it waits for since its start) holds the launch command to run instead of its own."""
        adopted = self._adopted.get((executor.label, block))
        if adopted:
            path = adopted
            tell_go(path, block_launch_command(executor, block), self._environ)
        else:
            path = go_file(executor.worker_logdir, block)
            tell_go(path)
        logger.info("block %s of %s runs (%s)", block, executor.label, path)


def left_waiting(records: Iterable[Mapping[str, Any]], executors: Iterable[Any]) -> list[Kept]:
    """The standby pools that earlier runners left waiting on this host (``records``: theirs in the
    block ledger), at most one for each standby executor of ``executors``, for this runner's first
    Parsl instance to adopt (see the module's docstring). A pool qualifies while its recorded
    process lives and its go file was never created."""
    labels = {e.label for e in _standbys(executors)}
    found: dict[str, Kept] = {}
    for record in records:
        label, go, pid = record.get("executor"), record.get("go"), record.get("pid")
        if (
            not isinstance(label, str)
            or label not in labels
            or label in found
            or not isinstance(go, str)
            or not isinstance(pid, int)
        ):
            continue
        if record.get("host") != socket.gethostname() or os.path.lexists(go):
            continue
        if record.get("started") is None or process_start_time(pid) != record.get("started"):
            continue
        # "started", for the ledger: which process was taken over
        resource = foreign_job(str(record["job_id"]), pid, record.get("script_path"), started=record["started"])
        found[label] = Kept(label, str(record["block"]), go, str(record["job_id"]), resource, record.get("token"))
    return list(found.values())


def lower_init_blocks(executors: Iterable[Any], kept: Iterable[Kept]) -> None:
    """Before a new Parsl instance starts: one initial block fewer for each executor that adopts a
    kept block, which takes its place."""
    labels = {k.label for k in kept}
    for executor in _standbys(executors):
        if executor.label in labels:
            executor.provider.init_blocks = max(0, int(executor.provider.init_blocks) - 1)


def cancel_kept(kept: Iterable[Kept]) -> None:
    """Cancel kept blocks that no Parsl instance adopted: their pools would wait forever."""
    for old in kept:
        provider = LocalProvider()
        set_job_record(provider, old.job_id, old.resource)
        provider.cancel([old.job_id])


def _standbys(executors: Iterable[Any]) -> list[Any]:
    return [e for e in executors if isinstance(e, BlockProviderExecutor) and e.provider is not None and is_standby(e)]


def _block_order(block: str) -> tuple[int, str]:
    return (int(block), block) if block.isdigit() else (1 << 62, block)
