"""Every figure of a chaos run, judged against its target where it has one, and the notes in words
for what a figure cannot show (the attempt no fault explains, with its events).
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

import recovery_split
from recovery_split import percentile

from chaoslib.config import NODE_LOSSES, Config, SiteFacts
from chaoslib.drains import drains
from chaoslib.execution import Execution
from chaoslib.losses import Loss, by_member, flip_outcomes, losses, window_recoveries
from chaoslib.report import Figure
from chaoslib.resumes import node_loss_resumes
from chaoslib.rundata import RunData
from chaoslib.schedule import Fault

#: Faults that last a while and may end no attempt: their recovery counts from the fault to the
#: first step after it ended.
WINDOWED = ("storage-full", "worker-stop")
#: Targets per fault kind (``--quick`` on a quiet machine): the p95 of what the faults of a kind
#: cost before their members trained again, and of how long noticing them took.
RECOVERY_P95_S = 10.0
DETECTION_P95_S = 5.0
#: Steps a drain may redo: the member stops after its current step and commits it.
DRAIN_REDONE = 3


def recovery_figures(kind: str, mine: list[Loss]) -> list[Figure]:
    """The recovery of the attempts that faults of ``kind`` ended, judged against
    :data:`RECOVERY_P95_S` and :data:`DETECTION_P95_S`, with its split (:mod:`recovery_split`)."""
    parts = recovery_split.summary(loss.split for loss in mine if loss.split is not None)
    recovery = percentile([loss.recovery_s for loss in mine], 0.95)
    detections = [loss.detect_s for loss in mine if loss.detect_s is not None]
    detection = percentile(detections, 0.95) if detections else None  # it found members waiting only
    cut = sum(loss.split is not None and loss.split.cut for loss in mine)
    waiting = sum(loss.waiting for loss in mine)
    found = [
        Figure(
            f"recoveries_{kind}",
            f"recovery {kind}: attempts ended",
            len(mine) - waiting,
            f"attempts; {waiting} members found waiting; {cut} cut by a later fault",
        ),
        Figure(
            f"recovery_{kind}_median",
            f"recovery {kind}, median",
            statistics.median(loss.recovery_s for loss in mine),
            "s",
        ),
        Figure(
            f"recovery_{kind}_p95",
            f"recovery {kind}, p95",
            recovery,
            "s",
            f"<= {RECOVERY_P95_S:g}",
            recovery <= RECOVERY_P95_S,
        ),
        Figure(
            f"detection_{kind}_p95",
            "  of which detection, p95",
            detection,
            "s",
            f"<= {DETECTION_P95_S:g}",
            None if detection is None else detection <= DETECTION_P95_S,
        ),
    ]
    for part in ("restart", "queued", "restore", "redone"):  # the split goodput.py reports (recovery_split)
        label = "  queued for a worker (not counted), median" if part == "queued" else f"  of which {part}, median"
        found.append(Figure(f"{part}_{kind}_median", label, parts.get(f"{part}_median"), "s"))
    return found


def next_start_s(data: RunData, fault: Fault) -> float | None:
    """For a fault that ended no attempt by itself: how long until a member started after it (a
    hung pool takes no new work until it is replaced)."""
    starts = [e["time"] for e in data.events if e["kind"] == "started" and e["time"] > fault.time]
    return min(starts) - fault.time if starts else None


class Figures(list[Figure]):
    """Figures in the order they are printed and written."""

    def add(self, *fields: Any) -> None:
        self.append(Figure(*fields))


def figures(
    config: Config,
    facts: SiteFacts,
    chaos: Execution,
    faults: list[Fault],
    reference_digests: dict[str, str],
    reference: Execution | None,
) -> list[Figure]:
    """Every figure of the chaos run, judged against the issue's targets where it has one."""
    data = chaos.data
    every = losses(data, faults, facts.workers)
    return [
        *outcome_figures(chaos, faults, reference_digests),
        *loss_figures(config, data, every),
        *kind_figures(data, faults, every),
        *flip_figures(data, faults),
        *node_loss_figures(data, faults),
        *walltime_figures(config, chaos, faults),
        *retry_figures(data),
        *cost_figures(config, chaos, reference),
        *hygiene_figures(chaos, local=facts.name == "local"),
    ]


def outcome_figures(chaos: Execution, faults: list[Fault], reference_digests: dict[str, str]) -> Figures:
    """Whether every member finished with the reference's weights, how the runners ended, and the
    faults injected."""
    data, n = chaos.data, len(chaos.data.names)
    out = Figures()
    finished = len(data.digests)
    equal = sum(name in data.digests and data.digests[name] == reference_digests.get(name) for name in data.names)
    out.add("members_finished", "members finished", finished, f"of {n}", f"= {n}", finished == n)
    out.add("digests_equal", "digests equal to the fault-free run", equal, f"of {n}", f"= {n}", equal == n)
    out.add("hung", "run killed at its timeout", int(chaos.timed_out), "runs", "= 0", not chaos.timed_out)
    exits = len(chaos.runner_exits)
    out.add("runner_exits", "runners that exited with members unfinished", exits, "runners", "= 0", exits == 0)
    status = chaos.returncode
    out.add("exit_status", "exit status of the last runner", status, "", "= 0", status == 0)
    injected = Counter(f.kind for f in faults if f.skipped is None)
    for kind in sorted({f.kind for f in faults}):
        out.add(f"faults_{kind}", f"faults injected: {kind}", injected[kind], "faults")
    skipped = sum(f.skipped is not None for f in faults)
    out.add("faults_skipped", "faults skipped (no target in time)", skipped, "faults", "= 0", skipped == 0)
    return out


def loss_figures(config: Config, data: RunData, every: list[Loss]) -> Figures:
    """The steps that the attempts ended by faults lost, against the checkpoint interval, and the
    losses that no fault explains."""
    out = Figures()
    lost = [loss for loss in every if not loss.waiting]
    explained = [loss for loss in lost if loss.fault is not None]
    judged = [loss for loss in explained if not loss.through_full]
    steps = [loss.steps for loss in judged]
    median_lost = statistics.median(steps) if steps else 0
    spare = max(
        (loss.steps - (2 if loss.fault.kind == "shard-flip" else 1) * config.interval for loss in judged), default=0
    )
    out.add("checkpoint_interval", "checkpoint interval", config.interval, "steps")
    out.add("attempts_lost", "attempts ended by a fault", len(explained), "attempts")
    out.add(
        "steps_lost_median",
        "steps lost per attempt ended, median",
        median_lost,
        "steps",
        f"<= {config.interval}",
        median_lost <= config.interval,
    )
    out.add(
        "steps_lost_max",
        "steps lost per attempt ended, max",
        max(steps, default=0),
        "steps",
        f"<= {2 * config.interval} (+1 interval after a flip)",
        spare <= config.interval,
    )
    through = [loss.steps for loss in explained if loss.through_full]
    out.add(
        "steps_lost_through_full",
        "  attempts that lived through a full tier: steps lost, max",
        max(through, default=0),
        f"steps ({len(through)} attempts)",
    )
    twice = sum(
        count > 1 for count in Counter(e.get("member") for e in data.events if e["kind"] == "finished").values()
    )
    out.add("finished_twice", "members trained again after they had finished", twice, "members")
    unexplained = sum(loss.fault is None for loss in lost)
    out.add(
        "attempts_unexplained", "attempts lost that no fault explains", unexplained, "attempts", "= 0", unexplained == 0
    )
    restores = [loss.split.restore_s for loss in lost if loss.split and loss.split.restore_s is not None]
    restore_s = statistics.median(restores) if restores else 0.0
    out.add("restore_median", "restore (started -> training again), median", restore_s, "s")
    return out


def kind_figures(data: RunData, faults: list[Fault], every: list[Loss]) -> Figures:
    """The recovery of each kind injected (:func:`recovery_figures`); for a kind that ended no
    attempt by itself, the wait to a step after its window, or to the next start."""
    out = Figures()
    for kind in sorted({f.kind for f in faults if f.skipped is None}):
        mine = [loss for loss in every if loss.fault and loss.fault.kind == kind and loss.recovery_s is not None]
        struck = [f for f in faults if f.kind == kind and f.skipped is None]
        if mine:
            out.extend(recovery_figures(kind, mine))
        elif kind in WINDOWED and (windowed := [r for f in struck for r in window_recoveries(data, f)]):
            out.add(
                f"recovery_{kind}_median",
                f"recovery {kind} (to a step after it ended), median",
                statistics.median(windowed),
                "s",
            )
            out.add(
                f"recovery_{kind}_p95",
                f"recovery {kind} (to a step after it ended), p95",
                percentile(windowed, 0.95),
                "s",
            )
        else:
            waits = [w for f in struck if (w := next_start_s(data, f)) is not None]
            out.add(
                f"recovery_{kind}_next_start",
                f"recovery {kind}: ended no attempt alone; next member started",
                max(waits) if waits else None,
                "s (max)",
            )
    return out


def flip_figures(data: RunData, faults: list[Fault]) -> Figures:
    """How the flipped shards were met on restore (none may be restored damaged)."""
    out = Figures()
    flips = flip_outcomes(data, faults)
    if flips:
        out.add(
            "flips_detected",
            "flipped shards detected on restore",
            flips["detected"],
            f"of {sum(flips.values())} ({flips['not exercised']} never restored)",
            "none restored damaged",
            flips["restored"] == 0,
        )
    return out


def node_loss_figures(data: RunData, faults: list[Fault]) -> Figures:
    """With members spanning nodes: what their restores after node losses read, per source."""
    out = Figures()
    struck = {f.kind for f in faults if f.skipped is None}
    if not (data.spanning and struck & set(NODE_LOSSES)):
        return out
    resumes = node_loss_resumes(data, faults, data.spanning)
    for kind, what in (
        ("node-loss", "after one node: read nothing from the shared tier"),
        ("node-and-buddy-loss", "after a node and its buddy: read all from the shared tier"),
    ):
        if kind not in struck:
            continue
        mine = [r for r in resumes if r.kind == kind]
        good = sum(r.as_expected for r in mine)
        key = kind.replace("-", "_")
        out.add(
            f"{key}_resumes",
            f"2-node resumes {what}",
            good,
            f"of {len(mine)}",
            "= all (>= 1)",
            0 < good == len(mine),
        )
        for source in ("local", "peer", "shared"):
            read = sum(v for r in mine for k, v in r.bytes_from.items() if k.split(" on ")[0] == source)
            out.add(f"{key}_mib_{source}", f"  bytes read from {source} copies", read / 2**20, "MiB")
    return out


def walltime_figures(config: Config, chaos: Execution, faults: list[Fault]) -> Figures:
    """``--walltime``: blocks drained in time, steps redone per drain, nothing killed by a walltime."""
    out = Figures()
    if config.walltime_s is None:
        return out
    drained = drains(chaos.data, faults, chaos.slurm_states)
    redone = drained.redone
    out.add("walltime", "block walltime", config.walltime_s, "s")
    out.add(
        "walltime_drained",
        "blocks drained before their walltime",
        drained.blocks_drained,
        "blocks",
        ">= 1",
        drained.blocks_drained >= 1,
    )
    out.add(
        "walltime_stops", "members stopped by a drain (exit 75)", drained.stops, "stops", ">= 1", drained.stops >= 1
    )
    out.add("walltime_declined", "starts declined near a drain", drained.declined, "starts")
    out.add(
        "walltime_retries", "retries spent on drained attempts", drained.retries, "retries", "= 0", drained.retries == 0
    )
    out.add(
        "walltime_redone_median", "steps redone per drain, median", statistics.median(redone) if redone else 0, "steps"
    )
    out.add(
        "walltime_redone_max",
        "steps redone per drain, max",
        max(redone, default=0),
        "steps",
        f"<= {DRAIN_REDONE} (interval {config.interval})",
        max(redone, default=0) <= DRAIN_REDONE,
    )
    out.add(
        "walltime_timeouts",
        "blocks Slurm ended at their walltime (TIMEOUT)",
        drained.timeouts,
        "blocks",
        "= 0",
        drained.timeouts == 0,
    )
    out.add(
        "walltime_killed", "attempts killed by the walltime", len(drained.killed), "attempts", "= 0", not drained.killed
    )
    return out


def retry_figures(data: RunData) -> Figures:
    """Retries spent, members out of retries, and the watchdog's ``lost`` events."""
    out = Figures()
    cost = sum(float(e.get("cost", 0)) for e in data.events if e["kind"] == "failed")
    out_of = len(out_of_retries(data))
    out.add("retries_spent", "retries spent (cost of the failures)", cost, "retries")
    out.add("members_out_of_retries", "members that ran out of retries", out_of, "members", "= 0", out_of == 0)
    out.add(
        "watchdog_lost",
        "`lost` events (the runner's watchdog)",
        sum(e["kind"] == "lost" for e in data.events),
        "events",
    )
    return out


def cost_figures(config: Config, chaos: Execution, reference: Execution | None) -> Figures:
    """What the runner cost (CPU, memory) and the wall time, against the fault-free run if there was one."""
    n = len(chaos.data.names)
    out = Figures()
    out.add("runner_starts", "runner processes (run + resumes)", chaos.runner_starts, "processes")
    out.add("runner_cpu_s", "runner CPU", chaos.runner_cpu_s, "s")
    out.add("runner_cpu_per_member_ms", "runner CPU per member", 1000 * chaos.runner_cpu_s / n, "ms")
    out.add("runner_peak_rss_mib", "peak runner RSS", chaos.runner_peak_rss_mib, "MiB")
    out.add("members_cpu_s", "members' CPU (the workers')", chaos.members_cpu_s, "s")
    if chaos.members_cpu_s:
        out.add("runner_cpu_pct", "runner CPU / members' CPU", 100 * chaos.runner_cpu_s / chaos.members_cpu_s, "%")
    out.add("wall_s", "wall time", chaos.wall_s, "s")
    if reference is None:
        return out
    share = 100 * reference.runner_cpu_s / reference.members_cpu_s if reference.members_cpu_s else None
    judge = config.judge_runner_cpu
    out.add("reference_runner_cpu_s", "fault-free run: runner CPU", reference.runner_cpu_s, "s")
    out.add(
        "reference_runner_cpu_per_member_ms",
        "fault-free run: runner CPU per member",
        1000 * reference.runner_cpu_s / n,
        "ms",
    )
    out.add("reference_members_cpu_s", "fault-free run: members' CPU", reference.members_cpu_s, "s")
    out.add(
        "reference_runner_cpu_pct",
        "fault-free run: runner CPU / members' CPU",
        share,
        "%",
        "<= 1" if judge else "(judged at 128+ members)",
        (share is not None and share <= 1) if judge else None,
    )
    out.add("reference_runner_peak_rss_mib", "fault-free run: peak runner RSS", reference.runner_peak_rss_mib, "MiB")
    out.add("reference_wall_s", "fault-free run: wall time", reference.wall_s, "s")
    out.add("wall_ratio", "wall time against the fault-free run", chaos.wall_s / reference.wall_s, "x")
    return out


def hygiene_figures(chaos: Execution, local: bool) -> Figures:
    """Parsl's logs, torn lines, and what of the run was left over (Slurm jobs off the ``local`` site)."""
    data = chaos.data
    out = Figures()
    out.add("parsl_mib", "Parsl's logs in the run directory", data.parsl_mib, "MiB")
    out.add("torn_events", "torn lines in events.jsonl", data.torn_events, "lines", "= 0", data.torn_events == 0)
    out.add("torn_metrics", "torn lines in metrics.jsonl", data.torn_metrics, "lines", "= 0", data.torn_metrics == 0)
    roles = ["pool", "interchange", "pool process", "block script"] + ([] if local else ["Slurm job"])
    for role in roles:
        count = chaos.leftovers[role]
        out.add(
            f"leftover_{role.replace(' ', '_')}",
            f"leftover {role.replace('process', 'processe')}s",
            count,
            "jobs" if role == "Slurm job" else "processes",
            "= 0",
            count == 0,
        )
    return out


def out_of_retries(data: RunData) -> set[str]:
    """Members with a failure that was not retried: the runner emits ``retried`` right after
    ``failed`` while a retry is left, nothing otherwise."""
    waiting: dict[str, bool] = {}
    out = set()
    for event in data.events:
        name, kind = event.get("member"), event["kind"]
        if kind in ("failed", "retried", "submitted", "started") and waiting.get(name):
            if kind != "retried":
                out.add(name)
            waiting[name] = False
        if kind == "failed":
            waiting[name] = True
    return out | {name for name, pending in waiting.items() if pending and name not in data.digests}


def notes(execution: Execution, faults: list[Fault]) -> list[str]:
    """What went wrong beyond the figures, in words: runners that gave up, processes left over,
    each attempt lost that no fault explains, with its member's events around it, each restore
    after a node loss that read from other sources than expected, and each attempt the walltime
    killed."""
    data = execution.data
    odd = [r for r in node_loss_resumes(data, faults, data.spanning) if not r.as_expected]
    killed = drains(data, faults, execution.slurm_states).killed if execution.slurm_states else []
    t0 = min((e["time"] for e in data.events), default=0.0)
    unexplained = []
    for loss in losses(data, faults):
        if loss.fault is not None:
            continue
        mine = [e for e in by_member(data).get(loss.member, []) if e.get("attempt") in (loss.attempt, loss.attempt + 1)]
        told = "; ".join(f"{e['time'] - t0:.1f} {e['kind']}#{e.get('attempt')}" for e in mine)
        unexplained.append(f"unexplained: {loss.member} attempt {loss.attempt} ({loss.detected_by}): {told}")
    injected = "; ".join(f"{f.time - t0:.1f} {f.kind} {sorted(f.hit)}" for f in faults if f.skipped is None)
    return [
        *execution.runner_exits,
        *(f"left over: {leftover}" for leftover in execution.leftover_details),
        *unexplained,
        *([f"faults (s after the first event): {injected}"] if unexplained else []),
        *(
            f"{r.kind} of {', '.join(r.lost)}: {r.member} attempt {r.attempt} restored {r.step}, read {r.bytes_from}"
            for r in odd
        ),
        *(f"killed by the walltime: {attempt}" for attempt in killed),
    ]
