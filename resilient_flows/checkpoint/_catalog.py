"""Find, open and verify committed checkpoints without a Checkpointer (the CLI's view).

Listing imports no torch (it reads manifests as plain JSON, see
:mod:`~resilient_flows.checkpoint._summary`): ``checkpoints list`` answers at once. Only
verifying, which reads the data, imports the reader.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG

from resilient_flows.checkpoint._summary import read_summary
from resilient_flows.checkpoint._tiers import Tier, shard_path
from resilient_flows.errors import CheckpointError, CorruptCheckpointError


@dataclass(frozen=True)
class CheckpointInfo:
    """One committed checkpoint; ``problem`` is None when it verified (or was not verified)."""

    tier: Path
    step: int
    created: float | None
    nbytes: int | None
    world_size: int | None
    problem: str | None

    @property
    def valid(self) -> bool:
        return self.problem is None


def find_tiers(path: str | os.PathLike, max_depth: int = 4) -> list[Tier]:
    """``path`` itself if it holds step directories, else every such directory below it."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    found = []
    frontier = [(root, 0)]
    while frontier:
        directory, depth = frontier.pop()
        tier = Tier(directory, directory.name)
        if tier.step_dirs() or (directory / "latest").is_file():
            found.append(tier)
        elif depth < max_depth:
            frontier += [(d, depth + 1) for d in directory.iterdir() if d.is_dir() and not d.is_symlink()]
    return sorted(found, key=lambda t: str(t.path))


def _check_sizes(step_dir: Path, shard_bytes: Mapping[str, int]) -> None:
    for name, nbytes in shard_bytes.items():
        try:
            found = shard_path(step_dir, name).stat()
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{name} is missing") from None
        except OSError as exc:  # a link in a loop
            raise CorruptCheckpointError(f"{name}: cannot read it ({exc.strerror})") from None
        size = found.st_size
        if not S_ISREG(found.st_mode):
            raise CorruptCheckpointError(f"{name} is not a regular file")
        if size != nbytes:
            raise CorruptCheckpointError(f"{name} has {size} bytes, the manifest says {nbytes}")


def scan(path: str | os.PathLike, verify: bool = True) -> list[CheckpointInfo]:
    """Every committed checkpoint in the tiers at or below ``path``, newest first per tier.

    ``verify`` reads every shard and checks its checksum; without it only the manifest and the
    shard sizes are checked, which is instant even for terabytes, and torch is not imported.
    """
    infos = []
    for tier in find_tiers(path):
        for step in tier.committed_steps():
            infos.append(_verified(tier, step) if verify else _listed(tier, step))
    return infos


def _listed(tier: Tier, step: int) -> CheckpointInfo:
    step_dir = tier.step_dir(step)
    try:
        summary = read_summary(step_dir)
    except CorruptCheckpointError as exc:
        return CheckpointInfo(tier.path, step, None, None, None, str(exc))
    try:
        _check_sizes(step_dir, summary.shard_bytes)
    except CorruptCheckpointError as exc:
        problem: str | None = str(exc)
    else:
        problem = None
    return CheckpointInfo(tier.path, step, summary.created, summary.nbytes, summary.world_size, problem)


def _verified(tier: Tier, step: int) -> CheckpointInfo:
    from resilient_flows.checkpoint._reader import OpenCheckpoint  # torch: only to read the data

    manifest = None
    try:
        with OpenCheckpoint(tier.step_dir(step), step) as opened:
            manifest = opened.manifest
            opened.verify_all()
    except CorruptCheckpointError as exc:
        problem: str | None = str(exc)
    else:
        problem = None
    if manifest is None:
        return CheckpointInfo(tier.path, step, None, None, None, problem)
    return CheckpointInfo(tier.path, step, manifest.created, manifest.nbytes, manifest.world_size, problem)


def find_tier(path: str | os.PathLike) -> Tier:
    """The one tier at or below ``path``: ``path`` itself if it holds step directories, else the
    single tier below it; CheckpointError naming them when there are several, or none."""
    tiers = find_tiers(path)
    if len(tiers) == 1:
        return tiers[0]
    if not tiers:
        raise CheckpointError(f"no checkpoints in {path} or below it")
    shown = ", ".join(str(t.path) for t in tiers)
    raise CheckpointError(f"{path} holds {len(tiers)} checkpoint directories: {shown}; name one of them")
