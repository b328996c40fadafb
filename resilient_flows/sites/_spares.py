"""Spare nodes in every block: ``facts.spare_nodes``, so a node's death stays inside the allocation.

A block asks for ``facts.nodes`` plus ``spare_nodes`` nodes, and is submitted so that the batch
system does not end it when a node dies (Slurm's ``--no-kill``; PBS Pro's
``tolerate_node_failures``). Members plan with ``facts.nodes`` only; when a node of a member dies,
its retry restarts at once on a node of the same block that is still alive (see
:mod:`resilient_flows.training._lostnodes`), and a new block is needed only once the spares ran out.
A run whose members may shrink (``min_nodes``) has its blocks outlive a node without spares too:
such a member goes on, at once, on the nodes left.
"""

from __future__ import annotations

import copy
from typing import Any

from resilient_flows.sites._facts import count

#: What each batch system's script needs so that a node's death does not end the job.
_SURVIVE = {
    "SlurmProvider": "#SBATCH --no-kill",
    "PBSProProvider": "#PBS -W tolerate_node_failures=all",
}


def spare_nodes(document: dict[str, Any], where: str) -> int:
    """The site's ``facts.spare_nodes`` (0 where it names none), checked as the facts check it."""
    facts = document.get("facts")
    raw = facts.get("spare_nodes", 0) if isinstance(facts, dict) else 0
    return count(raw, "spare_nodes", where, least=0)


def with_spares(document: dict[str, Any], spares: int, survive: bool = False) -> dict[str, Any]:
    """The site ``document`` whose providers ask for ``spares`` more nodes per block, in blocks that
    outlive a node (also without spares where ``survive``); the same document when there is neither."""
    if spares <= 0 and not survive:
        return document
    document = copy.deepcopy(document)
    for executor in document.get("executors") or []:
        provider = executor.get("provider") if isinstance(executor, dict) else None
        if not isinstance(provider, dict):
            continue
        provider["nodes_per_block"] = int(provider.get("nodes_per_block", 1)) + spares
        lasting = _SURVIVE.get(str(provider.get("type")))
        if lasting is not None:
            given = str(provider.get("scheduler_options") or "")
            provider["scheduler_options"] = f"{given}\n{lasting}" if given else lasting
    return document
