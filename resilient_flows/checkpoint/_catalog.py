"""Find, open and verify committed checkpoints without a Checkpointer (the CLI's view)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from resilient_flows.checkpoint._manifest import Manifest, read_manifest
from resilient_flows.checkpoint._reader import OpenCheckpoint
from resilient_flows.checkpoint._tiers import Tier, shard_path
from resilient_flows.errors import CorruptCheckpointError


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


def _check_sizes(step_dir: Path, manifest: Manifest) -> None:
    for record in manifest.shards:
        try:
            size = shard_path(step_dir, record.file).stat().st_size
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{record.file} is missing") from None
        if size != record.nbytes:
            raise CorruptCheckpointError(f"{record.file} has {size} bytes, the manifest says {record.nbytes}")


def scan(path: str | os.PathLike, verify: bool = True) -> list[CheckpointInfo]:
    """Every committed checkpoint in the tiers at or below ``path``, newest first per tier.

    ``verify`` reads every shard and checks its checksum; without it only the manifest and the
    shard sizes are checked, which is instant even for terabytes.
    """
    infos = []
    for tier in find_tiers(path):
        for step in tier.committed_steps():
            step_dir = tier.step_dir(step)
            manifest, problem = None, None
            try:
                if verify:
                    with OpenCheckpoint(step_dir, step) as opened:
                        manifest = opened.manifest
                        opened.verify_all()
                else:
                    manifest = read_manifest(step_dir)
                    _check_sizes(step_dir, manifest)
            except CorruptCheckpointError as exc:
                problem = str(exc)
            infos.append(
                CheckpointInfo(
                    tier=tier.path,
                    step=step,
                    created=manifest.created if manifest else None,
                    nbytes=manifest.nbytes if manifest else None,
                    world_size=manifest.world_size if manifest else None,
                    problem=problem,
                )
            )
    return infos
