"""The report of a run: its tables printed, and its JSON document, whose keys the docs and the tests
read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import harness
from rich.console import Console
from rich.table import Table

from chaoslib.resumes import Resume
from chaoslib.schedule import Fault


@dataclass
class Figure:
    key: str
    label: str
    value: float | None
    unit: str
    target: str = ""
    ok: bool | None = None  # None: no target, or not judged in this configuration


def print_report(
    console: Console,
    title: str,
    found: list[Figure],
    faults: list[Fault],
    remarks: list[str],
    resumes: Iterable[Resume] = (),
) -> None:
    table = Table(title=title)
    for column in ("figure", "value", "unit", "target", "result"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for figure in found:
        value = "-" if figure.value is None else f"{figure.value:.4g}"
        result = {True: "[green]PASS", False: "[red]FAIL", None: ""}[figure.ok]
        table.add_row(figure.label, value, figure.unit, figure.target, result)
    console.print(table)
    timeline = Table(title="Faults")
    for column in ("burst", "t (s)", "kind", "members hit", "what"):
        timeline.add_column(column, justify="right" if column in ("burst", "t (s)") else "left")
    origin = min((f.time for f in faults if f.time), default=0.0)
    for fault in sorted(faults, key=lambda f: (f.time == 0, f.time, f.burst)):
        when = f"{fault.time - origin:.1f}" if fault.time else "-"
        what = fault.detail if fault.skipped is None else f"[yellow]skipped: {fault.skipped}"
        timeline.add_row(str(fault.burst), when, fault.kind, ", ".join(sorted(fault.hit)) or "-", what)
    if faults:
        console.print(timeline)
    resumes = list(resumes)
    if resumes:
        restores = Table(title="Restores of 2-node members after node losses (bytes per source)")
        for column in ("member", "attempt", "after", "lost", "on", "step", "read", "steps lost", "result"):
            restores.add_column(column, justify="right" if column in ("attempt", "step", "steps lost") else "left")
        for r in resumes:
            read = ", ".join(f"{k} {v / 2**10:.0f} KiB" for k, v in sorted(r.bytes_from.items())) or "nothing"
            result = "[green]PASS" if r.as_expected else "[red]FAIL"
            restores.add_row(
                r.member,
                str(r.attempt),
                r.kind,
                ", ".join(r.lost),
                ", ".join(r.hosts),
                "-" if r.step is None else str(r.step),
                read,
                str(r.lost_steps),
                result,
            )
        console.print(restores)
    for remark in remarks:
        console.print(remark, style="red", soft_wrap=True, markup=False)


def write_json(
    path: Path,
    meta: dict[str, Any],
    found: list[Figure],
    faults: list[Fault],
    remarks: list[str],
    resumes: Iterable[Resume] = (),
) -> None:
    document = {
        **meta,
        "figures": {f.key: {"value": f.value, "unit": f.unit, "label": f.label} for f in found},
        "checks": {
            f.key: {"label": f.label, "value": f.value, "target": f.target, "result": "PASS" if f.ok else "FAIL"}
            for f in found
            if f.ok is not None
        },
        "faults": [{**asdict(f), "doomed": sorted(f.doomed)} for f in faults],
        "restores_after_node_loss": [{**asdict(r), "as_expected": r.as_expected} for r in resumes],
        "notes": remarks,
    }
    harness.write_json(path, document)
