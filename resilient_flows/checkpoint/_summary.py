"""What a checkpoint's manifest says about it, read without torch: the listing's view.

``resilient-flows checkpoints list`` shows each committed checkpoint's step, time, size and
ranks, and whether its manifest and shard sizes hold together; a user types it while waiting, and
importing torch to parse dtypes would cost it seconds. So this reads the manifest as plain JSON
and checks what a listing can: the format and version, the shards (their names and sizes), and
that every array has a dtype and shape this version knows and pieces in its shards. Whether the
pieces tile each array, and the data's checksums, are left to
:class:`~resilient_flows.checkpoint._manifest.Manifest` (``verify`` and every restore).

The format's name, its version and the shards' names are defined here, and the full manifest
parser uses them, so that the two readers cannot disagree on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilient_flows.capped import MANIFEST_CAP, parse_json, read_capped
from resilient_flows.checkpoint._dtypes import SAFETENSORS_DTYPES
from resilient_flows.checkpoint._tiers import MANIFEST, shard_filename
from resilient_flows.errors import CorruptCheckpointError, DamagedFileError, FileTooLargeError

FORMAT = "resilient-flows-checkpoint"
VERSION = 2


@dataclass(frozen=True)
class ManifestSummary:
    """A checked manifest's step, creation time, rank count, and each shard file's size."""

    step: int
    created: float
    world_size: int
    shard_bytes: dict[str, int]

    @property
    def nbytes(self) -> int:
        return sum(self.shard_bytes.values())


def check_format(data: dict[str, Any]) -> None:
    """A manifest of this format and version; ValueError saying what it is otherwise."""
    if data["format"] != FORMAT:
        raise ValueError(f"format is {data['format']!r}, expected {FORMAT!r}")
    if data["version"] > VERSION:
        raise ValueError(f"version {data['version']} is newer than this library's {VERSION}")
    if data["version"] < VERSION:
        raise ValueError(
            f"version {data['version']} (flat pieces, before sharded state) is no longer read; "
            "restore it with resilient-flows 0.1 and save it again"
        )


def check_shard_name(index: int, world: int, name: str) -> None:
    """Shard ``index`` of ``world`` has the one name the writer gives it.

    Readers join the name to the step directory and open it: anything else (``../x``, an absolute
    path, another directory's file) would make a manifest from a shared file system point them
    at files outside the checkpoint."""
    expected = shard_filename(index, world)
    if name != expected:
        raise ValueError(
            f"shards[{index}].file is {name!r}, not {expected!r}: "
            "shards are named shard-<rank>-of-<world size>.safetensors, in their step directory"
        )


def summarize(data: dict[str, Any]) -> ManifestSummary:
    """The summary of a parsed manifest; KeyError, TypeError or ValueError saying what is wrong."""
    check_format(data)
    world = int(data["world_size"])
    shards = [(str(s["file"]), int(s["bytes"])) for s in data["shards"]]
    if world < 1 or len(shards) != world or len(data["rank_local"]) != world:
        raise ValueError(f"world_size {world} does not match {len(shards)} shards")
    for index, (name, _) in enumerate(shards):
        check_shard_name(index, world, name)
    for name, array in data["arrays"].items():
        if array["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError(f"{name!r} has the unknown dtype {array['dtype']!r}")
        if any(int(d) < 0 for d in array["shape"]):
            raise ValueError(f"{name!r} has a negative dimension in {array['shape']}")
        for piece in array["pieces"]:
            if not 0 <= int(piece[0]) < world:
                raise ValueError(f"a piece of {name!r} names shard {piece[0]} of {world}")
    return ManifestSummary(int(data["step"]), float(data["created"]), world, dict(shards))


def read_summary(step_dir: Path) -> ManifestSummary:
    """The summary of ``step_dir``'s manifest; CorruptCheckpointError naming the step otherwise."""
    where = f"{step_dir.name}/{MANIFEST}"
    data = manifest_json(read_manifest_bytes(step_dir), where)
    try:
        return summarize(data)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise CorruptCheckpointError(f"{where}: malformed manifest ({type(exc).__name__}: {exc})") from None


def read_manifest_bytes(step_dir: Path) -> bytes:
    """The manifest file of ``step_dir``; CorruptCheckpointError when it is missing, over its cap,
    or not a regular file (see :func:`~resilient_flows.capped.open_regular`)."""
    try:
        return read_capped(step_dir / MANIFEST, MANIFEST_CAP, "the checkpoint manifest", expect_json=True)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{step_dir.name}: {MANIFEST} is missing") from None
    except FileTooLargeError as exc:
        raise CorruptCheckpointError(f"{step_dir.name}: {exc}") from None
    except DamagedFileError as exc:
        raise CorruptCheckpointError(f"{step_dir.name}/{MANIFEST}: {exc.problem}") from None
    except ValueError as exc:  # its start cannot start JSON
        raise CorruptCheckpointError(f"{step_dir.name}/{MANIFEST}: manifest is not valid JSON ({exc})") from None


def manifest_json(text: str | bytes, where: str) -> Any:
    """The JSON of a manifest; CorruptCheckpointError naming ``where`` when it is not JSON (or is
    nested deeper than :data:`~resilient_flows.capped.MAX_DEPTH`)."""
    try:
        return parse_json(text.encode() if isinstance(text, str) else text)
    except ValueError as exc:  # UnicodeDecodeError too
        raise CorruptCheckpointError(f"{where}: manifest is not valid JSON ({exc})") from None
