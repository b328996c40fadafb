"""Cloning over MPI: hand a running training's state to clone ranks of the same job, point to point.

When the source and its clones are ranks of one MPI job there is no need to go through a file
system. The source ranks split the state's bytes between them exactly as a checkpoint would
(:func:`~resilient_flows.checkpoint._transfer.plan_send` over the ``N`` source ranks): each
distinct box once, replicated arrays shared by bytes, each rank its own shards of sharded
(``DTensor``) arrays. Each clone rank works out which of those boxes overlap what it holds in its
own layout (all of an array when replicated, its local shard when sharded, on any number of
ranks) and asks each source rank for exactly those; so a clone of another rank count or another
parallelism receives only what it needs, and reshards it as a restore would
(:class:`~resilient_flows.checkpoint._transfer.Destination`). This module owns the wire (messages,
tags, the metadata's JSON); everything it knows of the state comes through
:mod:`resilient_flows.checkpoint._transfer`.

Protocol, per (source rank, clone rank) pair, on three tags of the given communicator:

1. ``TAG_META``: the source sends a small JSON document: the skeleton of the state (its structure
   and scalar values, see :mod:`resilient_flows.checkpoint._tree`), the names, dtypes and global
   shapes of its arrays, the boxes this source rank holds for sending, and (from source rank
   ``j % N`` to the clone of index ``j``) the per-rank values under
   :data:`~resilient_flows.checkpoint._state.RANK_LOCAL`, as restore hands them out. JSON, never
   pickle: a clone parses what it is sent, it unpickles nothing. A source that cannot flatten its
   state sends its error here instead.
2. ``TAG_REPLY``: the clone checks that every source rank sent the same structure, that their
   boxes tile every array exactly once, and that it fits the state it receives into, then answers
   every source rank with the same verdict (``ok`` or the error) and, when ``ok``, the indices of
   that source's boxes it wants. So a refused transfer fails on every rank with a message that
   says why, and no rank waits for data that will never come.
3. ``TAG_DATA``: raw bytes, one message per wanted box (cut at :data:`CHUNK_BYTES` for 32-bit MPI
   counts), sent with ``Isend`` from byte views of the tensors and received with ``Irecv``
   straight into the destination tensor where the box lies whole and contiguous in it (same
   layout), into a buffer and then copied where it does not (another layout). Travelling as
   bytes, every dtype goes, those numpy lacks (bfloat16, float8) included. Messages of one pair
   on one tag arrive in the order they were sent, so both sides only need to agree on the order,
   which the wanted indices give them.

The source's stall. :func:`send_state` blocks until every byte has left and sends from the live
tensors themselves: no copy at all for contiguous CPU tensors (a host copy for non-contiguous or
device tensors), the stall is the whole transfer. :func:`start_send_state` first copies this rank's
pieces into one host staging buffer (pinned when CUDA is available), then hands the protocol to a
background thread and returns: the caller's stall is the copy, and training continues while the
bytes travel. A source that clones more than once passes the same :class:`StagingBuffer` each time:
a fresh buffer costs its page faults (or its pinning) on every transfer, several times the copy.
The background thread needs ``MPI_THREAD_MULTIPLE`` (mpi4py's default); with a lower thread
level the transfer runs before ``start_send_state`` returns, and a warning says so. The waits for a
peer's metadata poll every :data:`POLL_SECONDS` so that a rank waiting for a slow peer does not burn
the core training needs; the data itself moves in ``Waitall``, which MPI implementations busy-wait.

Only one transfer at a time may be in flight between the same pair of ranks on one communicator,
and the user's own point-to-point messages on it must not use the three tags. After a timeout, the
messages already sent stay queued: use a fresh communicator (``Dup``) for the next transfer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from resilient_flows.checkpoint import (
    Box,
    Destination,
    SendPlan,
    Stateful,
    check_pieces,
    discard_target,
    plan_send,
    unflatten_state,
)
from resilient_flows.errors import CloneError, ResilientFlowsError

logger = logging.getLogger(__name__)

#: Message tags of the protocol (below 32767, the smallest ``MPI_TAG_UB`` the standard allows).
TAG_META, TAG_REPLY, TAG_DATA = 0x7CF0, 0x7CF1, 0x7CF2
#: Largest single data message: below the 2 GiB that 32-bit MPI counts allow.
CHUNK_BYTES = 1 << 30
#: How often a rank waiting for a peer's metadata looks for it.
POLL_SECONDS = 0.001
#: Alignment of each box in a staging buffer: enough for every dtype.
ALIGN = 16
#: Version of the metadata document; a clone refuses others.
FORMAT = 2


@dataclass
class CloneTransferStats:
    """What one rank's part of a transfer cost; every time in seconds.

    Attributes
    ----------
    role:
        ``"source"`` or ``"clone"``.
    rank:
        This rank in the communicator.
    peers:
        The clone ranks this source rank served, or the source ranks this clone received from.
    payload_bytes:
        Array bytes this rank sent (summed over its clones) or received.
    metadata_bytes:
        JSON bytes this rank sent (source) or received (clone).
    messages:
        Data messages this rank posted.
    staging_bytes:
        Bytes copied into host memory before sending (staging buffer, or copies of non-contiguous
        and device tensors); 0 when every piece went from the live tensors.
    stall_s:
        How long the caller was blocked: until :func:`start_send_state` returned, or the whole
        :func:`send_state` / :func:`recv_state` call.
    copy_s:
        Flattening the state and copying it into host memory.
    handshake_s:
        Waiting for the peers' metadata or verdicts (a clone waits here for its source to arrive).
    transfer_s:
        From posting the first data message to the completion of the last.
    total_s:
        From the call to the last byte.
    """

    role: str = ""
    rank: int = -1
    peers: list[int] = field(default_factory=list)
    payload_bytes: int = 0
    metadata_bytes: int = 0
    messages: int = 0
    staging_bytes: int = 0
    stall_s: float = 0.0
    copy_s: float = 0.0
    handshake_s: float = 0.0
    transfer_s: float = 0.0
    total_s: float = 0.0


# --------------------------------------------------------------------------------------------- source


class StagingBuffer:
    """Host memory that :func:`start_send_state` copies into, kept from one transfer to the next.

    It grows to the largest share sent and never shrinks; one transfer holds it from the copy until
    its last byte has left, and a second transfer that asks for it meanwhile is refused rather than
    overwrite bytes still in flight.
    """

    def __init__(self, pin_memory: bool | None = None) -> None:
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.allocations = 0
        self._buffer = torch.empty(0, dtype=torch.uint8)
        self._lock = threading.Lock()
        self._busy = False

    @property
    def nbytes(self) -> int:
        return self._buffer.numel()

    def acquire(self, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` of the buffer, for one transfer; :meth:`release` when it is sent."""
        with self._lock:
            if self._busy:
                raise RuntimeError(
                    "this StagingBuffer still holds a transfer in flight: wait() for it before the next send"
                )
            self._busy = True
        if nbytes > self._buffer.numel():
            self._buffer = torch.empty(0, dtype=torch.uint8)  # free the old one first
            self._buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin_memory)
            self.allocations += 1
        return self._buffer[:nbytes]

    def release(self) -> None:
        with self._lock:
            self._busy = False


def send_state(
    comm: Any,
    state: Stateful | dict[str, Any],
    clone_ranks: Sequence[int],
    source_ranks: Sequence[int],
    *,
    timeout: float | None = None,
) -> CloneTransferStats:
    """Send this source rank's share of ``state`` to every clone rank; return once all is sent.

    Called by every rank of ``source_ranks``, each holding the same replicated state and its own
    shards of sharded (``DTensor``) state, whose device mesh must consist of these ranks (MPI ranks
    are taken to be ``torch.distributed`` ranks), and its own per-rank values under
    ``rank_local``. Sends straight from the live tensors: no copy for contiguous CPU tensors, so
    the caller must not change the state before this returns. See :func:`start_send_state` for a
    version that returns after a copy.

    Parameters
    ----------
    comm:
        An ``mpi4py`` communicator containing the source and clone ranks (or its
        :func:`~resilient_flows.checkpoint._comm.as_comm` wrapper).
    state:
        A :class:`~resilient_flows.checkpoint._state.Stateful` (a ``TrainState``) or a state dict.
    clone_ranks:
        Ranks of ``comm`` that call :func:`recv_state`; clone ``j`` (its index here) gets the
        per-rank values of ``source_ranks[j % len(source_ranks)]``.
    source_ranks:
        Ranks of ``comm`` that call this function together, this one among them; same order on all.
    timeout:
        Seconds to wait for a clone's verdict before raising :class:`CloneError`; None: forever.

    Returns
    -------
    CloneTransferStats
        Bytes sent by this rank and where the time went.

    Raises
    ------
    CloneError
        A clone refused the state (its message says why) or did not answer in time.
    """
    started = time.perf_counter()
    transfer = _prepare(comm, state, clone_ranks, source_ranks, timeout=timeout, started=started)
    transfer.run()
    transfer.stats.stall_s = transfer.stats.total_s
    transfer.raise_error()
    return transfer.stats


def start_send_state(
    comm: Any,
    state: Stateful | dict[str, Any],
    clone_ranks: Sequence[int],
    source_ranks: Sequence[int],
    *,
    timeout: float | None = None,
    staging: StagingBuffer | None = None,
) -> CloneSend:
    """Copy this source rank's share of ``state`` into a host buffer and send it in the background.

    Same contract and parameters as :func:`send_state`; returns as soon as the copy is done, after
    which the caller may change the state (train on). The copy holds this rank's share: about
    ``1/N`` of the replicated bytes, its shards, and its per-rank values. Call
    :meth:`CloneSend.wait` before the next transfer on the same communicator.

    Parameters
    ----------
    staging:
        Where the copy goes; pass the same one to every transfer of this source. Default: a fresh
        buffer for this transfer alone (pinned when CUDA is available).

    Returns
    -------
    CloneSend
        The transfer in flight; ``wait()`` returns its :class:`CloneTransferStats`.
    """
    from mpi4py import MPI

    started = time.perf_counter()
    transfer = _prepare(
        comm, state, clone_ranks, source_ranks, timeout=timeout, started=started, staging=staging or StagingBuffer()
    )
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        logger.warning("MPI runs without MPI_THREAD_MULTIPLE: the clone transfer blocks training until it is sent")
        transfer.run()
        transfer.stats.stall_s = transfer.stats.total_s
        return CloneSend(transfer, None)
    transfer.stats.stall_s = time.perf_counter() - started
    thread = threading.Thread(target=transfer.run, name="rf-clone-send", daemon=True)
    thread.start()
    return CloneSend(transfer, thread)


class CloneSend:
    """A transfer started by :func:`start_send_state`."""

    def __init__(self, transfer: _SourceTransfer, thread: threading.Thread | None) -> None:
        self._transfer = transfer
        self._thread = thread

    def done(self) -> bool:
        """Whether every byte has been sent (or the transfer has failed)."""
        return self._thread is None or not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> CloneTransferStats:
        """Block until the transfer is over; its stats.

        Raises
        ------
        CloneError
            A clone refused the state or did not answer in time.
        TimeoutError
            The transfer is still running after ``timeout`` seconds (it goes on).
        """
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the clone transfer is still running after {timeout} s")
        self._transfer.raise_error()
        return self._transfer.stats


@dataclass
class _SourceTransfer:
    """One source rank's side of a transfer, ready to run: metadata per clone, byte buffers in order."""

    comm: Any
    clone_ranks: list[int]
    meta: dict[int, bytes]
    pieces: list[tuple[torch.Tensor, Box]]
    local: list[np.ndarray]
    local_to: set[int]
    deadline: float | None
    started: float
    stats: CloneTransferStats
    failure: str | None = None
    error: BaseException | None = None
    keep: list[Any] = field(default_factory=list)  # host copies the byte views point into
    staging: StagingBuffer | None = None

    def run(self) -> None:
        """The protocol: metadata out, verdicts in, data out to every clone that accepted."""
        from mpi4py import MPI

        try:
            waited = time.perf_counter()
            metas = [self.comm.Isend(_message(self.meta[c]), dest=c, tag=TAG_META) for c in self.clone_ranks]
            verdicts = {
                c: _recv_json(self.comm, c, TAG_REPLY, self.deadline, f"the verdict of clone rank {c}")
                for c in self.clone_ranks
            }
            MPI.Request.Waitall(metas)
            self.stats.handshake_s = time.perf_counter() - waited
            if self.failure is not None:
                raise CloneError(self.failure)
            refused = {c: v.get("error") or "no reason given" for c, v in verdicts.items() if not v.get("ok")}
            wanted = {}
            for c, verdict in verdicts.items():
                if c not in refused:
                    try:
                        wanted[c] = [self._part(*want) for want in verdict.get("want", [])]
                    except (TypeError, ValueError, IndexError) as exc:
                        refused[c] = f"asked for a piece this source rank does not hold ({exc})"
            sending = time.perf_counter()
            requests = []
            for c in self.clone_ranks:
                if c in refused:
                    continue
                for buffer in wanted[c] + (self.local if c in self.local_to else []):
                    for chunk in _chunks(buffer):
                        requests.append(self.comm.Isend(chunk, dest=c, tag=TAG_DATA))
                        self.stats.payload_bytes += chunk.nbytes
            self.stats.messages = len(requests)
            MPI.Request.Waitall(requests)
            self.stats.transfer_s = time.perf_counter() - sending
            if refused:
                reasons = "; ".join(f"clone rank {c}: {reason}" for c, reason in refused.items())
                raise CloneError(f"the clone refused the state ({reasons})")
        except BaseException as exc:  # reported by raise_error, never lost in a thread
            self.error = exc
        finally:
            self.stats.total_s = time.perf_counter() - self.started
            self.keep.clear()
            self.pieces, self.local = [], []
            if self.staging is not None:
                self.staging.release()
        if self.error is None:
            logger.info(
                "sent %d bytes of state to clone rank(s) %s in %.3f s (stall %.3f s)",
                self.stats.payload_bytes,
                self.clone_ranks,
                self.stats.total_s,
                self.stats.stall_s,
            )

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def _part(self, index: int, offsets: list[int], lengths: list[int]) -> np.ndarray:
        """Bytes of the part ``offsets``/``lengths`` of piece ``index``, as a clone asked for it."""
        piece, box = self.pieces[index]
        part = Box(tuple(map(int, offsets)), tuple(map(int, lengths)))
        if part.intersect(box) != part:
            raise ValueError(f"{list(part.offsets)} + {list(part.lengths)} is not inside piece {index}")
        view = piece if part == box else piece[part.within(box)]
        if view.is_contiguous():
            return _bytes_of(view.reshape(-1))
        copy = view.contiguous().reshape(-1)
        self.keep.append(copy)
        return _bytes_of(copy)


def _prepare(
    comm: Any,
    state: Stateful | dict[str, Any],
    clone_ranks: Sequence[int],
    source_ranks: Sequence[int],
    *,
    timeout: float | None,
    started: float,
    staging: StagingBuffer | None = None,
) -> _SourceTransfer:
    """Flatten, plan and (into ``staging``, if given) copy; a state that cannot be flattened: an error message."""
    raw = _raw(comm)
    rank = raw.Get_rank()
    sources, clones = _check_ranks(raw, source_ranks, clone_ranks)
    if rank not in sources:
        raise ValueError(f"send_state is for the source ranks {sources}; this is rank {rank}")
    index, world = sources.index(rank), len(sources)
    stats = CloneTransferStats(role="source", rank=rank, peers=list(clones))
    header = {"format": FORMAT, "source_ranks": sources, "clone_ranks": clones, "index": index, "error": None}
    transfer = _SourceTransfer(
        comm=raw,
        clone_ranks=clones,
        meta={},
        pieces=[],
        local=[],
        local_to={c for j, c in enumerate(clones) if j % world == index},
        deadline=None if timeout is None else started + timeout,
        started=started,
        stats=stats,
    )
    try:
        plan = plan_send(_state_dict(state), sources, index)
        views = plan.views(local=bool(transfer.local_to))
        views = _host(views, transfer) if staging is None else _stage(views, transfer, staging)
        transfer.pieces = [(view, item.box) for view, item in zip(views, plan.items, strict=False)]
        transfer.local = [_bytes_of(view.reshape(-1)) for view in views[len(plan.items) :]]
        transfer.meta = _metadata(header, plan, clones, transfer.local_to)
    except (ResilientFlowsError, TypeError, ValueError) as exc:
        transfer.failure = f"source rank {rank} cannot send its state: {exc}"
        failed = json.dumps({**header, "error": transfer.failure}).encode()
        transfer.meta = dict.fromkeys(clones, failed)
        transfer.pieces, transfer.local = [], []
    stats.metadata_bytes = sum(len(m) for m in transfer.meta.values())
    stats.copy_s = time.perf_counter() - started
    return transfer


def _metadata(header: dict[str, Any], plan: SendPlan, clones: list[int], serves: set[int]) -> dict[int, bytes]:
    """The metadata document for every clone; this rank's per-rank values for those it ``serves``."""
    body = {
        **header,
        "layout": [_layout_entry(spec.name, spec.dtype, spec.shape) for spec in plan.specs],
        "skeleton": plan.flat.skeleton,
        "pieces": [[item.name, list(item.box.offsets), list(item.box.lengths)] for item in plan.items],
    }
    local = {
        "skeleton": plan.flat.local_skeleton or None,
        "layout": [_layout_entry(item.name, item.dtype, item.box.lengths) for item in plan.local_items],
    }
    return {c: json.dumps({**body, "local": local if c in serves else None}).encode() for c in clones}


def _host(views: list[torch.Tensor], transfer: _SourceTransfer) -> list[torch.Tensor]:
    """The live views where they lie contiguous in host memory, host copies of the others."""
    out = []
    for piece in views:
        if piece.device.type == "cpu" and piece.is_contiguous() and not (piece.is_conj() or piece.is_neg()):
            out.append(piece)
            continue
        copy = piece.resolve_conj().resolve_neg().cpu().contiguous()
        transfer.stats.staging_bytes += copy.numel() * copy.element_size()
        transfer.keep.append(copy)
        out.append(copy)
    return out


def _stage(parts: list[torch.Tensor], transfer: _SourceTransfer, staging: StagingBuffer) -> list[torch.Tensor]:
    """Copy every piece into the staging buffer; typed views of it, in the same order."""
    sizes = [part.numel() * part.element_size() for part in parts]
    starts = []
    total = 0
    for size in sizes:  # each piece aligned for any dtype, so that a clone's part of it can be sliced
        total += -total % ALIGN
        starts.append(total)
        total += size
    buffer = staging.acquire(total)
    transfer.staging = staging
    transfer.stats.staging_bytes += buffer.numel()
    out, devices = [], set()
    with torch.no_grad():
        for part, start, size in zip(parts, starts, sizes, strict=True):
            dst = buffer[start : start + size].view(part.dtype).view(part.shape)
            src = part.resolve_conj().resolve_neg()
            if src.device.type != "cpu":
                devices.add(src.device)
            dst.copy_(src, non_blocking=src.device.type == "cuda")
            out.append(dst)
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return out


# ---------------------------------------------------------------------------------------------- clone


def recv_state(
    comm: Any,
    source_ranks: Sequence[int],
    into: Stateful | None = None,
    *,
    timeout: float | None = None,
    stats: CloneTransferStats | None = None,
) -> dict[str, Any]:
    """Receive a state sent by :func:`send_state` / :func:`start_send_state`; load it into ``into``.

    Called by each clone rank. Every piece is received directly into its destination tensor: the
    live tensor of ``into`` when it is a contiguous CPU tensor of the same dtype and shape (model
    parameters, existing optimizer moments), a freshly allocated one otherwise. Before anything is
    received the structure is checked against ``into``; a mismatch is sent to every source rank
    and raised here, so both sides fail with the same message and ``into`` is untouched. A failure
    during the transfer itself (an MPI error) can leave ``into`` partly overwritten.

    Parameters
    ----------
    comm:
        The communicator the source ranks send on (``mpi4py``, or its ``as_comm`` wrapper).
    source_ranks:
        The source ranks, in the order they pass to :func:`send_state`.
    into:
        A Stateful to load the state into (``load_state_dict``), typically a ``TrainState`` over
        a freshly built model and optimizer; None to only return the state.
    timeout:
        Seconds to wait for the sources' metadata before raising :class:`CloneError`; None: forever.
    stats:
        Filled in place with what this rank received and where the time went, if given.

    Returns
    -------
    dict
        The state dict as the source's ``state_dict()`` returned it (CPU tensors), with this clone's
        per-rank values under ``rank_local``.

    Raises
    ------
    StateMismatchError
        The state does not fit ``into`` (names, shapes, dtypes, optimizer groups).
    CloneError
        A source rank could not send, the source ranks disagree, or the wait timed out.
    """
    from mpi4py import MPI

    started = time.perf_counter()
    raw, rank, sources = _clone_rank(comm, source_ranks)
    stats = stats if stats is not None else CloneTransferStats()
    stats.role, stats.rank, stats.peers = "clone", rank, list(sources)
    deadline = None if timeout is None else started + timeout
    texts = _recv_metadata(raw, sources, deadline)
    stats.handshake_s = time.perf_counter() - started
    stats.metadata_bytes = sum(len(t) for t in texts)
    problem, incoming = None, None
    try:
        incoming = _post_receives(raw, texts, sources, rank, into, stats)
    except Exception as exc:  # every source must hear the verdict, whatever went wrong
        problem = exc if isinstance(exc, ResilientFlowsError) else CloneError(f"cannot receive the state: {exc!r}")
        incoming = None
        discard_target(into)
    replies = _send_verdicts(raw, sources, problem, incoming)
    if incoming is None:
        MPI.Request.Waitall(replies)  # small: sent eagerly, whether or not the source still listens
        stats.total_s = stats.stall_s = time.perf_counter() - started
        raise problem if problem is not None else CloneError("cannot receive the state")
    stats.messages = len(incoming.requests)
    MPI.Request.Waitall(incoming.requests + replies)
    state, stats.transfer_s = incoming.deliver(into)
    stats.total_s = stats.stall_s = time.perf_counter() - started
    logger.info(
        "received %d bytes of state from source rank(s) %s in %.3f s (%.3f s of it waiting for them)",
        stats.payload_bytes,
        sources,
        stats.total_s,
        stats.handshake_s,
    )
    return state


def _clone_rank(comm: Any, source_ranks: Sequence[int]) -> tuple[Any, int, list[int]]:
    """The raw communicator, this rank, and the source ranks checked: this rank is none of them."""
    raw = _raw(comm)
    rank = raw.Get_rank()
    sources, _ = _check_ranks(raw, source_ranks, [])
    if rank in sources:
        raise ValueError(f"rank {rank} is one of the source ranks {sources}; it cannot also be a clone")
    return raw, rank, sources


def _send_verdicts(
    raw: Any, sources: list[int], problem: BaseException | None, incoming: _Incoming | None
) -> list[Any]:
    """Tell every source whether the transfer goes ahead, and which pieces this rank wants of it."""
    replies = []
    for i, s in enumerate(sources):
        verdict = {"ok": problem is None, "error": None if problem is None else str(problem)}
        if incoming is not None:
            verdict["want"] = incoming.wants[i]
        replies.append(raw.Isend(_message(json.dumps(verdict).encode()), dest=s, tag=TAG_REPLY))
    return replies


def _recv_metadata(raw: Any, sources: list[int], deadline: float | None) -> list[bytearray]:
    """Every source's metadata, in order; on a timeout the sources heard from so far are told, so
    that none waits for a verdict forever."""
    from mpi4py import MPI

    texts: list[bytearray] = []
    for s in sources:
        try:
            texts.append(_recv_bytes(raw, s, TAG_META, deadline, f"the state from source rank {s}"))
        except CloneError as exc:
            refusal = _message(json.dumps({"ok": False, "error": str(exc)}).encode())
            MPI.Request.Waitall([raw.Isend(refusal, dest=d, tag=TAG_REPLY) for d in sources[: len(texts)]])
            raise
    return texts


@dataclass
class _Incoming:
    """A transfer under way on a clone rank: where each piece lands, and the receives posted."""

    skeleton: Any
    local: dict[str, Any]
    destination: Destination
    local_arrays: dict[str, torch.Tensor]
    receiving: float
    wants: list[list[list]] = field(default_factory=list)
    requests: list[Any] = field(default_factory=list)

    def deliver(self, into: Stateful | None) -> tuple[dict[str, Any], float]:
        """Once every receive completed: the pieces received apart copied into place, the state
        (loaded into ``into``), and the seconds from the first receive to the last piece in place."""
        arrays = self.destination.arrays()
        transfer_s = time.perf_counter() - self.receiving
        state = unflatten_state(self.skeleton, self.local["skeleton"], {**arrays, **self.local_arrays})
        if into is not None:
            into.load_state_dict(state)
        return state, transfer_s


def _post_receives(
    raw: Any, texts: list[bytearray], sources: list[int], rank: int, into: Stateful | None, stats: CloneTransferStats
) -> _Incoming:
    """Check the sources' metadata against ``into`` and post a receive for every piece this rank
    needs, straight into its destination where it can; which pieces, per source, in ``wants``."""
    metas = [json.loads(t) for t in texts]
    layout, skeleton, local = _agree(metas, sources, rank)
    announced = [[(name, Box(tuple(map(int, o)), tuple(map(int, n)))) for name, o, n in m["pieces"]] for m in metas]
    records = _records(layout, announced)
    destination = Destination(records, skeleton, into, "the source's state", "the clone's state")
    local_arrays = {name: torch.empty(shape, dtype=dtype) for name, dtype, shape in map(_spec, local["layout"])}
    incoming = _Incoming(skeleton, local, destination, local_arrays, time.perf_counter())
    for i, s in enumerate(sources):
        want, buffers = [], []
        for j, (name, box) in enumerate(announced[i]):
            common = destination.needs(name, box)
            if common is None:
                continue
            want.append([j, list(common.offsets), list(common.lengths)])
            buffers.append(destination.landing(name, common))
        if metas[i]["local"] is not None:
            buffers += [local_arrays[name] for name, _, _ in map(_spec, local["layout"])]
        incoming.wants.append(want)
        for buffer in buffers:
            for chunk in _chunks(_bytes_of(buffer.reshape(-1))):
                incoming.requests.append(raw.Irecv(chunk, source=s, tag=TAG_DATA))
                stats.payload_bytes += chunk.nbytes
    return incoming


def _agree(metas: list[dict], sources: list[int], rank: int) -> tuple[list, dict, dict]:
    """The layout, skeleton and this clone's per-rank part, once every source rank agrees on them."""
    for s, meta in zip(sources, metas, strict=True):
        if meta.get("format") != FORMAT:
            raise CloneError(f"source rank {s} speaks clone format {meta.get('format')!r}, this clone {FORMAT}")
        if meta.get("error"):
            raise CloneError(meta["error"])
        if meta["source_ranks"] != sources:
            raise CloneError(
                f"source rank {s} sends with source ranks {meta['source_ranks']}, this clone expects {sources}"
            )
        if rank not in meta["clone_ranks"] or meta["clone_ranks"] != metas[0]["clone_ranks"]:
            raise CloneError(f"source rank {s} sends to clone ranks {meta['clone_ranks']}, not to this rank {rank}")
    first = metas[0]
    for s, meta in zip(sources[1:], metas[1:], strict=True):
        if meta["layout"] != first["layout"]:
            raise CloneError(
                f"source ranks {sources[0]} and {s} hold different state (names, global shapes or dtypes): "
                f"{_first_difference(first['layout'], meta['layout'])}"
            )
        if _digest(meta["skeleton"]) != _digest(first["skeleton"]):
            raise CloneError(f"source ranks {sources[0]} and {s} hold different replicated values (not tensors)")
    index = first["clone_ranks"].index(rank)
    provider = index % len(sources)
    local = metas[provider]["local"]
    if local is None:
        raise CloneError(f"source rank {sources[provider]} did not send this clone's per-rank values")
    return first["layout"], first["skeleton"], local


def _records(layout: list, announced: list[list[tuple[str, Box]]]) -> dict[str, Any]:
    """Every array and the boxes the source ranks send of it; they must tile it exactly once."""
    arrays = {name: (dtype, shape) for name, dtype, shape in map(_spec, layout)}
    try:
        return check_pieces(arrays, announced)
    except ValueError as exc:
        raise CloneError(f"the source ranks' pieces are inconsistent: {exc}") from None


# ------------------------------------------------------------------------------------------ plumbing


def _raw(comm: Any) -> Any:
    """The mpi4py communicator, also out of an :class:`~resilient_flows.checkpoint._comm.MPIComm`."""
    raw = getattr(comm, "_comm", comm)
    if not (hasattr(raw, "Isend") and hasattr(raw, "Improbe")):
        raise TypeError(f"the MPI clone transport needs an mpi4py communicator, got {type(comm).__name__}")
    return raw


def _check_ranks(raw: Any, source_ranks: Sequence[int], clone_ranks: Sequence[int]) -> tuple[list[int], list[int]]:
    size = raw.Get_size()
    sources, clones = [int(r) for r in source_ranks], [int(r) for r in clone_ranks]
    if not sources:
        raise ValueError("source_ranks is empty")
    for name, ranks in (("source_ranks", sources), ("clone_ranks", clones)):
        if len(set(ranks)) != len(ranks) or any(not 0 <= r < size for r in ranks):
            raise ValueError(f"{name} {ranks} must be distinct ranks of a communicator of size {size}")
    if set(sources) & set(clones):
        raise ValueError(f"ranks {sorted(set(sources) & set(clones))} are both source and clone")
    return sources, clones


def _recv_bytes(raw: Any, source: int, tag: int, deadline: float | None, what: str) -> bytearray:
    """One whole message of unknown size, polling instead of busy-waiting (matched probe: thread safe)."""
    from mpi4py import MPI

    status = MPI.Status()
    while (message := raw.Improbe(source=source, tag=tag, status=status)) is None:
        if deadline is not None and time.perf_counter() > deadline:
            raise CloneError(f"timed out waiting for {what}")
        time.sleep(POLL_SECONDS)
    data = bytearray(status.Get_count(MPI.BYTE))
    message.Recv([data, MPI.BYTE])
    return data


def _recv_json(raw: Any, source: int, tag: int, deadline: float | None, what: str) -> dict:
    return json.loads(_recv_bytes(raw, source, tag, deadline, what))


def _message(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


def _chunks(buffer: np.ndarray) -> Iterator[np.ndarray]:
    """Slices of at most CHUNK_BYTES; none for an empty buffer (both sides skip it alike)."""
    for start in range(0, buffer.nbytes, CHUNK_BYTES):
        yield buffer[start : start + CHUNK_BYTES]


def _bytes_of(flat: Any) -> np.ndarray:
    """A uint8 numpy view of a flat contiguous host tensor or array: no copy, any dtype."""
    if isinstance(flat, np.ndarray):
        return flat.view(np.uint8)
    return flat.view(torch.uint8).numpy()


def _state_dict(state: Any) -> Mapping[str, Any]:
    if isinstance(state, Stateful):
        return state.state_dict()
    if isinstance(state, Mapping):
        return state
    raise TypeError(f"cannot clone a {type(state).__name__}: pass a TrainState, a dict, or an object with state_dict()")


def _layout_entry(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> list:
    return [name, str(dtype).removeprefix("torch."), list(shape)]


def _spec(entry: list) -> tuple[str, torch.dtype, tuple[int, ...]]:
    name, dtype_name, shape = entry
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise CloneError(f"{name!r} has dtype {dtype_name!r}, which this PyTorch does not know")
    return name, dtype, tuple(int(n) for n in shape)


def _digest(obj: Any) -> str:
    return hashlib.blake2b(json.dumps(obj, sort_keys=False).encode(), digest_size=16).hexdigest()


def _first_difference(a: list, b: list) -> str:
    for x, y in zip(a, b, strict=False):
        if x != y:
            return f"{x} vs {y}"
    return f"{len(a)} arrays vs {len(b)}"
