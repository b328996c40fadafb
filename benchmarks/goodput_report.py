"""``goodput.py``'s figures: the cost of one fault per kind against the fault-free member of the
same round, its split, goodput at one fault a minute, the targets of issue 34, and the checks
(digests bit for bit, no retry charged). Measuring is ``goodput.py``'s job."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import harness
from recovery_split import goodput, percentile, summary
from rich.console import Console
from rich.table import Table

#: kind -> (figure of the row, its limit in seconds, the target in words)
TARGETS = {
    "member-kill": ("cost_median", 1.5, "cost <= 1.5 s"),
    "node-loss": ("training_again_median", 10.0, "training again <= 10 s"),
}
#: The split's parts, in the table's order.
PARTS = ("detection", "restart", "restore", "redone")
PERIOD_S = 60.0


def _fault_free(measured: Sequence[Any]) -> Any:
    return next(m for m in measured if m.kind == "fault-free")


def rows_of(
    rounds: Sequence[Sequence[Any]], spares: bool, timed: bool = True
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Each kind's row (and the fault-free one's) over the rounds, and the checks. ``timed``: the
    time targets apply (they are set for the paced member, whose step time is fixed; another
    workload's figures are reported beside them, unjudged)."""
    kinds = list(dict.fromkeys(m.kind for measured in rounds for m in measured))
    rows: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        runs = [(m, _fault_free(measured)) for measured in rounds for m in measured if m.kind == kind]
        rows[kind] = _row(kind, runs)
    checks: dict[str, Any] = {}
    for kind, row in rows.items():
        if timed and kind in TARGETS and row.get(TARGETS[kind][0]) is not None:
            key, limit, words = TARGETS[kind]
            words += " (with a spare node)" if kind == "node-loss" and not spares else ""
            value = row[key]
            checks[f"target_{kind}"] = _check(f"{kind}: {words}", value, f"<= {limit:g} s", value <= limit)
    faulted = [(m, _fault_free(measured)) for measured in rounds for m in measured if m.kind != "fault-free"]
    differ = [f"{m.kind}" for m, clean in faulted if m.digest is None or m.digest != clean.digest]
    checks["digests"] = _check("digests equal to the fault-free run's", len(faulted) - len(differ), "all", not differ)
    charged = sum(m.charged for measured in rounds for m in measured)
    checks["retries"] = _check("retries charged", charged, "= 0", charged == 0)
    missed = [m.kind for m, _ in faulted if m.faults == 0]
    checks["struck"] = _check("runs in which no fault struck", len(missed), "= 0", not missed)
    timed_out = sum(m.timed_out for measured in rounds for m in measured)
    checks["timeouts"] = _check("runs killed at their timeout", timed_out, "= 0", timed_out == 0)
    checks.update(_node_loss_checks([m for measured in rounds for m in measured if m.kind == "node-loss"], spares))
    return rows, checks


def _node_loss_checks(runs: Sequence[Any], spares: bool) -> dict[str, Any]:
    """After a lost node the restore reads nothing from the shared tier (the buddies' peer copies
    serve it), and with a spare node the member restarts inside its block: no block after the first."""
    if not runs:
        return {}
    read = sum(m.shared_bytes for m in runs)
    checks = {"shared_bytes": _check("node loss: bytes read from the shared tier", read, "= 0", read == 0)}
    if spares:
        extra = sum(max(0, m.blocks - 1) for m in runs)
        checks["blocks"] = _check("node loss with a spare: blocks started after the first", extra, "= 0", extra == 0)
    return checks


def _check(label: str, value: float, target: str, holds: bool) -> dict[str, Any]:
    return {"label": label, "value": value, "target": target, "result": "PASS" if holds else "FAIL"}


def _row(kind: str, runs: list[tuple[Any, Any]]) -> dict[str, Any]:
    """A kind's figures: wall times, cost per fault over rounds, the split over every fault."""
    row: dict[str, Any] = {
        "wall_median": statistics.median(m.wall_s for m, _ in runs),
        "faults": sum(m.faults for m, _ in runs),
        "rounds": len(runs),
        **stall_summary(ms for m, _ in runs for ms in m.stalls_ms),
        "restored_bytes": _added(m.restored_bytes for m, _ in runs),
    }
    if kind == "fault-free":
        row["step_s"] = statistics.median(m.step_s for m, _ in runs)
        return row
    costs = [(m.wall_s - clean.wall_s) / m.faults for m, clean in runs if m.faults and m.wall_s and clean.wall_s]
    if not costs:
        return row
    row["cost_median"], row["cost_p95"] = statistics.median(costs), percentile(costs, 0.95)
    row["goodput"] = goodput(row["cost_median"], PERIOD_S)
    split = summary(s for m, _ in runs for s in m.splits)
    row.update(split)
    if split:
        row["other"] = row["cost_median"] - sum(split[f"{part}_median"] for part in PARTS)
    return row


def stall_summary(stalls_ms: Iterable[float]) -> dict[str, float]:
    """What checkpoints cost the training loop: the median and p95 (nearest rank) of each
    checkpoint's stall in ms, and their count; nothing without checkpoints."""
    stalls = list(stalls_ms)
    if not stalls:
        return {}
    return {
        "stall_ms_median": statistics.median(stalls),
        "stall_ms_p95": percentile(stalls, 0.95),
        "checkpoints": len(stalls),
    }


def _added(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for count in counts:
        for key, value in count.items():
            total[key] = total.get(key, 0) + value
    return total


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_report(out: Console, meta: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]], checks: Any) -> None:
    """The table of kinds, then the checks, with the commit and the machine's load."""
    load = f"load {meta['load_before'][0]:.2f} before, {meta['load_after'][0]:.2f} after, {meta['cpus']} CPUs"
    title = f"Time one fault costs ({meta['site']}, a fault every {meta['period_s']:g} s; {meta['commit']}; {load})"
    table = Table(title=title)
    headings = ("kind", "faults", "cost", "p95", *PARTS, "other", "again", "goodput", "stall ms", "p95 ms")
    for heading in (*headings, "target", "result"):
        table.add_column(heading, justify="left" if heading in ("kind", "target", "result") else "right")
    for kind, row in rows.items():
        if kind == "fault-free":
            continue
        check = checks.get(f"target_{kind}")
        result = "" if check is None else {"PASS": "[green]PASS", "FAIL": "[red]FAIL"}[check["result"]]
        cells = [_seconds(row.get(f"{part}_median")) for part in PARTS]
        share = row.get("goodput")
        table.add_row(
            kind,
            str(row["faults"]),
            _seconds(row.get("cost_median")),
            _seconds(row.get("cost_p95")),
            *cells,
            _seconds(row.get("other")),
            _seconds(row.get("training_again_median")),
            "-" if share is None else f"{100 * share:.1f} %",
            *_stall_cells(row),
            "" if check is None else check["target"],
            result,
        )
    out.print(table)
    clean = rows.get("fault-free")
    if clean is not None:
        stall, p95 = _stall_cells(clean)
        out.print(
            f"fault-free member: {clean['wall_median']:.1f} s (median of {clean['rounds']}), step"
            f" {clean['step_s'] * 1000:.0f} ms, checkpoint stall {stall} ms (p95 {p95}). Seconds per fault (medians;"
            " p95 over rounds): cost = (faulted - fault-free wall time) / faults; again = fault -> training again;"
            " goodput at one fault a minute; stall: each checkpoint's, in ms"
        )
    for kind, row in rows.items():
        if row.get("restored_bytes"):
            read = ", ".join(f"{tier} {count / 2**20:.1f} MiB" for tier, count in row["restored_bytes"].items())
            out.print(f"{kind}: restores read {read}")
    others = {k: v for k, v in checks.items() if not k.startswith("target_")}
    for check in others.values():
        out.print(f"{check['result']}  {check['label']}: {check['value']:g} (target {check['target']})")
    for remark in meta.get("remarks", []):
        out.print(f"[yellow]{remark}")


def _stall_cells(row: Mapping[str, Any]) -> tuple[str, str]:
    if "stall_ms_median" not in row:
        return "-", "-"
    return f"{row['stall_ms_median']:.1f}", f"{row['stall_ms_p95']:.1f}"


def write_document(
    path: Path, meta: Mapping[str, Any], rows: Any, checks: Any, rounds: Sequence[Sequence[Any]]
) -> None:
    """The figures by kind, the checks, and every run with its splits."""
    runs = [
        {**{k: v for k, v in asdict(m).items() if k != "splits"}, "round": r, "splits": [asdict(s) for s in m.splits]}
        for r, measured in enumerate(rounds)
        for m in measured
    ]
    harness.write_json(path, {**meta, "kinds": rows, "checks": checks, "runs": runs})
