"""How members spanning nodes restored after a node loss: which copies (local, peer, shared) their
next attempt read, judged against what the peer tier promises.
"""

from __future__ import annotations

from dataclasses import dataclass

from chaoslib.config import NODE_LOSSES
from chaoslib.losses import by_member, losses
from chaoslib.rundata import RunData
from chaoslib.schedule import Fault


@dataclass(frozen=True)
class Resume:
    """The next attempt of a member spanning nodes whose attempt a node loss ended: what it read."""

    member: str
    attempt: int  # the resuming attempt
    kind: str  # the fault: node-loss or node-and-buddy-loss
    lost: tuple[str, ...]  # the nodes it crashed
    hosts: tuple[str, ...]  # the nodes the resuming attempt ran on
    step: int | None  # the step restored; None: none (it started over, or ended before restoring)
    bytes_from: dict[str, int]  # bytes read per source, as the ``resumed`` event says
    lost_steps: int

    @property
    def sources(self) -> set[str]:
        """``local``, ``peer``, ``shared``: where its bytes came from, whatever the node."""
        return {source.split(" on ")[0] for source in self.bytes_from}

    @property
    def as_expected(self) -> bool:
        """After one node: restored without a byte of the shared tier; after a node and its buddy:
        restored from the shared tier alone."""
        if self.step is None:
            return False
        return "shared" not in self.sources if self.kind == "node-loss" else self.sources == {"shared"}


def node_loss_resumes(data: RunData, faults: list[Fault], spanning: set[str]) -> list[Resume]:
    """For each attempt of a member of ``spanning`` that a node loss struck and ended: the restore
    of the first later attempt that restored a checkpoint (its ``resumed`` event's step and
    ``bytes_from``) or trained without one (started over); attempts that other faults ended
    before either are passed over."""
    grouped = by_member(data)
    out = []
    for loss in losses(data, faults):
        fault = loss.fault
        if fault is None or fault.kind not in NODE_LOSSES or loss.member not in spanning:
            continue
        if fault.hit.get(loss.member) != loss.attempt:
            continue  # ended as its block went down, not on a lost node
        mine = grouped.get(loss.member, [])
        trained = {attempt for _, attempt, _ in data.metrics.get(loss.member, [])}
        resumes = {e["attempt"]: e for e in mine if e["kind"] == "resumed"}
        after = sorted(e["attempt"] for e in mine if e["kind"] == "started" and e["attempt"] > loss.attempt)
        nxt = next((a for a in after if a in resumes or a in trained), None)
        if nxt is None:
            continue
        start = next(e for e in mine if e["kind"] == "started" and e["attempt"] == nxt)
        resumed = resumes.get(nxt)
        out.append(
            Resume(
                loss.member,
                nxt,
                fault.kind,
                tuple(fault.nodes),
                tuple(start.get("hosts") or [start.get("host")]),
                None if resumed is None else int(resumed["step"]),
                {} if resumed is None else {k: int(v) for k, v in resumed.get("bytes_from", {}).items()},
                loss.steps,
            )
        )
    return out
