"""One exception hierarchy for the whole project.

The CLI turns any :class:`ResilientFlowsError` into a single line and a non-zero exit; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os

__all__ = [
    "CheckpointError",
    "CloneError",
    "CorruptCheckpointError",
    "FileTooLargeError",
    "InvalidJobError",
    "LaunchError",
    "Preempted",
    "ResilientFlowsError",
    "SiteConfigError",
    "StateMismatchError",
    "StorageFullError",
    "WorkflowError",
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


class CheckpointError(ResilientFlowsError):
    """A checkpoint could not be written, committed or restored."""


class StorageFullError(CheckpointError):
    """A checkpoint failed because its file system was full or over quota: a condition that
    passes (a purge, another job finishing), unlike a corrupt state or a bug."""


#: How the C library words the errors of a full file system, as they appear in messages.
_FULL = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


def is_storage_full(error: BaseException | str) -> bool:
    """Whether ``error`` (an exception, or a failure's message as ranks agreed on it) is a full
    file system or quota. Messages are compared, not exception types, so that every rank of a
    job decides the same from the same agreed text."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(error, StorageFullError):
        return True
    return any(text in str(error) for text in _FULL)


class CorruptCheckpointError(CheckpointError):
    """A committed checkpoint failed verification (checksum, size, manifest)."""


class StateMismatchError(CheckpointError):
    """The state to restore into does not have the keys, shapes or dtypes of the checkpoint."""


class SiteConfigError(ResilientFlowsError):
    """A site configuration names an unknown class, key or value; the message says which and where."""


class WorkflowError(ResilientFlowsError):
    """A workflow file or run directory is not usable; the message names the file, line and key."""


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


def _bytes(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 and size % (1 << 20) == 0 else f"{size} bytes"


class InvalidJobError(ResilientFlowsError, ValueError):
    """A co-scheduling input (running job, request, trace line, policy argument) is not valid.

    The message names the field. It is also a ``ValueError``, which is what callers of a plain
    function expect from a bad argument.
    """
