"""The report's loss plot: a line per member in a small run, a band per family in a large one.

Up to :data:`~resilient_flows.workflow._families.GROUP_ABOVE` members each member has its curve,
with its failures and resumes marked on it. Above, a line per member would be a blur under a
legend longer than the figure: each family gets its median and a 10-90 % band, the best few
members their own thin lines, and a second panel shows failures, losses, preemptions and resumes
over wall time, one row per member, so that a burst of faults or a family that keeps failing
stands out. Every legend stays inside the figure, with a bounded number of entries.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from resilient_flows.workflow._families import GROUP_ABOVE, best_members, family_of, group_by_family
from resilient_flows.workflow._status import TIMELINE_KINDS, MemberStatus

if TYPE_CHECKING:
    from matplotlib.figure import Figure


#: Members drawn on their own over the families' bands.
BEST_DRAWN = 3
#: Families named in the legend; the others are drawn and counted in one entry.
LEGEND_FAMILIES = 6
#: Steps at which the family bands are computed: enough for a smooth curve at any run length.
GRID_POINTS = 400
#: Marker and colour of each timeline event kind.
_KIND_STYLE = {
    "failed": ("X", "tab:red"),
    "lost": ("v", "black"),
    "preempted": ("s", "tab:blue"),
    "resumed": ("o", "tab:green"),
}


def plot_losses(statuses: dict[str, MemberStatus], path: Path, title: str) -> None:
    """Write :func:`loss_figure` to ``path`` (PNG); reads each member's metrics up to now."""
    figure = loss_figure(statuses, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def loss_figure(statuses: dict[str, MemberStatus], title: str) -> Figure:
    """The loss plot of ``statuses``: per member up to :data:`GROUP_ABOVE` of them, else per family.
    A figure of its own, not pyplot's: nothing global to close, and the runner (which writes one
    at the end of every run) does not import pyplot's backends."""
    from matplotlib.figure import Figure

    sample = None if len(statuses) <= GROUP_ABOVE else 2 * GRID_POINTS  # a band needs no more
    curves = {name: _curve(s, sample) for name, s in statuses.items()}
    if len(statuses) <= GROUP_ABOVE:
        figure = Figure(figsize=(8, 4.5), layout="constrained")
        axes = figure.subplots()
        _member_lines(axes, statuses, curves)
        legend = "X: attempt lost, o: resumed from its checkpoint, ^: clone branches off"
        axes.set_title(f"{title}\n{legend}", fontsize="medium")
        _legend(axes, fontsize="small")
    else:
        figure = Figure(figsize=(9, 7), layout="constrained")
        axes, timeline = figure.subplots(2, 1, height_ratios=(3, 1.6))
        families = _family_bands(axes, statuses, curves)
        _timeline(timeline, statuses)
        grouped = f"{len(statuses)} members in {families} famil{'y' if families == 1 else 'ies'}"
        axes.set_title(f"{title}\n{grouped}: median and 10-90 % band per family", fontsize="medium")
        _legend(axes, fontsize="small", loc="upper right", framealpha=0.85)
    if not any(curve is not None for curve in curves.values()):
        axes.text(0.5, 0.5, "no metrics yet", transform=axes.transAxes, ha="center", va="center")
    else:
        axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    return figure


def _legend(axes, **style: object) -> None:
    """The legend of what was drawn with a label; none when nothing was (members without metrics yet)."""
    if axes.get_legend_handles_labels()[0]:
        axes.legend(**style)


def _curve(status: MemberStatus, sample: int | None) -> tuple[np.ndarray, np.ndarray] | None:
    """Steps and their losses smoothed by a running mean (raw losses are noisy), every step or
    about ``sample`` of them; None without any."""
    if sample is None:
        metrics = status.history()
        curve = {} if metrics is None else metrics.curve
    else:
        curve = {} if status.metrics is None else status.metrics.sampled_curve(sample)
    if not curve:
        return None
    steps = np.array(sorted(curve))
    losses = np.array([curve[k] for k in steps.tolist()])
    return steps, _running_mean(losses, max(1, len(steps) // 50))


def _member_lines(axes, statuses: dict[str, MemberStatus], curves: dict) -> None:
    """Each member's loss (raw, faint, and a running mean); X where an attempt was lost, o where
    the next one resumed from a checkpoint, ^ where a clone branched off."""
    for name, s in statuses.items():
        metrics = s.metrics
        if curves[name] is None or metrics is None:  # a curve comes from the member's metrics
            continue
        steps, smooth = curves[name]
        (line,) = axes.plot(steps, [metrics.curve[k] for k in steps.tolist()], linewidth=0.6, alpha=0.25)
        color = line.get_color()
        axes.plot(steps, smooth, color=color, linewidth=1.6, label=name)
        at = dict(zip(steps.tolist(), smooth, strict=True))
        if steps[0] > 0:  # a clone: its curve branches off its source's at the fork
            axes.plot(steps[0], smooth[0], "^", color=color, markersize=9, markeredgecolor="black")
        spans = sorted(metrics.attempt_spans.values())
        for (_, died), (resumed, _) in itertools.pairwise(spans):
            axes.axvline(died, color=color, linestyle=":", linewidth=1)
            axes.plot(died, at.get(died, np.nan), "X", color=color, markersize=10, markeredgecolor="black")
            axes.plot(resumed, at.get(resumed, np.nan), "o", color=color, markersize=8, markeredgecolor="black")


def _family_bands(axes, statuses: dict[str, MemberStatus], curves: dict) -> int:
    """Per family, the median of its members' smoothed losses and the band from the 10th to the
    90th percentile, on a common grid of steps; then the best members' own lines. The number of
    families."""
    from matplotlib.lines import Line2D

    groups = group_by_family(statuses.values())
    colors = {family: f"C{i % 10}" for i, family in enumerate(groups)}
    for i, (family, members) in enumerate(groups.items()):
        drawn = [curves[s.name] for s in members if curves[s.name] is not None]
        if not drawn:
            continue
        lo, hi = min(int(steps[0]) for steps, _ in drawn), max(int(steps[-1]) for steps, _ in drawn)
        grid = np.unique(np.linspace(lo, hi, GRID_POINTS).round().astype(int))
        values = np.vstack([np.interp(grid, steps, smooth, left=np.nan, right=np.nan) for steps, smooth in drawn])
        with warnings.catch_warnings():  # columns where only some members have values are fine
            warnings.simplefilter("ignore", RuntimeWarning)
            low, median, high = np.nanpercentile(values, [10, 50, 90], axis=0)
        label = f"{family} ({len(members)})" if i < LEGEND_FAMILIES else None
        axes.fill_between(grid, low, high, color=colors[family], alpha=0.2, linewidth=0)
        axes.plot(grid, median, color=colors[family], linewidth=1.8, label=label)
    if len(groups) > LEGEND_FAMILIES:
        more = f"+ {len(groups) - LEGEND_FAMILIES} more families"
        axes.add_line(Line2D([], [], linestyle="none", label=more))
    best = [s for s in best_members(statuses.values(), len(statuses)) if curves[s.name] is not None][:BEST_DRAWN]
    for s, style in zip(best, ("--", "-.", ":"), strict=False):
        steps, smooth = curves[s.name]
        color = colors[family_of(s.name, s.family)]
        axes.plot(steps, smooth, color=color, linestyle=style, linewidth=0.9, label=f"best: {s.name} ({s.loss:.3g})")
    return len(groups)


def _timeline(axes, statuses: dict[str, MemberStatus]) -> None:
    """Failures, lost attempts, preemptions and resumes over wall time, one row per member,
    families separated by lines and named on the axis."""
    starts = [s.since for s in statuses.values() if s.since is not None]
    origin = min(starts, default=0.0)
    groups = group_by_family(statuses.values())
    rows = {s.name: i for i, s in enumerate(s for members in groups.values() for s in members)}
    for kind in TIMELINE_KINDS:
        points = [(t - origin, rows[s.name]) for s in statuses.values() for t, k in s.timeline if k == kind]
        if points:
            marker, color = _KIND_STYLE[kind]
            x, y = zip(*points, strict=True)
            axes.scatter(x, y, marker=marker, color=color, s=18, label=f"{kind} ({len(points)})", zorder=3)
    edges = np.cumsum([0, *(len(members) for members in groups.values())])
    for edge in edges[1:-1]:
        axes.axhline(edge - 0.5, color="grey", linewidth=0.5)
    if len(groups) <= 2 * LEGEND_FAMILIES:
        axes.set_yticks((edges[:-1] + edges[1:] - 1) / 2, list(groups), fontsize="small")
    axes.set_ylim(len(statuses) - 0.5, -0.5)
    axes.set_xlim(left=0)
    axes.set_xlabel("wall time since the run started (s)")
    axes.set_ylabel("member")
    if axes.collections:
        axes.legend(fontsize="small", loc="upper right", framealpha=0.85)
    else:
        axes.text(0.5, 0.5, "no failures, preemptions or resumes", transform=axes.transAxes, ha="center")


def _running_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean over the last ``window`` values (fewer at the start), so the curve keeps its length."""
    sums = np.cumsum(np.insert(values, 0, 0.0))
    index = np.arange(1, len(values) + 1)
    start = np.maximum(index - window, 0)
    return (sums[index] - sums[start]) / (index - start)
