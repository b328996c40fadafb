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
- starts a new standby block once none waits, tasks are outstanding, and an attempt in one of
  the running blocks trains (its heartbeat has a step time): the standby's imports take CPU, and
  must not slow the first block's start or the restore of the members that a lost block's
  replacement took over;
- holds the provider's ``max_blocks`` at the running count plus the waiting ones, so that Parsl's
  strategy, which counts a waiting block as a block, starts a block only for a running one that
  is missing. Should the strategy and the runner start one at the same moment, the extra block
  waits too, idle, until it is needed.

A lost block is retired as before (:func:`~resilient_flows.workflow._blocks.retire_block`);
its Parsl status turns terminal, and the next look activates the standby.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from parsl.executors.status_handling import BlockProviderExecutor

from resilient_flows.sites._parsl_adapter import go_file, is_standby

logger = logging.getLogger(__name__)

#: How many blocks of an executor wait as standbys.
STANDBY_BLOCKS = 1


class Standby:
    """Call :meth:`update` from the runner's loop, one instance per Parsl instance (block ids and
    go files are those of its executors)."""

    def __init__(self) -> None:
        self._running: dict[str, set[str]] = {}  # executor -> the blocks told to go
        self._target: dict[str, int] = {}  # executor -> the blocks it runs (the site's max_blocks)

    def update(self, executors: Iterable[Any], beats: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
        """Activate and start standby blocks as the module says; ``beats`` are the running
        attempts' heartbeat records (their ``block``). The (executor, block) pairs activated."""
        activated = []
        training = {str(b["block"]) for b in beats.values() if b.get("block") is not None and b.get("step_s")}
        for executor in executors:
            if isinstance(executor, BlockProviderExecutor) and executor.provider is not None and is_standby(executor):
                activated.extend((executor.label, block) for block in self._update_one(executor, training))
        return activated

    def _update_one(self, executor: Any, training: set[str]) -> list[str]:
        label, provider = executor.label, executor.provider
        target = self._target.setdefault(label, max(1, int(provider.max_blocks)))
        told = self._running.setdefault(label, set())
        alive = sorted((b for b, s in executor.status_facade.items() if not s.terminal), key=_block_order)
        running = [b for b in alive if b in told]
        waiting = [b for b in alive if b not in told]
        activated = []
        while len(running) < target and waiting:
            block = waiting.pop(0)
            _go(executor, block)
            told.add(block)
            running.append(block)
            activated.append(block)
        wanted = (
            len(waiting) < STANDBY_BLOCKS
            and executor.outstanding() > 0
            and any(b in training for b in running)
            and len(alive) < target + STANDBY_BLOCKS
        )
        if wanted:
            provider.max_blocks = target + len(waiting) + 1
            new = executor.scale_out_facade(1)
            waiting.extend(new)
            logger.info("started standby block %s of %s", ", ".join(new) or "(none)", label)
        provider.max_blocks = target + len(waiting)
        return activated


def _go(executor: Any, block: str) -> None:
    """Create the go file of ``block``: its pool joins the interchange."""
    path = Path(go_file(executor.worker_logdir, block))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    logger.info("block %s of %s runs (%s)", block, executor.label, os.fspath(path))


def _block_order(block: str) -> tuple[int, str]:
    return (int(block), block) if block.isdigit() else (1 << 62, block)
