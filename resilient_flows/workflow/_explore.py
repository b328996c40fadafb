"""Exploration campaigns: a population of members over a hyperparameter space, and population-based
training (PBT) that exploits by cloning.

``grid`` and ``random`` only expand into members. ``pbt`` (Jaderberg et al., 2017, with Ray
Tune's semantics) also watches the population: when a member passes a perturbation boundary (every
``interval`` steps) and its score there is in the bottom ``fraction`` of the scores that members
had at the same boundary, it is retired and a top member that is still training is cloned, with
its hyperparameters perturbed (continuous values multiplied by a ``perturb`` factor and clipped to
their range, choices moved to a neighbour; resampled instead with ``resample_probability``). The
donor is cloned while it keeps training (see :mod:`resilient_flows.clone`), instead of being paused
and restored from a persisted checkpoint. Comparing scores at the same step keeps the ranking fair
when members run in waves on fewer workers than members.

The score is the mean training loss over the ``window`` steps before the boundary (lower is
better), read from the members' metrics, so the controller needs no evaluation of its own.
"""

from __future__ import annotations

import math
import random
from typing import Any

from resilient_flows.clone import request_clone
from resilient_flows.rundir import EventLog, request_retirement
from resilient_flows.training import MemberSpec
from resilient_flows.workflow._status import MemberStatus


def campaign_points(explore: Any) -> list[dict[str, Any]]:
    """The hyperparameters of each initial member of a campaign, deterministic in its seed."""
    spaces = explore.hyperparameters
    if explore.strategy == "grid":
        points: list[dict[str, Any]] = [{}]
        for name, space in spaces.items():
            points = [{**p, name: v} for p in points for v in space.grid()]
        return points
    rng = random.Random(explore.seed)
    return [{name: space.sample(rng) for name, space in spaces.items()} for _ in range(explore.population)]


class PBTController:
    """Decides, from the members' metrics, which member to replace by a clone of which, and when."""

    def __init__(self, explore: Any, run_dir: Any, members: list[MemberSpec]) -> None:
        self.explore = explore
        self.run_dir = run_dir
        self.rng = random.Random(explore.seed + 1)
        self.window = explore.window or max(1, explore.interval // 4)
        self.family = {m.name for m in members}  # the population: initial members and their clones
        self.next_boundary: dict[str, int] = {}
        self.retired: set[str] = set()
        self.decided: set[tuple[str, int]] = set()
        self.events = EventLog(run_dir)

    def update(self, specs: list[MemberSpec], statuses: dict[str, MemberStatus]) -> None:
        for spec in specs:
            if spec.parent is not None and spec.parent.member in self.family:
                self.family.add(spec.name)
        interval = self.explore.interval
        for name in sorted(self.family - self.retired):
            status = statuses.get(name)
            if status is None or status.state != "running" or status.step is None:
                continue
            if name not in self.next_boundary:  # the first boundary after where it started (a clone: its fork)
                history = status.history()
                first = min(history.curve, default=0) if history is not None else 0
                self.next_boundary[name] = (first // interval + 1) * interval
            boundary = self.next_boundary[name]
            if status.step < boundary:
                continue
            # A member ahead of the others waits at its boundary for a peer to rank against, until
            # it passes the next one; the ranking then decides for every member scored there.
            if self._rank_at(boundary, specs, statuses) or status.step >= boundary + interval:
                self.next_boundary[name] = boundary + interval

    def _rank_at(self, boundary: int, specs: list[MemberSpec], statuses: dict[str, MemberStatus]) -> bool:
        """Rank the members scored at ``boundary``; replace the running ones in the bottom fraction."""
        scores = {}
        for peer in self.family - self.retired:
            score = self._score(statuses.get(peer), boundary)
            if score is not None:
                scores[peer] = score
        if len(scores) < 2:
            return False
        ranked = sorted(scores, key=lambda n: (scores[n], n))
        k = max(1, math.floor(len(ranked) * self.explore.fraction))
        donors = [n for n in ranked[:k] if statuses[n].state == "running"]
        for name in ranked[-k:]:
            if (name, boundary) in self.decided or statuses[name].state != "running" or name in donors:
                continue
            self.decided.add((name, boundary))
            if donors:
                self._replace(name, self.rng.choice(donors), boundary, scores, specs)
        return True

    def _replace(self, name: str, donor: str, boundary: int, scores: dict[str, float], specs: list[MemberSpec]) -> None:
        donor_spec = spec_of(specs, donor)
        assert donor_spec is not None
        overrides = self._explore(donor_spec.params)
        (clone,) = request_clone(self.run_dir, donor, 1, overrides)
        self.family.add(clone)
        self.retired.add(name)
        request_retirement(self.run_dir, name, f"pbt: replaced by {clone}, a clone of {donor}")
        self.events.emit(
            "exploited",
            name,
            step=boundary,
            donor=donor,
            clone=clone,
            overrides=overrides,
            score=scores[name],
            donor_score=scores[donor],
        )

    def _score(self, status: MemberStatus | None, boundary: int) -> float | None:
        history = None if status is None else status.history()  # a peer finished before a resume: read once
        if history is None:
            return None
        curve = history.curve
        values = [curve[s] for s in range(boundary - self.window, boundary) if s in curve]
        return sum(values) / len(values) if len(values) == self.window else None

    def _explore(self, params: dict[str, Any]) -> dict[str, Any]:
        changed = {}
        for name, space in self.explore.hyperparameters.items():
            current = params.get(name)
            if current is None or self.rng.random() < self.explore.resample_probability:
                changed[name] = space.sample(self.rng)
            else:
                changed[name] = space.perturb(current, self.rng, self.explore.perturb)
        return changed


def spec_of(specs: list[MemberSpec], name: str) -> MemberSpec | None:
    return next((s for s in specs if s.name == name), None)
