"""The dtypes a shard may hold: each one's safetensors name and torch's name for it.

Kept as plain names, without torch, so that listing checkpoints can check a manifest's dtypes
without importing torch (seconds); :mod:`~resilient_flows.checkpoint._shardfile` turns them into
torch dtypes.
"""

from __future__ import annotations

#: safetensors name -> the attribute of ``torch`` that is its dtype.
SAFETENSORS_DTYPES: dict[str, str] = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
}
