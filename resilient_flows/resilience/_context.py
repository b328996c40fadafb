"""Checkpointed loops over arrays: the Kokkos Resilience idea on our checkpoint engine.

A simulation loop should not have to say what its state is. ``ctx.checkpoint(label, i, fn)``
runs one iteration, finds the arrays ``fn`` works on (see :mod:`resilient_flows.resilience._capture`)
and, when the filter says so, saves them as the state after iteration ``i``. After a restart the
same call at the restart point copies the saved values back into those arrays, in place, and
skips the iteration; the loop carries on as if it had never stopped.

Each label has its own :class:`~resilient_flows.checkpoint.Checkpointer` in ``<directory>/<label>``,
so labels checkpoint on their own schedule, and their checkpoints are ordinary engine checkpoints
(``resilient-flows checkpoints list <directory>/<label>`` shows them).
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from resilient_flows.checkpoint import RANK_LOCAL, Checkpointer, CheckpointStats, TierSpec, read_manifest
from resilient_flows.checkpoint._config import check_tiers
from resilient_flows.errors import CheckpointError, StateMismatchError
from resilient_flows.resilience._capture import Array, find_arrays

logger = logging.getLogger(__name__)

#: Decides, after iteration ``i`` of ``label`` ran, whether to checkpoint it: ``filter(label, i)``.
Filter = Callable[[str, int], bool]

_LABEL = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass
class Every:
    """Checkpoint every ``n`` iterations or every ``seconds``; made by :func:`every`."""

    n: int | None = None
    seconds: float | None = None
    _last: dict[str, float] = field(default_factory=dict, repr=False)

    def __call__(self, label: str, i: int) -> bool:
        if self.n is not None:
            return (i + 1) % self.n == 0
        now = time.monotonic()
        last = self._last.setdefault(label, now)
        if self.seconds is not None and now - last >= self.seconds:
            self._last[label] = now
            return True
        return False


def every(n: int | None = None, *, seconds: float | None = None) -> Every:
    """A filter that checkpoints every ``n`` iterations, or every ``seconds`` of wall time.

    Parameters
    ----------
    n:
        Checkpoint after iteration ``i`` when ``(i + 1) % n == 0``: ``every(10)`` saves after
        iterations 9, 19, 29, ...
    seconds:
        Checkpoint a label when at least this many seconds have passed since its last checkpoint
        (or since its first iteration in this process).

    Raises
    ------
    ValueError
        Unless exactly one of ``n`` (an integer >= 1) and ``seconds`` (a finite number > 0) is given.
    """
    if (n is None) == (seconds is None):
        raise ValueError("every() needs exactly one of n (iterations) and seconds")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1):
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0
    ):
        raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
    return Every(n=None if n is None else int(n), seconds=None if seconds is None else float(seconds))


@dataclass
class _Label:
    checkpointer: Checkpointer
    restart: int  # newest committed iteration when the label was opened; -1 when none
    restored: bool = False
    prepared: bool = False
    specs: dict[str, tuple[tuple[int, ...], str]] | None = None


class _Arrays:
    """The arrays of one label as a Stateful whose ``load_state_dict`` copies in place."""

    def __init__(self, arrays: dict[str, Array], per_rank: bool) -> None:
        self.arrays = arrays
        self.per_rank = per_rank

    def state_dict(self) -> dict[str, Any]:
        return {RANK_LOCAL: dict(self.arrays)} if self.per_rank else dict(self.arrays)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        loaded = state_dict.get(RANK_LOCAL, {}) if self.per_rank else state_dict
        missing = sorted(set(self.arrays) - set(loaded))
        extra = sorted(set(loaded) - set(self.arrays))
        if missing or extra:
            raise StateMismatchError(
                f"the checkpoint lacks {missing} and has {extra} (arrays found in the loop body now)"
            )
        for name, live in self.arrays.items():
            saved = loaded[name]
            if tuple(saved.shape) != tuple(live.shape) or _torch_dtype(saved) != _torch_dtype(live):
                raise StateMismatchError(
                    f"{name!r} is {list(saved.shape)} {_torch_dtype(saved)} in the checkpoint "
                    f"but {list(live.shape)} {_torch_dtype(live)} now"
                )
        for name, live in self.arrays.items():
            _copy_into(live, loaded[name])


class Context:
    """Checkpointed loops: find, save and restore the arrays each iteration works on.

    Parameters
    ----------
    tiers:
        Root of this context's checkpoints, one directory or a list of tiers fastest first (as a
        :class:`~resilient_flows.checkpoint.Checkpointer` takes them: a path or a
        :class:`~resilient_flows.checkpoint.TierSpec` each); label ``x`` checkpoints in
        ``<tier>/x`` of each.
    filter:
        ``filter(label, i) -> bool`` decides after iteration ``i`` ran whether to checkpoint it.
        Default: :func:`every` ``(1)``, every iteration. Use ``every(10)`` or ``every(seconds=60)``.
    keep:
        Committed checkpoints kept per label and tier.
    comm:
        An ``mpi4py`` communicator or ``torch.distributed`` group. With it, every rank saves its
        own arrays (they are stored per rank, as for a domain decomposition, not sharded as
        replicated state), and all ranks must call ``checkpoint`` for the same iterations. A
        restart must use as many ranks as the save did (a different count is a
        :class:`~resilient_flows.errors.StateMismatchError`).

    Notes
    -----
    Arrays are found by following what the loop body captures (closures, default arguments,
    bound methods' instances, callable objects, user objects, lists, tuples and dicts), never
    through globals: register module-level arrays with :meth:`register`. Python scalars the loop
    rebinds (``t += dt``) cannot be restored in place; keep them in a 0-d array
    (``t = np.zeros(())``, ``t[...] += dt``) and capture or register it.

    Discovery runs again for every checkpoint and restore (after ``fn`` returns, so a rebound
    closure variable is seen), never for iterations the filter does not save. The names found
    must stay the same for a label, in this process and after a restart; a changed name set,
    shape or dtype raises :class:`~resilient_flows.errors.StateMismatchError` naming the array.
    """

    def __init__(
        self,
        tiers: str | os.PathLike | Sequence[TierSpec | str | os.PathLike],
        *,
        filter: Filter | None = None,
        keep: int = 3,
        comm: Any = None,
    ) -> None:
        if filter is not None and not callable(filter):
            raise ValueError(f"filter must be callable as filter(label, i), got {filter!r}")
        self.tiers = check_tiers(tiers)
        self.directory = Path(self.tiers[-1].path)
        self.filter: Filter = filter if filter is not None else every(1)
        self.keep = keep
        self.comm = comm
        self._labels: dict[str, _Label] = {}
        self._registered: dict[str | None, dict[str, Array]] = {}
        self._excluded: dict[int, Any] = {}
        self._closed = False

    # ------------------------------------------------------------ what is saved

    def register(self, name: str, array: Array, *, label: str | None = None) -> None:
        """Save ``array`` under ``name`` with every label (or only ``label``).

        For state the loop body reaches in ways inspection does not follow (globals, ``__slots__``,
        C extension objects) and for scalars kept in 0-d arrays. Register before the label's first
        checkpoint: the set of names of a label must not change. A registered name wins over a
        discovered one.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if not isinstance(array, np.ndarray | torch.Tensor):
            raise ValueError(f"array must be a numpy array or torch tensor, got {type(array).__name__}")
        self._registered.setdefault(label, {})[name] = array

    def exclude(self, array: Array) -> None:
        """Never save ``array`` (scratch buffers, read-only inputs), however it is reached."""
        self._excluded[id(array)] = array

    def arrays(self, label: str, fn: Callable[..., Any]) -> dict[str, Array]:
        """The arrays ``checkpoint(label, i, fn)`` would save now, by name."""
        found = {**self._registered.get(None, {}), **self._registered.get(label, {})}
        skip = [*self._excluded.values(), *found.values(), self]
        found.update(find_arrays(fn, skip=skip, opaque=(Context, Checkpointer)))
        if RANK_LOCAL in found:
            raise StateMismatchError(f"{RANK_LOCAL!r} is reserved by the checkpoint engine: rename that variable")
        return {name: array for name, array in found.items() if id(array) not in self._excluded}

    # ------------------------------------------------------------------ the loop

    def latest_version(self, label: str) -> int:
        """The newest iteration of ``label`` with a committed checkpoint; -1 when there is none."""
        return self._label(label).restart

    def checkpoint(self, label: str, i: int, fn: Callable[[], Any]) -> Any:
        """Run iteration ``i`` of ``label`` and checkpoint it when the filter says so.

        When ``i`` is the restart point (``latest_version(label)`` when the label was first used
        in this process), the arrays ``fn`` uses are restored in place from that checkpoint and
        ``fn`` is skipped. When the loop starts after the restart point, the restore happens
        before the first iteration runs. Iterations before the restart point run but are not
        saved: their effect is overwritten when the restart point is reached.

        Returns
        -------
        Whatever ``fn`` returned, or None when it was skipped.
        """
        self._check_open()
        if isinstance(i, bool) or not isinstance(i, int | np.integer) or i < 0:
            raise ValueError(f"i must be a non-negative integer, got {i!r}")
        i = int(i)
        state = self._label(label)
        if state.restart >= 0 and not state.restored and i >= state.restart:
            self._restore(label, state, fn)
            if i == state.restart:
                return None
        if not state.prepared and i > state.restart:  # the host buffers fill in while the loop runs
            state.prepared = True
            state.checkpointer.prepare(_Arrays(self.arrays(label, fn), self._per_rank).state_dict())
        result = fn()
        if i > state.restart and self.filter(label, i):
            arrays = self.arrays(label, fn)
            self._check_same(label, state, arrays)
            state.checkpointer.save(i, _Arrays(arrays, self._per_rank).state_dict())
        return result

    def iterations(self, label: str, n: int) -> Iterator[int]:
        """The iterations of ``range(n)`` still to do: those after ``latest_version(label)``.

        The loop body must call ``checkpoint(label, i, fn)``; its first call restores the arrays
        ``fn`` uses from the restart point before running iteration ``i``::

            for i in ctx.iterations("heat", steps):
                ctx.checkpoint("heat", i, lambda: step(u, v))
        """
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        yield from range(self.latest_version(label) + 1, int(n))

    def restore(self, label: str, fn: Callable[..., Any]) -> int:
        """Restore the arrays ``fn`` uses from the restart point now; that iteration, or -1."""
        state = self._label(label)
        if state.restart >= 0 and not state.restored:
            self._restore(label, state, fn)
        return state.restart

    def stats(self, label: str) -> CheckpointStats:
        """What checkpointing ``label`` has cost so far: stalls, backpressure waits, bytes, arenas."""
        return self._label(label).checkpointer.stats

    # ----------------------------------------------------------------- lifecycle

    def wait(self) -> None:
        """Block until every checkpoint of every label is committed."""
        for state in self._labels.values():
            state.checkpointer.wait()

    def close(self) -> None:
        """Wait for pending checkpoints and close every label's Checkpointer. Idempotent."""
        if self._closed:
            return
        self._closed = True
        problems = []
        for state in self._labels.values():
            try:
                state.checkpointer.close()
            except CheckpointError as exc:
                problems.append(str(exc))
        if problems:
            raise CheckpointError("; ".join(problems))

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    @property
    def _per_rank(self) -> bool:
        return self.comm is not None

    def _label(self, label: str) -> _Label:
        self._check_open()
        state = self._labels.get(label)
        if state is None:
            if not isinstance(label, str) or not _LABEL.fullmatch(label) or label in (".", ".."):
                raise ValueError(f"label must be a directory name of letters, digits, '_', '.', '-', got {label!r}")
            tiers = [replace(tier, path=Path(tier.path) / label) for tier in self.tiers]
            checkpointer = Checkpointer(tiers, keep=self.keep, comm=self.comm)
            latest = checkpointer.latest_step()
            state = self._labels[label] = _Label(checkpointer, -1 if latest is None else latest)
        return state

    def _restore(self, label: str, state: _Label, fn: Callable[..., Any]) -> None:
        arrays = self.arrays(label, fn)
        self._check_same(label, state, arrays)
        if self._per_rank:
            self._check_world(label, state)
        state.checkpointer.restore(_Arrays(arrays, self._per_rank), step=state.restart)
        state.restored = True
        logger.info("%s: restored iteration %d (%d arrays)", label, state.restart, len(arrays))

    def _check_world(self, label: str, state: _Label) -> None:
        """Per-rank arrays are each rank's own piece of the problem: only the same ranks can take them back."""
        checkpointer = state.checkpointer
        for tier in checkpointer.tiers:
            try:
                saved = read_manifest(tier.step_dir(state.restart)).world_size
            except (OSError, ValueError):
                continue  # absent or damaged here: restore looks at it and falls back on its own
            if saved != checkpointer.world_size:
                raise StateMismatchError(
                    f"label {label!r}: iteration {state.restart} was saved by {saved} ranks, each with its own "
                    f"arrays; restart it on {saved} ranks, not {checkpointer.world_size}"
                )
            return

    def _check_same(self, label: str, state: _Label, arrays: dict[str, Array]) -> None:
        specs = {name: (tuple(a.shape), str(a.dtype)) for name, a in arrays.items()}
        if state.specs is None:
            state.specs = specs
            return
        if specs == state.specs:
            return
        missing, new = sorted(set(state.specs) - set(specs)), sorted(set(specs) - set(state.specs))
        if missing or new:
            raise StateMismatchError(
                f"label {label!r}: the loop body's arrays changed: {missing} no longer found, {new} new"
            )
        name = next(n for n in specs if specs[n] != state.specs[n])
        (was_shape, was_dtype), (shape, dtype) = state.specs[name], specs[name]
        raise StateMismatchError(
            f"label {label!r}: {name!r} was {list(was_shape)} {was_dtype} and is now {list(shape)} {dtype}"
        )

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this resilience Context is closed")


def _torch_dtype(array: Any) -> torch.dtype:
    if isinstance(array, torch.Tensor):
        return array.dtype
    return torch.from_numpy(np.empty(0, dtype=array.dtype)).dtype


def _copy_into(live: Array, saved: Any) -> None:
    """Copy ``saved`` into ``live`` keeping ``live``'s identity (and its device)."""
    if saved is live:
        return
    if isinstance(live, np.ndarray):
        live[...] = saved.numpy() if isinstance(saved, torch.Tensor) else saved
        return
    source = torch.from_numpy(saved) if isinstance(saved, np.ndarray) else saved
    with torch.no_grad():
        live.copy_(source.to(live.device))
