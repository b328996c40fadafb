"""The manifest: the one file whose presence makes a checkpoint exist.

Layout of a tier (the checkpoint format page of the documentation describes it for users)::

    <tier>/step-00000120/manifest.json
    <tier>/step-00000120/shard-00000-of-00002.safetensors
    <tier>/latest

The manifest is written last, under a temporary name, fsynced and renamed into place after every
shard is durable, so a step directory without ``manifest.json`` is debris of an interrupted write.
It holds everything that is not tensor data (the state's skeleton, scalars, per-rank values),
each array's global dtype and shape, and where its pieces lie: for each piece its box in the
global array (offsets and lengths per dimension, DCP's chunk metadata), the shard holding it and
the piece's xxh3-64 checksum; and each shard's size and checksum. Parsing validates every field,
and that every array's boxes tile it exactly once, because a manifest on a shared file system is
input we did not just write.

Version 2 replaced version 1's flat element ranges with boxes; version 1 checkpoints are refused
with a message saying so.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from resilient_flows.capped import MANIFEST_CAP
from resilient_flows.checkpoint._boxes import Box
from resilient_flows.checkpoint._shardfile import CODE_DTYPES, DTYPE_CODES, ShardRecord
from resilient_flows.checkpoint._summary import (
    FORMAT,
    VERSION,
    check_format,
    check_shard_name,
    manifest_json,
    read_manifest_bytes,
)
from resilient_flows.checkpoint._tiers import MANIFEST
from resilient_flows.durable import fsync_dir
from resilient_flows.errors import CheckpointError, CorruptCheckpointError


@dataclass(frozen=True)
class PieceRecord:
    """The box ``box`` of an array, stored under ``key`` in shard number ``shard``."""

    shard: int
    key: str
    box: Box
    xxh3_64: str


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
    #: Where the writer put each shard's node-local copies, by shard file: ``"<tier> on <node>"``
    #: (a peer tier's copy on the buddy node). A plan, not a guarantee: a node that was lost, or
    #: had no room for a peer copy, lacks its copy; restore looks at what is there.
    copies: dict[str, list[str]] = field(default_factory=dict)

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
                        "pieces": [
                            [p.shard, p.key, list(p.box.offsets), list(p.box.lengths), p.xxh3_64] for p in a.pieces
                        ],
                    }
                    for name, a in self.arrays.items()
                },
                "skeleton": self.skeleton,
                "rank_local": self.rank_local,
                **({"copies": self.copies} if self.copies else {}),
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Manifest:
        data = manifest_json(text, where)
        try:
            return cls._parse(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptCheckpointError(f"{where}: malformed manifest ({type(exc).__name__}: {exc})") from None

    @classmethod
    def _parse(cls, data: dict) -> Manifest:
        check_format(data)
        world = int(data["world_size"])
        shards = [ShardRecord.from_json(s) for s in data["shards"]]
        if world < 1 or len(shards) != world or len(data["rank_local"]) != world:
            raise ValueError(f"world_size {world} does not match {len(shards)} shards")
        for index, record in enumerate(shards):
            check_shard_name(index, world, record.file)
        arrays = {}
        for name, a in data["arrays"].items():
            record = ArrayRecord(
                dtype=CODE_DTYPES[a["dtype"]],
                shape=tuple(int(d) for d in a["shape"]),
                pieces=[
                    PieceRecord(int(s), str(k), Box(tuple(map(int, o)), tuple(map(int, n))), str(h))
                    for s, k, o, n, h in a["pieces"]
                ],
            )
            check_cover(name, record, world)
            arrays[str(name)] = record
        return cls(
            step=int(data["step"]),
            world_size=world,
            skeleton=dict(data["skeleton"]),
            rank_local=[dict(r) for r in data["rank_local"]],
            arrays=arrays,
            shards=shards,
            created=float(data["created"]),
            copies={str(file): [str(where) for where in places] for file, places in data.get("copies", {}).items()},
        )


def check_cover(name: str, record: ArrayRecord, world: int) -> None:
    """The pieces' boxes lie inside the array, do not overlap, and add up to all of it."""
    ndim = len(record.shape)
    total = 0
    for piece in record.pieces:
        box = piece.box
        if not 0 <= piece.shard < world:
            raise ValueError(f"a piece of {name!r} names shard {piece.shard} of {world}")
        if len(box.offsets) != ndim or len(box.lengths) != ndim:
            raise ValueError(f"a piece of {name!r} has {len(box.offsets)} dimensions, the array {ndim}")
        if any(o < 0 or n < 1 or o + n > d for o, n, d in zip(box.offsets, box.lengths, record.shape, strict=True)):
            raise ValueError(f"a piece of {name!r} at {list(box.offsets)} lies outside its shape {list(record.shape)}")
        total += box.numel
    if total != record.numel:
        raise ValueError(f"pieces of {name!r} hold {total} of its {record.numel} elements")
    if len(record.pieces) > 1 and ndim:
        lo = np.array([p.box.offsets for p in record.pieces], dtype=np.int64)
        hi = lo + np.array([p.box.lengths for p in record.pieces], dtype=np.int64)
        for i in range(len(record.pieces) - 1):  # pairwise, one row of pairs at a time
            overlap = np.all((lo[i] < hi[i + 1 :]) & (lo[i + 1 :] < hi[i]), axis=1)
            if overlap.any():
                raise ValueError(f"pieces of {name!r} overlap")
    elif len(record.pieces) > 1:
        raise ValueError(f"the scalar {name!r} has {len(record.pieces)} pieces")


def write_manifest(step_dir: Path, manifest: Manifest) -> None:
    """Commit: the checkpoint exists from the rename on, and survives a crash from the dir fsync.

    A manifest over the readers' cap is refused here, rather than committed and then unreadable."""
    data = manifest.to_json().encode()
    if len(data) > MANIFEST_CAP:
        raise CheckpointError(
            f"the manifest of step {manifest.step} would have {len(data)} bytes, over the "
            f"{MANIFEST_CAP >> 20} MiB that readers accept: the state has too many pieces"
        )
    tmp = step_dir / f"{MANIFEST}.{os.getpid()}.tmp"
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, step_dir / MANIFEST)
    fsync_dir(step_dir)


def read_manifest(step_dir: Path) -> Manifest:
    """The manifest of ``step_dir``, checked; CorruptCheckpointError naming the step otherwise."""
    return Manifest.from_json(read_manifest_bytes(step_dir), f"{step_dir.name}/{MANIFEST}")
