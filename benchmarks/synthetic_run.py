"""A run directory of many members, written as a real run writes it, without training anything.

The dashboard's benchmark, its browser tests and the docs' screenshots need runs of a thousand
members; training a thousand models on two cores takes hours. This writes the same files a run
does, through the library's own writers (the plan from a real workflow, ``EventLog``,
``MetricsLog``, member specs), with loss curves of a plausible shape, failures that are retried
and resumed, preemptions and clones. ``--live`` keeps appending, at a given pace per member, for
measuring the dashboard while a run goes on.

    python benchmarks/synthetic_run.py RUN_DIR --members 1000 [--steps 2000] [--live SECONDS]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
import time
from pathlib import Path

import yaml

from resilient_flows.rundir import EventLog, MetricsLog, member_layout
from resilient_flows.training import MemberSpec, ParentSpec, register_member
from resilient_flows.workflow import Workflow, plan_workflow
from resilient_flows.workflow._recorded_plan import create_run_dir

FAMILIES = ("mlp-small", "mlp-wide", "cnn", "cnn-deep")
#: Steps between two checkpoints.
INTERVAL = 200


def plan_run(path: Path, members: int, steps: int) -> list[MemberSpec]:
    """Create ``path`` as a run of ``members`` members in :data:`FAMILIES`; their specs."""
    per = [members // len(FAMILIES) + (i < members % len(FAMILIES)) for i in range(len(FAMILIES))]
    document = {
        "name": f"synthetic-{members}",
        "site": "local",
        "checkpoint": {"interval": INTERVAL},
        "members": [
            {
                "name": family,
                "workload": "cnn-digits" if family.startswith("cnn") else "mlp-digits",
                "steps": steps,
                "count": n,
            }
            for family, n in zip(FAMILIES, per, strict=True)
            if n
        ],
    }
    text = yaml.safe_dump(document, sort_keys=False)
    plan = plan_workflow(Workflow.model_validate(document), build_site=False)
    create_run_dir(path, plan, text)
    return list(plan.members)


@dataclasses.dataclass
class Member:
    """A member's simulated progress."""

    spec: MemberSpec
    shape: tuple[float, float, float]
    fail_at: int | None
    log: MetricsLog
    step: int = -1
    saved: int = -1
    attempt: int = 0
    done: bool = False

    def loss(self, step: int) -> float:
        start, rate, floor = self.shape
        wiggle = 0.03 * math.sin(step / 37.0 + rate * 1000)
        return floor + (start - floor) * math.exp(-rate * step) * (1 + wiggle)


class SyntheticRun:
    """Members advancing step by step, writing what a real run writes."""

    def __init__(self, path: Path, specs: list[MemberSpec], failures: float = 0.04, seed: int = 0) -> None:
        self.path = path
        self.events = EventLog(path)
        rng = random.Random(seed)
        self.rng = rng
        self.members = []
        for spec in specs:
            family_speed = 1 + FAMILIES.index(spec.family) * 0.4 if spec.family in FAMILIES else 1
            shape = (2.3 + rng.random() * 0.3, family_speed * (0.6 + rng.random()) * 2e-3, 0.02 + rng.random() * 0.2)
            fail_at = rng.randrange(INTERVAL, spec.steps) if rng.random() < failures else None
            log = MetricsLog(member_layout(path, spec.name).metrics)
            self.members.append(Member(spec, shape, fail_at, log))
        self.clock = time.time()
        self.step_s = 0.1  # simulated seconds per step
        for member in self.members:
            self.events.emit("submitted", member.spec.name, ranks=1, parent=None, time=self.clock)
        self.hosts = [f"node{n:03d}" for n in range(max(1, len(specs) // 8))]

    def start(self, member: Member) -> None:
        member.attempt += 1
        host = self.hosts[hash(member.spec.name) % len(self.hosts)]
        block = str(self.hosts.index(host) // 4)
        when = self.clock
        self.events.emit(
            "started", member.spec.name, attempt=member.attempt, host=host, pid=1000, block=block, time=when
        )
        if member.step >= 0:
            self.events.emit("resumed", member.spec.name, attempt=member.attempt, step=member.step, time=when)

    def advance(self, steps: int) -> int:
        """Every unfinished member trains ``steps`` steps more, :attr:`step_s` simulated seconds
        each from :attr:`clock` on; how many are still training."""
        training = 0
        for member in self.members:
            if member.done:
                continue
            if member.attempt == 0:
                self.start(member)
            name = member.spec.name
            for i in range(steps):
                step, now = member.step + 1, self.clock + i * self.step_s
                member.log.append({"step": step, "attempt": member.attempt, "time": now, "loss": member.loss(step)})
                if (step + 1) % INTERVAL == 0:
                    member.log.flush()
                    stall = round(1.2 + self.rng.random(), 3)
                    self.events.emit("checkpointed", name, step=step, stall_ms=stall, time=now)
                    member.saved = step
                if member.fail_at is not None and step == member.fail_at:
                    member.log.flush()
                    member.fail_at = None
                    error = "WorkerLost: Task failure due to loss of worker 3 on host " + self.hosts[0]
                    cause = "lost after progress"
                    self.events.emit("failed", name, attempt=member.attempt, error=error, cause=cause, time=now)
                    resume = member.saved
                    self.events.emit("retried", name, attempt=member.attempt + 1, from_step=resume, time=now)
                    member.step = resume
                    self.start(member)
                    break
                member.step = step
                if step + 1 >= member.spec.steps:
                    member.log.flush()
                    member.done = True
                    loss = member.loss(step)
                    self.events.emit("finished", name, attempt=member.attempt, step=step, loss=loss, time=now)
                    break
            member.log.flush()
            training += not member.done
        self.clock += steps * self.step_s
        return training

    def clone(self, source: Member, count: int) -> None:
        """Register ``count`` clones of ``source`` as the clone command does, seeded at its step."""
        request = f"r{len(self.members)}"
        names = [f"{source.spec.name}.c{i + 1}" for i in range(count)]
        self.events.emit("clone_requested", source.spec.name, request=request, clones=names, overrides={})
        for i, name in enumerate(names):
            parent = ParentSpec(source.spec.name, request, {"lr": round(0.01 * (i + 1), 3)}, time.time())
            spec = dataclasses.replace(source.spec, name=name, parent=parent)
            register_member(self.path, spec)
            member_layout(self.path, name).write_seed(
                {"parent": source.spec.name, "step": source.step, "transport": "p2p"}
            )
            clone = Member(
                spec, source.shape, None, MetricsLog(member_layout(self.path, name).metrics), step=source.step
            )
            self.members.append(clone)
            self.events.emit(
                "cloned", name, parent=source.spec.name, request=request, step=source.step, transport="p2p"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--done", type=float, default=1.0, help="fraction of the steps written before --live")
    parser.add_argument("--live", type=float, default=0.0, help="then keep appending for this many seconds")
    parser.add_argument("--pace", type=float, default=10.0, help="--live: steps per second per member")
    args = parser.parse_args(argv)
    specs = plan_run(args.run_dir, args.members, args.steps)
    run = SyntheticRun(args.run_dir, specs)
    written = int(args.steps * args.done)
    run.clock = time.time() - written * run.step_s
    run.advance(written // 2)
    run.clone(run.members[0], 2)
    run.advance(written - written // 2)
    run.step_s = 1 / args.pace
    deadline = time.monotonic() + args.live
    while time.monotonic() < deadline:
        run.clock = time.time()
        if not run.advance(max(1, round(args.pace))):
            break
        time.sleep(max(0.0, 1.0 - (time.time() - run.clock)))
    print(args.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
