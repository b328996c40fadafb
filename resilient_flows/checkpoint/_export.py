"""Consolidate a sharded checkpoint into one file of full tensors, for evaluation or other tools.

A checkpoint is many shards written by many ranks; evaluation scripts, Hugging Face style loaders
and ``torch.load`` want one file of full tensors under their state-dict names. The export streams
array by array: each full tensor is assembled from its verified pieces, written, and dropped, so
peak memory stays near the largest tensor, not the model.

Both formats are laid out before any data is written (their headers only need names, dtypes and
shapes, which the manifest has): a safetensors header, or a ``torch.save`` archive written with
``torch.serialization.skip_data`` over fake tensors, whose storages' offsets in the archive are
then filled with ``pwrite``. The file appears under its name only once complete and fsynced.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from resilient_flows.checkpoint._catalog import find_tier
from resilient_flows.checkpoint._manifest import Manifest
from resilient_flows.checkpoint._reader import OpenCheckpoint, Target
from resilient_flows.checkpoint._shardfile import DTYPE_CODES
from resilient_flows.checkpoint._state import RANK_LOCAL
from resilient_flows.durable import fsync_dir
from resilient_flows.errors import CheckpointError, CorruptCheckpointError

FORMATS = ("safetensors", "torch")


@dataclass(frozen=True)
class ExportResult:
    """What was written: the step it came from, how many tensors and bytes of tensor data, and
    the newer checkpoints passed over for it, each as (step, why it is damaged)."""

    path: Path
    step: int
    tensors: int
    nbytes: int
    skipped: tuple[tuple[int, str], ...] = ()


def export(
    directory: str | os.PathLike,
    out: str | os.PathLike,
    *,
    step: int | None = None,
    format: str = "safetensors",
    part: str | None = None,
) -> ExportResult:
    """Write the newest valid checkpoint (or ``step``) in the tier ``directory`` as one file.

    ``directory`` may also hold the tier below it, as a member's directory does: the one tier
    there is exported, and several are refused with their names. A newer checkpoint that is
    damaged is passed over for the next, and named in :attr:`ExportResult.skipped`.

    ``part`` selects a subtree of the state by its top-level key and names tensors relative to
    it: the default, ``"model"`` when the state has one (a :class:`TrainState`'s model), gives
    exactly the names of the model's ``state_dict()``, ready for ``load_state_dict(strict=True)``.
    ``part=""`` exports every replicated array under its full path (``optimizer/state/...``).
    Per-rank values (RNG states) are never exported.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    tier = find_tier(directory)
    steps = [s for s in tier.committed_steps() if step in (None, s)]
    if not steps:
        wanted = f"step {step}" if step is not None else "committed checkpoint"
        raise CheckpointError(f"no {wanted} in {tier.path}")
    skipped: list[tuple[int, str]] = []
    for candidate in steps:
        try:
            with OpenCheckpoint(tier.step_dir(candidate), candidate) as opened:
                names = _selected(opened.manifest, part)
                return replace(_write(opened, names, Path(out), format), skipped=tuple(skipped))
        except CorruptCheckpointError as exc:
            skipped.append((candidate, str(exc)))
    problems = "; ".join(f"step {s}: {why}" for s, why in skipped)
    raise CheckpointError(f"no valid checkpoint to export in {tier.path}: {problems}")


def _selected(manifest: Manifest, part: str | None) -> dict[str, str]:
    """Array name in the checkpoint -> name in the export."""
    if part is None:
        part = "model" if any(name.startswith("model/") for name in manifest.arrays) else ""
    prefix = f"{part}/" if part else ""
    names = {
        name: name[len(prefix) :]
        for name in manifest.arrays
        if name.startswith(prefix) and not name.startswith(f"{RANK_LOCAL}/")
    }
    if not names:
        parts = sorted({name.split("/", 1)[0] for name in manifest.arrays if "/" in name} - {RANK_LOCAL})
        raise CheckpointError(
            f"checkpoint step {manifest.step} has no arrays under --part {part!r}; its parts: "
            f"{', '.join(parts) or 'none'} ('' for every array)"
        )
    return names


def _write(opened: OpenCheckpoint, names: dict[str, str], out: Path, format: str) -> ExportResult:
    manifest = opened.manifest
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        offsets = (
            _layout_safetensors(tmp, manifest, names)
            if format == "safetensors"
            else _layout_torch(tmp, manifest, names)
        )
        nbytes = 0
        fd = os.open(tmp, os.O_WRONLY)
        try:
            for name, offset in zip(names, offsets, strict=True):
                nbytes += _write_array(fd, opened, name, offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return ExportResult(out, manifest.step, len(names), nbytes)


def _write_array(fd: int, opened: OpenCheckpoint, name: str, offset: int) -> int:
    """Assemble the full array ``name`` from its verified pieces and write it at ``offset``; its bytes.

    Nothing of it outlives the call, and its pieces' pages are unmapped once copied: one array at
    a time in memory.
    """
    record = opened.manifest.arrays[name]
    targets = {name: Target.of(record, None)}
    opened.verify(targets)
    full = opened.fill(targets)[name]
    opened.release(name)
    if not isinstance(full, torch.Tensor):  # never: a target made without a live array is a tensor
        raise CheckpointError(f"{name}: restored as a {type(full).__name__}, not a tensor")
    data = full.reshape(-1).view(torch.uint8).numpy().data
    written = 0
    while written < len(data):
        written += os.pwrite(fd, data[written:], offset + written)
    return written


def _layout_safetensors(path: Path, manifest: Manifest, names: dict[str, str]) -> list[int]:
    """Write the safetensors header; where each tensor's data goes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt", "step": str(manifest.step)}}
    offset = 0
    starts: list[int] = []
    for name, exported in names.items():
        record = manifest.arrays[name]
        nbytes = record.numel * record.dtype.itemsize
        starts.append(offset)
        header[exported] = {
            "dtype": DTYPE_CODES[record.dtype],
            "shape": list(record.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    return [8 + len(text) + start for start in starts]


def _layout_torch(path: Path, manifest: Manifest, names: dict[str, str]) -> list[int]:
    """Write a ``torch.save`` archive with its storages left empty; where each storage's bytes go."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = {
            exported: torch.empty(manifest.arrays[name].shape, dtype=manifest.arrays[name].dtype)
            for name, exported in names.items()
        }
    with torch.serialization.skip_data(materialize_fake_tensors=True):
        torch.save(fake, path)
    archive = torch._C.PyTorchFileReader(str(path))
    stored = set(archive.get_all_records())
    # torch.save numbers storages in the order it meets them: one per tensor here, in dict order.
    keys = [f"data/{i}" for i in range(len(names))]
    if any(key not in stored for key in keys) or f"data/{len(names)}" in stored:
        raise CheckpointError(f"torch.save laid out {path.name} unexpectedly; export to safetensors instead")
    # torch's stubs lack this method of PyTorchFileReader, which torch.serialization itself calls
    return [archive.get_record_offset(key) for key in keys]  # pyright: ignore[reportAttributeAccessIssue]
