"""One exception hierarchy for the whole project.

The CLI turns any :class:`ResilientFlowsError` into a single line and a non-zero exit; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, replace

__all__ = [
    "INFRASTRUCTURE",
    "PERMANENT",
    "STORAGE_FULL",
    "CheckpointConfigError",
    "CheckpointError",
    "CloneError",
    "CorruptCheckpointError",
    "DamagedFileError",
    "Failure",
    "FileTooLargeError",
    "InvalidJobError",
    "LaunchError",
    "ParamsError",
    "PeerTransferError",
    "PermanentError",
    "Preempted",
    "ResilientFlowsError",
    "SiteConfigError",
    "StateMismatchError",
    "StorageFullError",
    "Superseded",
    "UnsupportedParslError",
    "WorkflowError",
    "WorkloadError",
    "is_permanent",
    "is_storage_full",
]


class ResilientFlowsError(Exception):
    """Root of every error this library raises on purpose."""


class Preempted(ResilientFlowsError):
    """A member stopped on request after committing a checkpoint of ``step``; resubmit to continue.

    It lives here, not beside :class:`~resilient_flows.training.TrainContext`, because the runner's
    retry handler tests for it and must not import torch to do so."""

    def __init__(self, member: str, step: int, reason: str) -> None:
        super().__init__(member, step, reason)
        self.member, self.step, self.reason = member, step, reason

    def __str__(self) -> str:
        return f"member {self.member} preempted ({self.reason}) after committing step {self.step}"


class Superseded(ResilientFlowsError):
    """A task of a runner that another runner has taken the run over from (a ``resume``) refused
    to start: the new runner runs, or has adopted, that member's attempts, and two attempts of one
    member must never write at once (see :func:`resilient_flows.rundir.superseded`)."""


class CheckpointError(ResilientFlowsError):
    """A checkpoint could not be written, committed or restored; ``failures``: what failed, as recorded."""

    def __init__(self, *args: object, failures: tuple[Failure, ...] = ()) -> None:
        super().__init__(*args)
        self.failures = failures


class StorageFullError(CheckpointError):
    """A checkpoint failed because its file system was full or over quota: a condition that
    passes (a purge, another job finishing), unlike a corrupt state or a bug."""


#: The errno values of a full file system or an exhausted quota.
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_storage_full(error: BaseException) -> bool:
    """Whether ``error`` is a full file system or quota: by its type or errno, never by its text."""
    if isinstance(error, StorageFullError):
        return True
    return isinstance(error, OSError) and error.errno in _FULL_ERRNOS


class PermanentError(ResilientFlowsError):
    """A failure that no retry can fix: the next attempt would meet it the same way (a workload
    its worker cannot import, a parameter its function does not take, a program that is not
    there). The retry handler fails the member at once instead of spending its retries on it."""


class CheckpointConfigError(PermanentError, ValueError):
    """A checkpoint configuration (a :class:`~resilient_flows.checkpoint.CheckpointConfig`, a
    ``Checkpointer``'s tiers, or the run contract's copy of them) is not usable: an unknown tier
    option, a cadence below 1, two tiers in one directory. The message names the field.

    No retry can fix it; it is also a ``ValueError``, what callers of a constructor expect."""


class ParamsError(PermanentError, ValueError):
    """A member's or stage's parameters do not fit its function: one it does not take, one it needs
    and was not given, a value of the wrong kind. The message names the parameter and the function.

    It is also a ``ValueError``, which is what callers of a plain function expect from a bad argument.
    """


def is_permanent(error: BaseException) -> bool:
    """Whether no retry can fix ``error``: a :class:`PermanentError`, or a module that cannot be
    imported or compiled (``ImportError``, ``SyntaxError``): by its type, never by its text."""
    return isinstance(error, PermanentError | ImportError | SyntaxError)


@dataclass(frozen=True)
class Failure:
    """A failure as it travels from where it happened (a rank's writer thread, a collective) to
    where it is judged (the engine, the step boundary, the retry handler).

    Its ``kind`` is decided once, from the exception, where the errno is still at hand:
    ``"storage-full"`` (ENOSPC, EDQUOT), ``"permanent"`` (no retry can fix it, see
    :func:`is_permanent`), ``"io"`` (any other OSError), ``"mismatch"`` (ranks disagree on the
    state) or ``"error"``. Ranks exchange it as it is, so that each judges the same kind from the
    same record.
    """

    kind: str
    message: str
    errno: int | None = None

    @classmethod
    def of(cls, exc: BaseException, doing: str) -> Failure:
        """The failure ``exc`` while ``doing`` (``"writing X failed"``)."""
        code = exc.errno if isinstance(exc, OSError) else None
        if is_storage_full(exc):
            kind = STORAGE_FULL
        else:
            kind = PERMANENT if is_permanent(exc) else "io" if isinstance(exc, OSError) else "error"
        return cls(kind, f"{doing}: {exc}", code)

    def within(self, context: str) -> Failure:
        """The same failure, said of the larger operation ``context`` it broke."""
        return replace(self, message=f"{context}: {self.message}")

    def __str__(self) -> str:
        return self.message


#: :attr:`Failure.kind` of a full file system or quota.
STORAGE_FULL = "storage-full"
#: :attr:`Failure.kind` of an error that no retry can fix.
PERMANENT = "permanent"
#: :attr:`Failure.kind` of the machine's fault, not the member's: a lost node, worker pool, manager or peer rank.
INFRASTRUCTURE = "infrastructure"


class CorruptCheckpointError(CheckpointError):
    """A committed checkpoint failed verification (checksum, size, manifest)."""


class PeerTransferError(CheckpointError):
    """A checkpoint's copy could not be sent to, or fetched from, another node's transfer service:
    refused (authentication, size, path, checksum) or the service unreachable. The checkpoint
    itself stands; only that extra copy is missing."""


class StateMismatchError(CheckpointError):
    """The state to restore into does not have the keys, shapes or dtypes of the checkpoint."""


class SiteConfigError(ResilientFlowsError):
    """A site configuration names an unknown class, key or value; the message says which and where."""


class UnsupportedParslError(ResilientFlowsError):
    """The installed Parsl is not one whose internals resilient-flows knows (see
    :mod:`resilient_flows.sites._parsl`): it would fail deep in a run, or run differently."""


class WorkflowError(ResilientFlowsError):
    """A workflow file or run directory is not usable; the message names the file, line and key."""


class WorkloadError(WorkflowError, PermanentError):
    """A member's function cannot run as written: its module does not import, it has no such
    function, or its params are not what the function declares.

    No retry can fix it, so ``validate`` and ``run`` look for it before anything is queued, and a
    member raises it before it trains (see :mod:`resilient_flows.training._params`).
    """


class LaunchError(ResilientFlowsError):
    """A multi-rank member cannot form its process group or train across it.

    Its launcher's environment is incomplete (the message names the missing variable), it was
    started with another number of processes than it asks for, or its model cannot be wrapped for
    its ``parallel`` mode (the message names the member and the workload).
    """


class CloneError(ResilientFlowsError):
    """A clone request names a missing or finished member, or an override a clone cannot apply."""


class FileTooLargeError(ResilientFlowsError, ValueError):
    """A run- or checkpoint-directory file is larger than the cap of its kind, so it was not read.

    It is also a ``ValueError``: readers that pass over a file being rewritten or not valid JSON
    (a control request, a heartbeat) pass over an oversized one the same way.
    """

    def __init__(self, path: str | os.PathLike, cap: int, what: str) -> None:
        super().__init__(path, cap, what)
        self.path, self.cap, self.what = os.fspath(path), cap, what

    def __str__(self) -> str:
        return f"{self.what} {self.path} is larger than its cap of {_bytes(self.cap)}; not reading it"


class DamagedFileError(ResilientFlowsError, ValueError):
    """A run-directory file holds something its writer never writes: not JSON, or not the document
    of its kind (a crash of the node, a full disk, an edit by hand).

    Views pass over it and say so; it is also a ``ValueError``, so that readers that pass over a
    file being rewritten pass over a damaged one the same way.
    """

    def __init__(self, path: str | os.PathLike, what: str, problem: str) -> None:
        super().__init__(path, what, problem)
        self.path, self.what, self.problem = os.fspath(path), what, problem

    def __str__(self) -> str:
        return f"{self.what} {self.path} is {self.problem}"


def _bytes(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 and size % (1 << 20) == 0 else f"{size} bytes"


class InvalidJobError(ResilientFlowsError, ValueError):
    """A co-scheduling input (running job, request, trace line, policy argument) is not valid.

    The message names the field. It is also a ``ValueError``, which is what callers of a plain
    function expect from a bad argument.
    """
