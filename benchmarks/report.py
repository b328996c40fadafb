"""What the benchmarks judge and print alike: ratios against their targets, the figures table,
and claims judged one by one. The options, rounds and JSON file are :mod:`harness`'s.

A benchmark lists its ratios as ``(key, label, numerator, op, denominator, target)``, the figures
being keys of its measured figures, ``op`` ``"<="`` or ``">="`` and ``target`` None for a ratio
shown for information only. Its figures are labelled by ``key: (section, unit, label)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["judge", "print_checks", "print_figures", "print_verdicts"]

Ratio = tuple[str, str, str, str, str, float | None]


def judge(figures: Mapping[str, float], ratios: Iterable[Ratio]) -> dict[str, dict[str, Any]]:
    """Every ratio whose two figures were measured, with its value, target and verdict."""
    result: dict[str, dict[str, Any]] = {}
    for key, label, num, op, den, target in ratios:
        if num not in figures or den not in figures:
            continue
        value = figures[num] / figures[den]
        if target is None:
            verdict, shown = "info", ""
        else:
            verdict = "PASS" if (value <= target if op == "<=" else value >= target) else "FAIL"
            shown = f"{op} {target:g}"
        result[key] = {"label": label, "value": value, "target": shown, "result": verdict}
    return result


def print_figures(
    console: Console,
    figures: Mapping[str, float],
    labels: Mapping[str, tuple[str, str, str]],
    title: str = "Figures (medians)",
) -> None:
    """The measured figures, in ``labels``' order."""
    table = Table(title=title)
    for column in ("section", "quantity", "value", "unit"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for key, (section, unit, label) in labels.items():
        if key in figures:
            table.add_row(section, label, f"{figures[key]:.4g}", unit)
    console.print(table)


def print_checks(
    console: Console, checks: Mapping[str, Mapping[str, Any]], heading: str = "check", value_format: str = ".3g"
) -> None:
    """The ratios of :func:`judge` (or any check with ``label``, ``value``, ``target``, ``result``)."""
    table = Table(title="Ratios against targets")
    for column in (heading, "value", "target", "result"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for check in checks.values():
        style = {"PASS": "green", "FAIL": "red"}.get(check["result"], "yellow")
        value = format(check["value"], value_format)
        table.add_row(check["label"], value, check["target"], f"[{style}]{check['result']}")
    console.print(table)


def print_verdicts(console: Console, verdicts: Mapping[str, bool]) -> None:
    """Claims judged PASS or FAIL one by one, for benchmarks whose targets are not ratios of two figures."""
    for claim, holds in verdicts.items():
        console.print(f"{'PASS' if holds else 'FAIL'}  {claim}")
