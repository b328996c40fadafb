"""A member that may shrink (``min_nodes``) goes on at once on the nodes its block has left.

Without spare nodes, a block that lost a node of a member on several nodes holds too few for
it: the member would wait for a new block, a trip through the batch queue. A member that
declares ``min_nodes`` below its ``nodes`` instead restarts in the same block on the nodes left
(at least ``min_nodes``), as many ranks per node as before, and restores its newest checkpoint
resharded onto the fewer ranks (the reader works on any rank count). Its weights then follow
the smaller layout's float rounding: close to the full layout's, bit for bit equal only to a run
on the same layouts. The launch watcher is told the fewest nodes the member can run on, so that
the retry handler keeps such a block (see :mod:`resilient_flows.training._nodewatch`).

Only light modules here: this runs in the worker that launches a member, which imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from resilient_flows.training._lostnodes import job_hosts


def fewest_nodes(spec: Mapping[str, Any]) -> int:
    """The fewest nodes the member of ``spec`` (a :class:`MemberSpec` as a dict) can run on."""
    nodes, least = int(spec.get("nodes", 1)), spec.get("min_nodes")
    return nodes if least is None else min(int(least), nodes)


def on_nodes_left(spec: dict[str, Any], lost: Sequence[str], env: Mapping[str, str]) -> dict[str, Any]:
    """The spec this attempt runs: the member's own, or, where it may shrink and its block
    (``env``'s) has fewer live nodes than it spans but at least ``min_nodes``, the same member on
    those nodes with as many ranks per node. ``lost``: the block's lost nodes. Not under Parsl's
    ``MPIExecutor``, whose launch prefix has the task's nodes and ranks fixed at submission."""
    nodes = int(spec.get("nodes", 1))
    least = fewest_nodes(spec)
    if not lost or least >= nodes or env.get("PARSL_MPI_PREFIX"):  # Parsl's MPIExecutor fixed its nodes
        return spec
    hosts = job_hosts(env)
    left = len([h for h in hosts if h not in set(lost)])
    return shrunk(spec, left) if hosts and least <= left < nodes else spec


def shrunk(spec: dict[str, Any], nodes: int) -> dict[str, Any]:
    """``spec`` on ``nodes`` of its nodes, ``ranks_per_node`` on each; ``min_nodes`` kept, down to
    ``nodes``."""
    per_node = int(spec["ranks"]) // int(spec["nodes"])
    least = fewest_nodes(spec)
    return {**spec, "nodes": nodes, "ranks": per_node * nodes, "min_nodes": min(least, nodes)}
