"""Durations and sizes written with units."""

from __future__ import annotations

import pytest

from resilient_flows.units import parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("6h", 21600), ("1.5h", 5400), ("2d", 172800), (30, 30), ("45", 45)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "nbytes"), [("512MiB", 512 << 20), ("2GiB", 2 << 30), ("1.5 KiB", 1536), ("10MB", 10**7), (4096, 4096)]
)
def test_sizes(text: str | int, nbytes: int) -> None:
    assert parse_size(text) == nbytes


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: parse_duration("15 minutes", "walltime"), "walltime '15 minutes' has unit 'minutes'"),
        (lambda: parse_duration("-5s"), "is not a number"),
        (lambda: parse_duration(-5), "must not be negative"),
        (lambda: parse_size("lots", "staging"), "staging 'lots' is not a number"),
        (lambda: parse_size("3 parsecs"), "has unit 'parsecs'"),
        (lambda: parse_duration(True), "must be a number"),
    ],
)
def test_bad_values_name_the_problem(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
