"""A member's directory in a run: its spec, and the control channel to it while it runs.

A member's spec file (:attr:`TaskLayout.spec`) registers it (planned ones when the run starts,
clones when they are requested); the runner submits every registered member it has not submitted
yet.

Parsl cannot signal a running task, and a batch job's processes may sit on any node; a file in
the member's directory on the shared file system reaches it wherever it runs. Two requests,
read at step boundaries:

- the control request (:attr:`TaskLayout.control`): stop after committing a checkpoint
  (preemption), consumed by the member; it may also say ``retire``: commit a checkpoint and
  finish now (an exploration campaign replaced the member);
- a clone order (:meth:`TaskLayout.clone_order`): fork into the named clones at the next step
  boundary; the member renames it ``.forking`` while it hands its state over.

Both live in the member's directory itself, so that one ``stat`` of it per step (its mtime
moves when a request file appears) tells the member whether to look; it also looks once a
second, for file systems whose directory times lag behind (NFS attribute caching).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from resilient_flows.errors import DamagedFileError, FileTooLargeError
from resilient_flows.rundir import DamageLog, TaskLayout, member_layout, run_layout
from resilient_flows.training._spec import MemberSpec
from resilient_flows.training._walltime import current_block


def member_dir(run_dir: str | os.PathLike, name: str) -> Path:
    return member_layout(run_dir, name).root


def register_member(run_dir: str | os.PathLike, spec: MemberSpec) -> Path:
    layout = member_layout(run_dir, spec.name)
    layout.write_spec(spec.to_dict())
    return layout.root


def read_spec(run_dir: str | os.PathLike, name: str) -> MemberSpec | None:
    """The registered spec of member ``name``, or None if there is no such member."""
    try:
        return _load_spec(member_layout(run_dir, name))
    except FileNotFoundError:
        return None


def registered_members(
    run_dir: str | os.PathLike, known: dict[Path, MemberSpec] | None = None, damage: DamageLog | None = None
) -> list[MemberSpec]:
    """Every member of a run, planned ones and clones, in the order they were registered.

    A spec is written once, when its member is registered: pass the same ``known`` dict to
    every call of a polling loop and each spec file is parsed once. A damaged spec is
    :class:`~resilient_flows.errors.DamagedFileError`, or with ``damage`` (a view) recorded there
    and its member left out.
    """
    root = run_layout(run_dir).members
    paths = _spec_paths(root, TaskLayout(root).spec.name)
    known = {} if known is None else known
    for path in paths:
        if path in known:
            continue
        try:
            known[path] = _load_spec(TaskLayout(path.parent))
        except (DamagedFileError, FileTooLargeError) as exc:
            if damage is None:
                raise
            damage.file(path, exc.problem if isinstance(exc, DamagedFileError) else str(exc))
    return [known[path] for path in paths if path in known]


def _spec_paths(root: Path, spec_name: str) -> list[Path]:
    """The spec file of every member directory in ``root``, in the order they were written. A
    symbolic link is no member directory (walks of a run directory follow none), but a spec file
    that is one is listed, for its reader to refuse and say so."""
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            path = Path(entry.path, spec_name)
            with contextlib.suppress(FileNotFoundError):
                found.append((path.lstat().st_mtime_ns, entry.name, path))
    return [path for _, _, path in sorted(found)]


def _load_spec(layout: TaskLayout) -> MemberSpec:
    """The spec in ``layout``; one that is JSON but no spec (a field missing or unknown) is damaged too."""
    document = layout.read_spec()
    try:
        return MemberSpec.from_dict(document)
    except (KeyError, TypeError, ValueError) as exc:
        raise DamagedFileError(layout.spec, "member spec", f"not a member spec ({exc})") from None


def count_attempt(directory: Path) -> int:
    """Count one more attempt of the task whose directory this is; which attempt it is (1 for the first)."""
    return TaskLayout(directory).count_attempt()


def has_result(run_dir: str | os.PathLike, name: str) -> bool:
    """Whether member ``name`` finished: its result is written last, durably, once its
    final checkpoint is committed, so whatever its process does afterwards cannot undo that."""
    return member_layout(run_dir, name).has_result()


def latest_committed_step(run_dir: str | os.PathLike, spec: MemberSpec) -> int:
    """The newest step committed in any of the member's tiers; -1 when none is."""
    tiers = [member_layout(run_dir, spec.name).checkpoints]
    tiers += [Path(d) for d in (spec.checkpoint.local_dir, spec.checkpoint.memory_dir) if d is not None]
    return newest_committed(tiers)


def newest_committed(directories: list[Path]) -> int:
    """The newest step committed in any of these checkpoint directories; -1 when none is."""
    from resilient_flows.checkpoint import Tier  # imports torch: not for the command line's status

    return max(
        (s for path in directories if path.is_dir() for s in Tier(path, "any").committed_steps()[:1]), default=-1
    )


def request_preemption(
    run_dir: str | os.PathLike, name: str, reason: str = "preemption requested", block: str | None = None
) -> Path:
    """Ask a running member to commit a checkpoint and stop after its current step.

    The member consumes the request and raises ``Preempted``; the retry handler requeues it
    without spending a retry. ``block``: only its attempt on that Parsl block is asked (the
    block's drain), never a later one on a fresh block.
    """
    return member_layout(run_dir, name).write_control("preempt", reason, block)


def request_retirement(run_dir: str | os.PathLike, name: str, reason: str) -> Path:
    """Ask a running member to commit a checkpoint and finish now, for good (an exploration
    campaign replaced it); unlike a preemption, nothing requeues it."""
    return member_layout(run_dir, name).write_control("retire", reason)


def read_stop_request(directory: Path) -> tuple[str, str] | None:
    """A pending ``(action, reason)``: ``preempt`` (stop, to be requeued) or ``retire`` (finish)."""
    try:
        request = TaskLayout(directory).read_control()
    except (OSError, ValueError):
        return None  # absent, being written (read again after the next step), or oversized: no request
    if not isinstance(request, dict) or request.get("block", current_block()) != current_block():
        return None  # meant for its attempt on a block it is no longer on
    if request.get("action") in ("preempt", "retire"):
        return str(request["action"]), str(request.get("reason", f"{request['action']} requested"))
    return None


@dataclass(frozen=True)
class CloneOrder:
    """Fork into ``clones`` (member names already registered in the run directory).

    ``at_step``: fork with the state after this step (or at the next step boundary if the member
    is already past it); None for the next step boundary.
    """

    request: str
    clones: tuple[str, ...]
    requested_at: float
    at_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CloneOrder:
        at_step = data.get("at_step")
        return cls(
            str(data["request"]),
            tuple(str(c) for c in data["clones"]),
            float(data["requested_at"]),
            None if at_step is None else int(at_step),
        )


def clone_order_path(directory: Path, request: str, suffix: str = ".json") -> Path:
    """Where an order for ``request`` lies in a member's directory (``.forking`` once being served)."""
    return TaskLayout(directory).clone_order(request, suffix)


def write_clone_order(run_dir: str | os.PathLike, source: str, order: CloneOrder) -> Path:
    return member_layout(run_dir, source).write_clone_order(order.request, order.to_dict())


def read_clone_orders(directory: Path) -> list[CloneOrder]:
    """Pending orders, oldest first; the member marks an order ``.forking`` when it serves it."""
    found = []
    layout = TaskLayout(directory)
    for path in layout.clone_orders():
        try:
            found.append(CloneOrder.from_dict(layout.read_clone_order(path)))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or oversized: no order
    return sorted(found, key=lambda o: o.requested_at)


class RequestWatch:
    """Tells a member, cheaply at every step, whether its directory may hold a new request.

    A request shows as a change of the directory's mtime; ``stat`` looks at most every
    ``STAT_GAP_S`` (a few microseconds a step matter on sub-millisecond steps, 20 ms of latency
    do not), and every ``FULL_LOOK_S`` the member reads its requests whatever the mtime says.
    """

    STAT_GAP_S = 0.02
    FULL_LOOK_S = 1.0

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._mtime = -1
        self._looked = 0.0
        self._statted = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._statted < self.STAT_GAP_S:
            return False
        self._statted = now
        try:
            mtime = os.stat(self.directory).st_mtime_ns
        except FileNotFoundError:
            return False
        if mtime != self._mtime or now - self._looked >= self.FULL_LOOK_S:
            self._mtime, self._looked = mtime, now
            return True
        return False
