"""The manifest: the one file whose presence makes a checkpoint exist.

Layout of a tier (see DESIGN.md)::

    <tier>/step-00000120/manifest.json
    <tier>/step-00000120/shard-00000-of-00002.safetensors
    <tier>/latest

The manifest is written last, under a temporary name, fsynced and renamed into place after every
shard is durable, so a step directory without ``manifest.json`` is debris of an interrupted write.
It holds everything that is not tensor data (the state's skeleton, scalars, per-rank values) and
where each array's pieces lie, with each shard's size and xxh3-64 checksum. Parsing validates
every field, because a manifest on a shared file system is input we did not just write.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from resilient_flows.checkpoint.shardfile import CODE_DTYPES, DTYPE_CODES, ShardRecord, fsync_dir
from resilient_flows.errors import CorruptCheckpointError

__all__ = ["FORMAT", "VERSION", "ArrayRecord", "Manifest", "PieceRecord", "read_manifest", "write_manifest"]

FORMAT = "resilient-flows-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class PieceRecord:
    """Elements ``[start, stop)`` of an array, stored under ``key`` in shard number ``shard``."""

    shard: int
    key: str
    start: int
    stop: int


@dataclass
class ArrayRecord:
    dtype: torch.dtype
    shape: tuple[int, ...]
    pieces: list[PieceRecord]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Manifest:
    step: int
    world_size: int
    skeleton: dict
    rank_local: list[dict]
    arrays: dict[str, ArrayRecord]
    shards: list[ShardRecord]
    created: float = field(default_factory=time.time)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.shards)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "step": self.step,
                "created": self.created,
                "world_size": self.world_size,
                "shards": [s.to_json() for s in self.shards],
                "arrays": {
                    name: {
                        "dtype": DTYPE_CODES[a.dtype],
                        "shape": list(a.shape),
                        "pieces": [[p.shard, p.key, p.start, p.stop] for p in a.pieces],
                    }
                    for name, a in self.arrays.items()
                },
                "skeleton": self.skeleton,
                "rank_local": self.rank_local,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Manifest:
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptCheckpointError(f"{where}: manifest is not valid JSON ({exc})") from None
        try:
            return cls._parse(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptCheckpointError(f"{where}: malformed manifest ({type(exc).__name__}: {exc})") from None

    @classmethod
    def _parse(cls, data: dict) -> Manifest:
        if data["format"] != FORMAT:
            raise ValueError(f"format is {data['format']!r}, expected {FORMAT!r}")
        if data["version"] > VERSION:
            raise ValueError(f"version {data['version']} is newer than this library's {VERSION}")
        world = int(data["world_size"])
        shards = [ShardRecord.from_json(s) for s in data["shards"]]
        if world < 1 or len(shards) != world or len(data["rank_local"]) != world:
            raise ValueError(f"world_size {world} does not match {len(shards)} shards")
        arrays = {}
        for name, a in data["arrays"].items():
            record = ArrayRecord(
                dtype=CODE_DTYPES[a["dtype"]],
                shape=tuple(int(d) for d in a["shape"]),
                pieces=[PieceRecord(int(s), str(k), int(b), int(e)) for s, k, b, e in a["pieces"]],
            )
            _check_cover(name, record, world)
            arrays[str(name)] = record
        return cls(
            step=int(data["step"]),
            world_size=world,
            skeleton=dict(data["skeleton"]),
            rank_local=[dict(r) for r in data["rank_local"]],
            arrays=arrays,
            shards=shards,
            created=float(data["created"]),
        )


def _check_cover(name: str, record: ArrayRecord, world: int) -> None:
    position = 0
    for piece in sorted(record.pieces, key=lambda p: p.start):
        if piece.start != position or piece.stop < piece.start or not 0 <= piece.shard < world:
            raise ValueError(f"pieces of {name!r} do not tile it")
        position = piece.stop
    if position != record.numel:
        raise ValueError(f"pieces of {name!r} cover {position} of {record.numel} elements")


def write_manifest(step_dir: Path, manifest: Manifest) -> None:
    """Commit: the checkpoint exists from the rename on, and survives a crash from the dir fsync."""
    tmp = step_dir / f"{MANIFEST}.{os.getpid()}.tmp"
    with open(tmp, "w") as out:
        out.write(manifest.to_json())
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, step_dir / MANIFEST)
    fsync_dir(step_dir)


def read_manifest(step_dir: Path) -> Manifest:
    path = step_dir / MANIFEST
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{step_dir.name}: manifest.json is missing") from None
    return Manifest.from_json(text, step_dir.name)
