"""The members a chaos run trains and their fault-free weights, against which every digest is
judged. Parsl workers import :func:`paced` as ``chaos:paced``: ``benchmarks/chaos.py`` re-exports
it, and the harness puts ``benchmarks/`` on the workers' ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from chaoslib.config import BENCH_DIR, GATE_ENV, LOOK_S, PEER_CHECKPOINTS, gate_of

#: The share of its steps after which a member of a held run waits at the gate, and how long at most.
HOLD_AT = 0.8
GATE_WAIT_S = 300.0


def paced(ctx: Any) -> dict[str, Any]:
    """``chaos:paced``: the built-in ``mlp-digits`` member, with a pause of ``pause_ms`` after each step.

    Tests need members that live long enough for a whole chaos schedule (or a node to be lost
    between two checkpoints) without filling two cores, and a reference they can train in their
    own process in seconds: the pause costs no CPU and changes no weight, so the reference trains
    with ``pause_ms: 0``, and a member spanning nodes trains as the built-in does (DDP, FSDP).
    Where the harness names a gate (:data:`GATE_ENV`, for a :attr:`Config.hold` run), a member
    waits after :data:`HOLD_AT` of its steps until the gate exists: on a loaded machine, where
    recoveries take minutes, members would otherwise finish before the last faults found a
    target. The wait changes no weight either. A member spanning nodes waits at its own gate
    (:func:`gate_of`), which opens once the node losses struck, and only after
    :data:`PEER_CHECKPOINTS` checkpoint intervals of its attempt: a node loss strikes it once the
    buddy holds copies of its attempt's checkpoints.
    """
    from resilient_flows.training._workloads import resolve_workload

    pause_s = float(ctx.params.get("pause_ms", 0)) / 1000
    spanning = ctx.spec.nodes > 1
    gate = os.environ.get(GATE_ENV)
    gate = gate and str(gate_of(Path(gate), spanning))
    before_hold = PEER_CHECKPOINTS * (ctx.spec.checkpoint.interval_steps or 0) if spanning else 0
    steps = ctx.steps

    def paced_steps(total: int) -> Iterator[int]:
        hold = int(total * HOLD_AT) if gate else None
        first = None
        for step in steps(total):
            first = step if first is None else first
            if hold is not None and step >= max(hold, first + before_hold):
                opens = time.monotonic() + GATE_WAIT_S  # a harness that died opens nothing
                while not os.path.exists(gate) and time.monotonic() < opens:
                    time.sleep(LOOK_S)
                hold = None
            yield step
            time.sleep(pause_s)

    ctx.steps = paced_steps
    return resolve_workload("mlp-digits").train(ctx)


def fault_free_digests(workflow: Path, out: Path) -> dict[str, str]:
    """Every member of ``workflow`` trained without faults or pauses; digest by name. A member of
    one rank trains in this process, one of several ranks (spanning nodes) on as many processes of
    this machine (:func:`ranks_digest`)."""
    from resilient_flows.training import run_member
    from resilient_flows.workflow import load_workflow

    out.mkdir(parents=True, exist_ok=True)
    digests = {}
    for spec in load_workflow(workflow).member_specs(None):
        quiet = replace(spec, faults=(), params={**spec.params, "pause_ms": 0})
        if spec.ranks > 1:
            digests[spec.name] = ranks_digest(quiet.to_dict(), spec.ranks, out)
        else:
            digests[spec.name] = run_member(quiet.to_dict(), str(out))["digest"]
    return digests


def ranks_digest(spec: dict[str, Any], ranks: int, out: Path) -> str:
    """The digest of a member of several ranks trained here, each rank a process started as
    ``torchrun`` would (``RANK``, ``WORLD_SIZE``, rank 0 on this machine's loopback). Its ranks
    average their gradients as they do across nodes: two ranks' sum is the same in either order."""
    path = out / f"{spec['name']}.spec.json"
    path.write_text(json.dumps(spec))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pythonpath = os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "resilient_flows.training.mpi_member", str(path), str(out)]
    processes = []
    with (out / f"{spec['name']}.log").open("ab") as log:
        for rank in range(ranks):
            env = {**os.environ, "PYTHONPATH": pythonpath, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            env.update(RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(ranks))
            for name in [n for n in env if n.startswith(("SLURM_", "OMPI_", "PMI_", "PALS_"))]:
                del env[name]  # no other launcher's word
            processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
        try:
            statuses = [process.wait(timeout=600) for process in processes]
        finally:
            for process in processes:
                process.kill()
    if any(statuses):
        raise RuntimeError(f"reference of {spec['name']} on {ranks} ranks failed {statuses}; see {log.name}")
    return json.loads((out / "members" / spec["name"] / "result.json").read_text())["digest"]
