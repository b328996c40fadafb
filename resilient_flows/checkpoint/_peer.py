"""The peer tier: every node's shards also kept in the memory of the next node of a ring.

A node that dies takes its node-local tiers with it, and without another copy the shared file
system, the slowest and most contended storage of the machine, serves the whole restore. With a
peer tier, each rank's shard, once committed in the first tier, is copied over the member's own
network to a rank of the next node (its buddy), which keeps it in the peer tier's directory on its
node (node memory: ``/dev/shm``). The restore of a member that lost a node then reads that node's
shards from its buddy. Losing a node and its buddy together leaves the shared tier.

Order of operations of one replication (every rank, on the flusher's communicator, after the
checkpoint was committed in the first tier):

1. every rank derives the same plan from the ring and the manifest's shard sizes, without
   communicating: who sends to whom, and which nodes have room for the copies under the tier's
   ``capacity`` (a node without room receives nothing for this step);
2. chunk by chunk, each rank sends its shard file from the first tier and receives the shards of
   the ranks whose buddy it is into ``<peer>/step-N/<file>.tmp``, hashing them on the way;
3. the ranks agree that every copy matches its record; each receiving rank renames its copies into
   place and writes the manifest beside them (its node's copy is committed), then ``latest``.

A node's peer directory is pruned by its first rank alone, whole step directories at a time, since
its ranks together hold one node's copies and a world that changed size leaves other names there.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from resilient_flows.checkpoint._comm import Comm, first_problem
from resilient_flows.checkpoint._manifest import Manifest, write_manifest
from resilient_flows.checkpoint._tiers import MANIFEST, Tier
from resilient_flows.durable import fsync_dir
from resilient_flows.errors import CorruptCheckpointError, Failure

#: Bytes per message: large enough for the network, small enough to keep the buffers small.
CHUNK = 8 << 20


@dataclass(frozen=True)
class Ring:
    """The nodes of a group of ranks in a ring, each node's buddy the next one.

    ``hosts[rank]`` is the node rank ``rank`` runs on. Nodes are ordered by their lowest rank, and
    a rank sends to the rank of the same place on the next node (or, where that node has fewer
    ranks, to its place modulo their number), so every rank computes the same ring.
    """

    hosts: tuple[str, ...]

    @functools.cached_property
    def nodes(self) -> list[list[int]]:
        """The ranks of each node, nodes in ring order."""
        by_host: dict[str, list[int]] = {}
        for rank, host in enumerate(self.hosts):
            by_host.setdefault(host, []).append(rank)
        return list(by_host.values())

    @property
    def active(self) -> bool:
        """A ring needs two nodes: a copy on the same node dies with it."""
        return len(self.nodes) > 1

    def buddy(self, rank: int) -> int | None:
        """The rank that keeps a copy of ``rank``'s shard, None on a single node."""
        return self._buddies[rank]

    @functools.cached_property
    def _buddies(self) -> tuple[int | None, ...]:
        """Every rank's buddy, worked out once: plans ask for them at every save."""
        buddies: list[int | None] = [None] * len(self.hosts)
        if self.active:
            nodes = self.nodes
            for here, ranks in enumerate(nodes):
                following = nodes[(here + 1) % len(nodes)]
                for place, rank in enumerate(ranks):
                    buddies[rank] = following[place % len(following)]
        return tuple(buddies)

    def senders(self, rank: int) -> list[int]:
        """The ranks whose buddy ``rank`` is."""
        return [r for r in range(len(self.hosts)) if self.buddy(r) == rank]

    def leader(self, rank: int) -> bool:
        """Whether ``rank`` is its node's first rank, which prunes the node's peer directory."""
        return self.hosts.index(self.hosts[rank]) == rank


@dataclass(frozen=True)
class PeerPlan:
    """One step's replication, the same on every rank."""

    sends: dict[int, int]  # sending rank -> receiving rank, for the nodes with room
    keep: dict[str, int]  # copies each receiving node keeps, by host
    skipped: tuple[str, ...]  # nodes without room for this step's copies


def plan_step(ring: Ring, manifest: Manifest, capacity: int | None, keep: int) -> PeerPlan:
    """Who sends to whom for ``manifest``'s step, and how many copies each node keeps so that
    its peer directory stays within ``capacity`` bytes (None: only ``keep`` bounds it)."""
    incoming: dict[str, int] = {}
    pairs = {}
    for rank in range(len(ring.hosts)):
        buddy = ring.buddy(rank)
        if buddy is not None:
            pairs[rank] = buddy
            host = ring.hosts[buddy]
            incoming[host] = incoming.get(host, 0) + manifest.shards[rank].nbytes
    keeps = {host: copies_within(capacity, nbytes, keep) for host, nbytes in incoming.items()}
    skipped = tuple(sorted(host for host, count in keeps.items() if count < 1))
    sends = {rank: buddy for rank, buddy in pairs.items() if ring.hosts[buddy] not in skipped}
    return PeerPlan(sends, {host: count for host, count in keeps.items() if count >= 1}, skipped)


def copies_within(capacity: int | None, nbytes: int, keep: int) -> int:
    """How many copies of ``nbytes`` a node keeps under ``capacity`` (None: ``keep``); 0: none fits."""
    return keep if capacity is None or not nbytes else min(keep, capacity // nbytes)


def replicate(comm: Comm, ring: Ring, plan: PeerPlan, manifest: Manifest, source: Path, tier: Tier) -> Failure | None:
    """Copy this rank's committed shard ``source`` to its buddy and receive the shards sent to it
    into ``tier`` (steps 2 and 3 of the module's order); the problem, the same on every rank, or
    None. Collective: every rank calls it with the same plan, even one with nothing to send."""
    rank, step = comm.rank, manifest.step
    step_dir = tier.step_dir(step)
    senders = sorted(r for r, to in plan.sends.items() if to == rank)
    receiving = [Incoming(step_dir / manifest.shards[r].file, manifest.shards[r].nbytes, r) for r in senders]
    problem: Failure | None = None
    try:
        reader = _open_source(source, manifest.shards[rank].nbytes) if rank in plan.sends else None
    except OSError as exc:
        reader, problem = None, Failure.of(exc, f"reading {source} for the peer copy failed")
    except CorruptCheckpointError as exc:
        reader, problem = None, Failure.of(exc, "the peer copy's source is damaged")
    problem = first_problem(comm.allgather(problem))  # nobody starts a transfer that one rank cannot finish
    if problem is not None:
        return problem
    try:
        if receiving:
            step_dir.mkdir(parents=True, exist_ok=True)
        problem = _transfer(comm, plan.sends.get(rank), reader, manifest.shards[rank].nbytes, receiving)
    finally:
        if reader is not None:
            reader.close()
        for incoming in receiving:
            incoming.close()
    if problem is None:
        problem = next((p for p in (i.check(manifest) for i in receiving) if p is not None), None)
    problem = first_problem(comm.allgather(problem))
    if problem is not None:
        for incoming in receiving:
            incoming.discard()
        return problem
    try:
        if receiving:
            for incoming in receiving:
                incoming.commit()
            if not (step_dir / MANIFEST).is_file():
                write_manifest(step_dir, manifest)
            tier.write_latest(max(tier.committed_steps()))
    except OSError as exc:  # this node's copy is not made; the others stand
        return Failure.of(exc, f"committing the peer copy of step {step} in {step_dir} failed")
    return None


def held_bytes(tier: Tier) -> int:
    """Bytes of copies this node's peer directory holds."""
    total = 0
    for step_dir in tier.step_dirs().values():
        with contextlib.suppress(OSError):
            total += sum(entry.stat().st_size for entry in step_dir.iterdir() if entry.is_file())
    return total


class Incoming:
    """One shard on its way in: its temporary file and the hash of what arrived. ``sender`` is the
    shard's index in the manifest, whose record it is checked against."""

    def __init__(self, path: Path, nbytes: int, sender: int) -> None:
        self.path, self.nbytes, self.sender = path, nbytes, sender
        self.tmp = path.with_name(path.name + ".tmp")
        self.digest = xxhash.xxh3_64()
        self.received = 0
        self.fd: int | None = None
        self.problem: Failure | None = None

    def write(self, data: memoryview) -> None:
        self.digest.update(data)
        self.received += len(data)
        if self.problem is not None:
            return  # keep receiving: the sender must not wait for a rank that gave up
        try:
            if self.fd is None:
                self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            written = 0
            while written < len(data):
                written += os.write(self.fd, data[written:])
        except OSError as exc:
            self.problem = Failure.of(exc, f"writing the peer copy {self.tmp} failed")

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                if self.problem is None:
                    os.fsync(self.fd)
            os.close(self.fd)
            self.fd = None

    def check(self, manifest: Manifest) -> Failure | None:
        record = manifest.shards[self.sender]
        if self.problem is not None:
            return self.problem
        if self.received != record.nbytes or self.digest.hexdigest() != record.xxh3_64:
            problem = f"the peer copy of {record.file} from rank {self.sender} does not match its record"
            return Failure("error", problem)
        return None

    def commit(self) -> None:
        if self.nbytes == 0 and not self.tmp.exists():
            self.tmp.touch()
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)

    def discard(self) -> None:
        self.tmp.unlink(missing_ok=True)


def _open_source(path: Path, nbytes: int):
    size = path.stat().st_size
    if size != nbytes:
        raise CorruptCheckpointError(f"{path} has {size} bytes, the manifest says {nbytes}")
    return open(path, "rb", buffering=0)  # closed by replicate


def _transfer(comm: Comm, buddy: int | None, reader, nbytes: int, receiving: list[Incoming]) -> Failure | None:
    """Chunk by chunk: this rank's file to ``buddy`` while the senders' shards arrive. A rank
    whose disk fails keeps the exchange going (zeros out, data dropped) so that nobody hangs; the
    hashes then tell every rank."""
    problem = None
    out = torch.empty(CHUNK, dtype=torch.uint8)
    ins = [torch.empty(CHUNK, dtype=torch.uint8) for _ in receiving]
    sent = 0
    rounds = max([_chunks(nbytes) if buddy is not None else 0, *(_chunks(i.nbytes) for i in receiving)])
    for index in range(rounds):
        sends = []
        if buddy is not None and sent < nbytes:
            length = min(CHUNK, nbytes - sent)
            view = out.numpy().data[:length]
            try:
                got = reader.readinto(view)
                if got != length:
                    raise OSError(f"short read: {got} of {length} bytes")
            except OSError as exc:
                problem = problem or Failure.of(exc, "reading the shard for its peer copy failed")
                out[:length] = 0
            sends.append((buddy, out[:length]))
            sent += length
        recvs = []
        for incoming, buffer in zip(receiving, ins, strict=True):
            offset = index * CHUNK
            if offset < incoming.nbytes:
                recvs.append((incoming, buffer[: min(CHUNK, incoming.nbytes - offset)]))
        comm.exchange(sends, [(incoming.sender, buffer) for incoming, buffer in recvs])
        for incoming, buffer in recvs:
            incoming.write(memoryview(buffer.numpy()))
    return problem


def _chunks(nbytes: int) -> int:
    return -(-nbytes // CHUNK)
