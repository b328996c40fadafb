"""What the dashboard shows of a run, kept up to date from the run directory at the cost of what changed.

One :class:`RunModel` per served run. :meth:`RunModel.update` reads the events appended since the
last look (through the same :class:`~resilient_flows.workflow._status.StatusTracker` as ``status``,
so both always agree), the newest metrics and a sample of the loss curve of each member that runs
or had events (:class:`~resilient_flows.workflow.dashboard._curves.LossSampler`), and the shared
tier's heartbeat of members whose newest checkpoint has not reached it yet. Nothing else is read
on a look: a finished member costs nothing until a view asks for its own curve
(:meth:`RunModel.member`).

Every file is read through the capped readers of :mod:`resilient_flows.rundir`; what is damaged
is passed over and listed in the document (``damage``). :attr:`RunModel.generation` counts the
looks that found something new, which is how a page knows whether to redraw.

The documents are plain JSON, versioned like ``status --json``: :func:`RunModel.document` is the
page's whole state but the per-member details, :meth:`RunModel.member` one member's.
"""

from __future__ import annotations

import collections
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resilient_flows.checkpoint import checkpoint_heartbeat_path, read_checkpoint_heartbeat, scan
from resilient_flows.clone import clone_seed
from resilient_flows.rundir import DamageLog, MetricsReader, member_layout
from resilient_flows.training import MemberSpec
from resilient_flows.workflow._families import family_of, family_stats, group_by_family
from resilient_flows.workflow._liveness import liveness
from resilient_flows.workflow._member_table import last_error
from resilient_flows.workflow._recorded_plan import MemberIndex, read_plan
from resilient_flows.workflow._status import MemberStatus, StatusTracker, free_stop
from resilient_flows.workflow.dashboard._curves import LossSampler, family_band

#: The version of the documents: within a version fields are only added.
DOCUMENT_VERSION = 1
#: Entries of the run's timeline kept (the newest).
TIMELINE_KEPT = 5000
#: Saves kept for the page's stall plot (the newest, over all members), and per member.
SAVES_KEPT = 5000
MEMBER_SAVES_KEPT = 2000
#: Markers kept per member (failures, resumes, ...).
MARKERS_KEPT = 500
#: Members whose curves the page draws over their family's band unless the user picks others.
HIGHLIGHTED = 3
#: Points of a member's own curve in :meth:`RunModel.member`.
MEMBER_POINTS = 2000
#: Members whose whole curves are held for :meth:`RunModel.member` (the most recently asked).
READERS_KEPT = 32
#: Seconds after a member's last event during which its shared tier is looked at until it holds
#: the newest checkpoint: a member whose copy never arrives (killed) is not looked at forever.
HEARTBEAT_FOLLOW_S = 120.0
#: Characters of an error or reason that an entry shows.
TEXT_SHOWN = 300

#: Event kinds the timeline shows.
TIMELINE_KINDS = frozenset(
    {
        "failed",
        "lost",
        "retried",
        "preempted",
        "resumed",
        "declined",
        "cloned",
        "forked",
        "clone_requested",
        "exploited",
        "ondemand",
        "draining",
        "drained",
        "tuned",
        "warning",
    }
)
#: Event kinds marked on a member's own curve.
MARKER_KINDS = frozenset({"failed", "lost", "preempted", "resumed", "cloned", "forked", "retried"})


@dataclass
class MemberFacts:
    """What the events say of a member beyond its state: where it runs, its saves and markers."""

    host: str | None = None
    block: str | None = None
    retries: int = 0
    node_step: int | None = None
    shared_step: int | None = None
    shared_committed: float | None = None
    saves: collections.deque = field(default_factory=lambda: collections.deque(maxlen=MEMBER_SAVES_KEPT))
    markers: collections.deque = field(default_factory=lambda: collections.deque(maxlen=MARKERS_KEPT))
    heartbeat_looked: bool = False
    heartbeat_until: float = 0.0  # monotonic time until which a lagging shared tier is looked at


class RunModel:
    """The dashboard's view of the run in ``run_dir``; safe to share between threads."""

    def __init__(self, run_dir: str | os.PathLike[str], damage: DamageLog | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.plan = read_plan(self.run_dir)
        self.damage = DamageLog() if damage is None else damage
        self.generation = 0
        self._index = MemberIndex(self.run_dir, self.plan, self.damage)
        self._tracker = StatusTracker(self.run_dir, follow=False, damage=self.damage, observe=self._observe)
        self._statuses: dict[str, MemberStatus] = {}
        self._specs: dict[str, MemberSpec] = {}
        self._children: dict[str, list[str]] = {}  # a member's clones, in the order registered
        self._samplers: dict[str, LossSampler] = {}
        self._facts: collections.defaultdict[str, MemberFacts] = collections.defaultdict(MemberFacts)
        self._seeds: dict[str, dict[str, Any]] = {}
        self._readers: collections.OrderedDict[str, MetricsReader] = collections.OrderedDict()
        self._timeline: collections.deque = collections.deque(maxlen=TIMELINE_KEPT)
        self._saves: collections.deque = collections.deque(maxlen=SAVES_KEPT)
        self._block_hosts: dict[str, set[str]] = {}
        self._tuned: list[dict[str, Any]] = []
        self._decisions: list[dict[str, Any]] = []
        self._first_event: float | None = None
        self._last_event: float | None = None
        self._touched: set[str] = set()
        self._changed = False
        self._lock = threading.Lock()
        self._document: tuple[int, dict[str, Any]] | None = None

    def update(self) -> int:
        """Read what changed since the last look; the generation after it."""
        with self._lock:
            self._changed = False
            self._touched = set()
            specs = self._index.members()
            if len(specs) != len(self._specs):
                self._changed = True
                self._specs = {m.name: m for m in specs}
                self._children = {}
                for spec in specs:
                    if spec.parent is not None:
                        self._children.setdefault(spec.parent.member, []).append(spec.name)
            self._statuses = self._tracker.update([(m.name, m.steps) for m in specs], {m.name: m.family for m in specs})
            for name, status in self._statuses.items():
                self._refresh(name, status)
            if self._changed:
                self.generation += 1
            return self.generation

    def _refresh(self, name: str, status: MemberStatus) -> None:
        sampler = self._samplers.get(name)
        if sampler is None:
            sampler = self._samplers[name] = LossSampler(member_layout(self.run_dir, name).metrics)
            self._changed |= sampler.update()
        elif status.active or name in self._touched:
            self._changed |= sampler.update()
        facts = self._facts[name]
        lagging = facts.shared_step is None or facts.shared_step < (facts.node_step or -1)
        if not facts.heartbeat_looked or status.active or (lagging and time.monotonic() < facts.heartbeat_until):
            self._read_heartbeat(name, facts)
        spec = self._specs.get(name)
        if spec is not None and spec.parent is not None and name not in self._seeds:
            seed = clone_seed(self.run_dir, name, self.damage)
            if seed is not None:
                self._seeds[name] = seed
                self._changed = True

    def _read_heartbeat(self, name: str, facts: MemberFacts) -> None:
        """The shared tier's newest step: read while the member runs, and for
        :data:`HEARTBEAT_FOLLOW_S` after its last event while the tier lags behind its newest
        checkpoint (the copy to the shared tier finishes after the member's last event)."""
        facts.heartbeat_looked = True
        path = checkpoint_heartbeat_path(member_layout(self.run_dir, name).checkpoints)
        try:
            beat = read_checkpoint_heartbeat(path)
        except OSError:  # none yet
            beat = None
        except ValueError as exc:  # its writer replaces it whole: damaged
            self.damage.file(path, str(exc).removeprefix(f"{path}: "))
            beat = None
        else:
            self.damage.repaired(path)
        if beat is not None and beat.step != facts.shared_step:
            facts.shared_step, facts.shared_committed = beat.step, beat.committed
            self._changed = True

    def _observe(self, event: dict[str, Any]) -> None:
        """One new event, in file order (the tracker's hook)."""
        self._changed = True
        kind, name = event.get("kind"), event.get("member")
        when = _number(event.get("time"))
        if when is not None:
            self._first_event = when if self._first_event is None else self._first_event
            self._last_event = when if self._last_event is None else max(self._last_event, when)
        facts = self._facts[name] if isinstance(name, str) else None
        if facts is not None and isinstance(name, str):
            self._touched.add(name)
            facts.heartbeat_until = time.monotonic() + HEARTBEAT_FOLLOW_S
        if kind == "started" and facts is not None:
            facts.host, facts.block = _text(event.get("host")), _text(event.get("block"))
            if facts.block is not None and facts.host is not None:
                self._block_hosts.setdefault(facts.block, set()).add(facts.host)
        elif kind in ("checkpointed", "forked") and facts is not None:
            step, stall = _number(event.get("step")), _number(event.get("stall_ms"))
            if step is not None:
                facts.node_step = max(int(step), facts.node_step if facts.node_step is not None else -1)
                facts.saves.append((when, int(step), stall))
                self._saves.append((when, stall, name))
        elif kind == "retried" and facts is not None:
            facts.retries += 1
        if kind == "tuned":
            self._tuned.append(_fields(event))
        elif kind == "ondemand":
            self._decisions.append(_fields(event))
        if kind in MARKER_KINDS and facts is not None and not (kind == "failed" and free_stop(event)):
            facts.markers.append(_marker(kind, event, when))
        if kind in TIMELINE_KINDS:
            self._timeline.append(self._entry(kind, event, when, facts))

    def _entry(self, kind: str, event: dict[str, Any], when: float | None, facts: MemberFacts | None) -> dict[str, Any]:
        block = _text(event.get("block")) or (facts.block if facts is not None else None)
        host = facts.host if facts is not None else None
        return {
            "time": when,
            "kind": kind,
            "member": _text(event.get("member")),
            "block": block,
            "host": host,
            "text": describe(kind, event),
        }

    def document(self) -> dict[str, Any]:
        """The page's state (see the module's docstring), as of the last :meth:`update`."""
        with self._lock:
            if self._document is not None and self._document[0] == self.generation:
                return self._document[1]
            document = self._build()
            self._document = (self.generation, document)
            return document

    def _build(self) -> dict[str, Any]:
        statuses = list(self._statuses.values())
        rates = {name: sampler.rate() for name, sampler in self._samplers.items()}
        families, bands, highlighted = [], {}, {}
        groups = group_by_family(statuses)
        for stats in family_stats(statuses):
            members = groups[stats.family]
            band = family_band([self._samplers[s.name].curve() for s in members])
            if band is not None:
                bands[stats.family] = band.__dict__
            best = sorted((s for s in members if s.loss is not None), key=lambda s: (s.loss, s.name))
            highlighted[stats.family] = [s.name for s in best[:HIGHLIGHTED]]
            running = [rate for s in members if s.state == "running" and (rate := rates.get(s.name))]
            left = sum(max(0, s.steps - (0 if s.step is None else s.step + 1)) for s in members if _open(s))
            families.append(
                {
                    "family": stats.family,
                    "members": stats.members,
                    "states": stats.states,
                    "steps_done": stats.steps_done,
                    "steps_total": stats.steps_total,
                    "best_loss": stats.best_loss,
                    "median_loss": stats.median_loss,
                    "failures": stats.failures,
                    "steps_per_s": sum(running) if running else None,
                    "eta_s": left / sum(running) if running and left else (0.0 if not left else None),
                }
            )
        curves = {}
        for names in highlighted.values():
            for name in names:
                steps, losses = self._samplers[name].curve()
                curves[name] = {"steps": steps, "loss": losses}
        runner = liveness(self.run_dir, self._specs).document()
        return {
            "version": DOCUMENT_VERSION,
            "generation": self.generation,
            "written": time.time(),
            "run": {
                "name": self.plan.workflow.name,
                "site": self.plan.site,
                "run_dir": str(self.run_dir),
                "runner": runner,
                "started": self._first_event,
                "last_event": self._last_event,
            },
            "families": families,
            "members": [self._member_row(s, rates.get(s.name)) for s in statuses],
            "bands": bands,
            "highlighted": highlighted,
            "curves": curves,
            "timeline": list(self._timeline),
            "blocks": {block: sorted(hosts) for block, hosts in self._block_hosts.items()},
            "saves": [{"time": t, "stall_ms": s, "member": m} for t, s, m in self._saves],
            "lineage": self._lineage(),
            "tuned": list(self._tuned),
            "decisions": list(self._decisions),
            "damage": self.damage.documents(self.run_dir),
        }

    def _member_row(self, status: MemberStatus, rate: float | None) -> dict[str, Any]:
        facts = self._facts[status.name]
        stalls = [s for _, _, s in facts.saves if s is not None]
        spec = self._specs.get(status.name)
        return {
            "name": status.name,
            "family": family_of(status.name, status.family),
            "state": status.state,
            "steps_done": 0 if status.step is None else status.step + 1,
            "steps": status.steps,
            "loss": status.loss,
            "attempts": status.attempts,
            "retries": facts.retries,
            "failures": status.failures,
            "preemptions": status.preemptions,
            "error": None if not status.errors else last_error(status, TEXT_SHOWN),
            "checkpoint": {"node": facts.node_step, "shared": facts.shared_step},
            "saves": len(facts.saves),
            "stall_ms_median": statistics.median(stalls) if stalls else None,
            "steps_per_s": rate,
            "host": facts.host,
            "block": facts.block,
            "parent": None if spec is None or spec.parent is None else spec.parent.member,
        }

    def _lineage(self) -> list[dict[str, Any]]:
        entries = []
        for name, spec in self._specs.items():
            parent, seed = spec.parent, self._seeds.get(name)
            entries.append(
                {
                    "name": name,
                    "parent": None if parent is None else parent.member,
                    "overrides": {} if parent is None else dict(parent.overrides),
                    "step": None if seed is None else seed.get("step"),
                    "transport": None if seed is None else seed.get("transport"),
                }
            )
        return entries

    def member(self, name: str) -> dict[str, Any] | None:
        """One member's own curve (every step up to :data:`MEMBER_POINTS` points), its attempts,
        markers, saves and shared-tier checkpoints; None for a name that is not a member."""
        with self._lock:
            if name not in self._specs:
                return None
            reader = self._readers.pop(name, None) or MetricsReader(
                member_layout(self.run_dir, name).metrics, self.damage
            )
            reader.read_curve()
            self._readers[name] = reader
            while len(self._readers) > READERS_KEPT:
                self._readers.popitem(last=False)
            steps = sorted(reader.curve)
            stride = max(1, -(-len(steps) // MEMBER_POINTS))
            shown = steps[::stride] + (steps[-1:] if steps and (len(steps) - 1) % stride else [])
            curve = {"steps": shown, "loss": [reader.curve[s] for s in shown]}
            times: dict[int, tuple[float | None, float | None]] = {
                a: reader.attempt_times.get(a, (None, None)) for a in reader.attempt_spans
            }
            return self._details(name, curve, reader.attempt_spans, times, self._shared_checkpoints(name))

    def member_sample(self, name: str) -> dict[str, Any] | None:
        """:meth:`member` from what the model already holds, reading no file (the report page
        embeds one per member): the sampled curve instead of every step, each attempt's first and
        last sampled lines instead of its exact span, and no shared-tier listing."""
        with self._lock:
            if name not in self._specs:
                return None
            sampler = self._samplers[name]
            steps, losses = sampler.curve()
            ends = {a: (first, sampler.attempt_ended[a]) for a, first in sampler.attempt_began.items()}
            spans = {a: (first.step, last.step) for a, (first, last) in ends.items()}
            times = {a: (first.time, last.time) for a, (first, last) in ends.items()}
            return self._details(name, {"steps": steps, "loss": losses}, spans, times, [])

    def _details(
        self,
        name: str,
        curve: dict[str, list],
        spans: dict[int, tuple[int, int]],
        times: dict[int, tuple[float | None, float | None]],
        shared: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """A member's details document: ``spans`` and ``times`` are each attempt's first and last
        steps and times."""
        facts = self._facts[name]
        return {
            "version": DOCUMENT_VERSION,
            "name": name,
            "curve": curve,
            "attempts": [
                {
                    "attempt": attempt,
                    "first_step": first,
                    "last_step": last,
                    "first_time": times[attempt][0],
                    "last_time": times[attempt][1],
                }
                for attempt, (first, last) in sorted(spans.items())
            ],
            "markers": [_placed(m, spans) for m in facts.markers],
            "saves": [{"time": t, "step": s, "stall_ms": ms} for t, s, ms in facts.saves],
            "shared": shared,
            "children": self._children.get(name, []),
        }

    def _shared_checkpoints(self, name: str) -> list[dict[str, Any]]:
        try:
            infos = scan(member_layout(self.run_dir, name).checkpoints, verify=False)
        except (OSError, ValueError):
            return []
        return [
            {"step": i.step, "created": i.created, "bytes": i.nbytes, "valid": i.valid, "problem": i.problem}
            for i in infos
        ]

    def member_names(self) -> list[str]:
        with self._lock:
            return list(self._specs)


def _open(status: MemberStatus) -> bool:
    """Whether the member still has steps to train in this run."""
    return status.state not in ("finished", "retired", "failed")


def _marker(kind: str, event: dict[str, Any], when: float | None) -> dict[str, Any]:
    step = event.get("step", event.get("from_step"))
    return {
        "kind": kind,
        "time": when,
        "attempt": _whole(event.get("attempt")),
        "step": _whole(step),
        "text": describe(kind, event),
    }


def _placed(marker: dict[str, Any], spans: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """A failure or loss has no step of its own: it is placed at the last step its attempt logged
    (``spans``: each attempt's first and last steps)."""
    if marker["step"] is None and marker["attempt"] is not None:
        span = spans.get(int(marker["attempt"]))
        if span is not None:
            return {**marker, "step": span[1]}
    return marker


def describe(kind: str, event: dict[str, Any]) -> str:
    """One line saying what an event of the timeline was."""
    get = event.get
    if kind in ("failed", "lost"):
        text = f"{get('error') or get('reason')}" + (f" ({get('cause')})" if get("cause") else "")
    elif kind == "retried":
        text = f"attempt {get('attempt')} from step {get('from_step')}"
    elif kind == "resumed":
        sources = get("bytes_from") or {}
        read = ", ".join(f"{k}: {v} B" for k, v in sources.items()) if isinstance(sources, dict) else ""
        text = f"from step {get('step')}" + (f" ({read})" if read else "")
    elif kind in ("preempted", "declined"):
        text = f"at step {get('step')}: {get('reason') or ''}".rstrip(": ")
    elif kind == "cloned":
        text = f"from {get('parent')} at step {get('step')} via {get('transport')}"
    elif kind == "forked":
        text = f"clones {get('clones')} at step {get('step')}"
    elif kind == "clone_requested":
        text = f"clones {get('clones')}"
    elif kind == "exploited":
        text = f"replaced by {get('clone')}, a clone of {get('donor')}"
    elif kind == "ondemand":
        preempt = get("preempt") or []
        verdict = f"preempt {', '.join(map(str, preempt))}" if preempt else f"wait {get('delay')} s"
        text = f"{get('request')} ({get('slots')} slots, {get('policy')}): {verdict}"
    elif kind in ("draining", "drained"):
        text = f"block {get('block')} of {get('executor')}" + (
            f", ends in {get('end_in_s')} s" if get("end_in_s") is not None else ""
        )
    elif kind == "tuned":
        every = get("shared_every")
        text = f"at step {get('step')}: a checkpoint every {get('interval_s')} s, to the shared tier every {every}"
    else:
        text = str(get("reason") or "")
    return text[:TEXT_SHOWN]


def _fields(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != "kind"}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _whole(value: Any) -> int | None:
    number = _number(value)
    return None if number is None or number != number else int(number)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)[:TEXT_SHOWN]
