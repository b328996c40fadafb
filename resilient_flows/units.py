"""Durations and sizes as people write them in YAML: ``90s``, ``15m``, ``6h``, ``512MiB``, ``2GiB``."""

from __future__ import annotations

import argparse
import re

__all__ = ["duration_argument", "parse_duration", "parse_size"]

_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9}
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_duration(value: str | int | float, what: str = "duration") -> float:
    """Seconds in ``value``: a number of seconds, or a number with a unit among s, m, h, d."""
    number, unit = _split(value, what)
    if unit not in _DURATION:
        raise ValueError(f"{what} {value!r} has unit {unit!r}; use one of {', '.join(_DURATION)} (e.g. 90s, 15m, 6h)")
    return number * _DURATION[unit]


def duration_argument(text: str) -> float:
    """:func:`parse_duration` as an ``argparse`` type: a bad value is a usage error that says why."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_size(value: str | int, what: str = "size") -> int:
    """Bytes in ``value``: a number of bytes, or a number with a unit among B, KiB, MiB, GiB, TiB, kB, MB, GB."""
    number, unit = _split(value, what, default_unit="b")
    if unit.lower() not in _SIZE:
        raise ValueError(f"{what} {value!r} has unit {unit!r}; use one of B, KiB, MiB, GiB, TiB, kB, MB, GB")
    return int(number * _SIZE[unit.lower()])


def _split(value: str | int | float, what: str, default_unit: str = "s") -> tuple[float, str]:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number or a string like '15m', got {value!r}")
    if isinstance(value, int | float):
        number, unit = float(value), default_unit
    else:
        match = _NUMBER_UNIT.match(str(value))
        if match is None:
            raise ValueError(f"{what} {value!r} is not a number with an optional unit (e.g. 15m, 512MiB)")
        number, unit = float(match.group(1)), match.group(2) or default_unit
    if number < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return number, unit
