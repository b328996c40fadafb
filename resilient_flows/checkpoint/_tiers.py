"""A storage tier: one directory of step checkpoints, its debris, its retention, its ``latest``.

Nothing here imports torch: the runner reads tiers to judge a member's progress.

A job writes to an ordered list of tiers: node-local ones (fast, lost with the node: ``/dev/shm``,
a local SSD) and, last, a shared one (slow, survives the job). The engine commits in the first and
flushes on from tier to tier in the background; this module only knows what lies in one directory.

Several ranks of one node share a node-local directory, and a rank's background flush may still
read a shard there while a sibling rank prunes; so pruning a local tier removes only this rank's
own shards, and the last rank out removes the directory.

A tier may also be written from outside: a source member hands a clone its checkpoint by adopting
it into the clone's tier (:meth:`Tier.adopt`), while the clone may be starting and cleaning that
tier. What an outside writer leaves at the top of a tier is named after its host and process, so
that the cleaning leaves it be while that writer may still run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import time
from pathlib import Path

from resilient_flows.durable import fsync_dir
from resilient_flows.errors import CorruptCheckpointError
from resilient_flows.procgroup import process_runs

#: A step directory's manifest, renamed into place last: its presence commits the step.
MANIFEST = "manifest.json"

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d{8,})$")
#: An adopt's staging directory or a ``latest`` being replaced, named after its writer.
_WRITTEN_BY = re.compile(r"^(?:\.adopt-\d+-|latest\.)(?P<host>.+)\.(?P<pid>\d+)(?:\.tmp)?$")

#: How long the cleaning leaves what a writer on another host left in a tier: this host cannot
#: tell whether that writer still runs, and an adopt takes seconds.
FOREIGN_WRITER_S = 600.0


def step_dirname(step: int) -> str:
    return f"step-{step:08d}"


def shard_filename(rank: int, world_size: int) -> str:
    return f"shard-{rank:05d}-of-{world_size:05d}.safetensors"


def shard_path(step_dir: Path, name: str) -> Path:
    """Where the shard file ``name`` (a name a parsed manifest holds) of ``step_dir`` is.

    A parsed manifest's names have no directory part, so the one way left out of the step
    directory is a symbolic link: one that leads out is refused with CorruptCheckpointError, as
    it may lead to any file on the machine, which restore and export must not read as a shard.
    """
    path = step_dir / name
    if path.is_symlink():
        target = path.resolve()
        if not target.is_relative_to(step_dir.resolve()):
            raise CorruptCheckpointError(
                f"{step_dir.name}/{name} is a symbolic link out of its step directory, to {target}"
            )
    return path


class Tier:
    """One checkpoint directory. ``name`` is how users see it: ``"local"`` (the first node-local
    tier), ``"local-<index>"`` (later ones), ``"shared"``, or what a :class:`TierSpec` named it."""

    def __init__(self, path: str | os.PathLike, name: str) -> None:
        self.path = Path(path)
        self.name = name

    def __repr__(self) -> str:
        return f"Tier({self.name}: {self.path})"

    def step_dir(self, step: int) -> Path:
        return self.path / step_dirname(step)

    def step_dirs(self) -> dict[int, Path]:
        """Every step directory, committed or not; a symbolic link is none (it may lead anywhere)."""
        try:
            entries = list(os.scandir(self.path))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        found = {}
        for entry in entries:
            match = _STEP_DIR.match(entry.name)
            if match and entry.is_dir(follow_symlinks=False):
                found[int(match.group(1))] = Path(entry.path)
        return found

    def committed_steps(self) -> list[int]:
        """Steps whose manifest is in place, newest first. Says nothing of their validity: a
        manifest that is not a regular file counts, for its readers to refuse and say so."""
        return sorted((s for s, d in self.step_dirs().items() if os.path.lexists(d / MANIFEST)), reverse=True)

    def clean_debris(self) -> list[str]:
        """Remove what interrupted writes left behind; returns what was removed.

        Only call this while no writer of this directory's own runs (the Checkpointer's
        constructor, which all ranks leave through a barrier). What an outside writer
        (:meth:`adopt`) is still writing stays.
        """
        removed = []
        for _step, path in self.step_dirs().items():
            if not (path / MANIFEST).is_file():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
                continue
            for tmp in path.glob("*.tmp"):
                tmp.unlink(missing_ok=True)
                removed.append(f"{path.name}/{tmp.name}")
        for tmp in self.path.glob("*.tmp") if self.path.is_dir() else ():
            if not _writer_may_run(tmp):
                tmp.unlink(missing_ok=True)
                removed.append(tmp.name)
        for staging in self.path.glob(".adopt-*") if self.path.is_dir() else ():
            if _writer_may_run(staging):
                continue
            shutil.rmtree(staging, ignore_errors=True)
            removed.append(staging.name)
        if removed:
            logger.info("%s tier %s: removed debris of interrupted writes: %s", self.name, self.path, removed)
        return removed

    def write_latest(self, step: int) -> None:
        tmp = self.path / f"latest.{_writer()}.tmp"
        with open(tmp, "w") as out:
            out.write(f"{step}\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path / "latest")
        fsync_dir(self.path)

    def prune(self, keep: int, protect: set[int], own_files: list[str] | None = None) -> list[int]:
        """Drop checkpoints older than the newest ``keep`` committed ones, except ``protect``.

        With ``own_files`` only those files are removed (node-local tier shared by ranks), and the
        directory once it is empty.
        """
        committed = self.committed_steps()
        if not committed:
            return []
        oldest_kept = committed[: max(keep, 1)][-1]
        # older directories, committed or already uncommitted by a sibling rank
        doomed = [s for s in self.step_dirs() if s < oldest_kept and s not in protect]
        return self._remove(doomed, own_files)

    def adopt(self, source: Path, step: int) -> Path:
        """Make the committed checkpoint in ``source`` a committed checkpoint of this tier.

        Files are hard-linked (copied across file systems), so the two tiers then own the data
        independently: either may prune its copy. The step directory appears with its manifest
        in one rename, so a reader sees all of it or nothing.
        """
        target = self.step_dir(step)
        if (target / MANIFEST).is_file():
            return target
        staging = self.path / f".adopt-{step}-{_writer()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for item in sorted(source.iterdir(), key=lambda p: p.name == MANIFEST):  # the manifest last
            if item.suffix == ".tmp" or item.is_symlink() or not item.is_file():  # a link's target is not ours
                continue
            try:
                os.link(item, staging / item.name)
            except OSError:
                shutil.copy2(item, staging / item.name)
        fsync_dir(staging)
        shutil.rmtree(target, ignore_errors=True)  # debris of an interrupted write, never committed
        os.replace(staging, target)
        fsync_dir(self.path)
        self.write_latest(max(self.committed_steps()))
        return target

    def discard_after(self, step: int, own_files: list[str] | None = None) -> list[int]:
        """Drop every checkpoint newer than ``step`` (a branch abandoned by a rollback)."""
        dropped = self._remove([s for s in self.step_dirs() if s > step], own_files)
        remaining = self.committed_steps()
        if remaining:
            self.write_latest(remaining[0])
        else:
            (self.path / "latest").unlink(missing_ok=True)
        return dropped

    def _remove(self, steps: list[int], own_files: list[str] | None) -> list[int]:
        """The manifest goes first, so a crash midway leaves debris, never a partial checkpoint."""
        for step in sorted(steps):
            path = self.step_dir(step)
            (path / MANIFEST).unlink(missing_ok=True)
            if own_files is None:
                shutil.rmtree(path, ignore_errors=True)
            else:
                for name in own_files:
                    (path / name).unlink(missing_ok=True)
                with contextlib.suppress(OSError):  # a sibling rank's shard is left: it removes the dir
                    path.rmdir()
        return sorted(steps)


def _writer() -> str:
    """This process, as the names of what it is writing say: its host and its id."""
    return f"{socket.gethostname()}.{os.getpid()}"


def _writer_may_run(path: Path) -> bool:
    """Whether the process that is writing ``path`` may still run: one of this host is looked at,
    one of another host is given :data:`FOREIGN_WRITER_S` since its last change."""
    named = _WRITTEN_BY.match(path.name)
    if named is None:
        return False
    if named["host"] == socket.gethostname():
        return int(named["pid"]) != os.getpid() and process_runs(int(named["pid"]))
    try:
        return time.time() - path.stat().st_mtime < FOREIGN_WRITER_S
    except OSError:
        return False
