"""A batch job that the preemption agent can preempt without losing it: the smallest complete example.

It trains (a deterministic stand-in for a model's update), checkpoints every ``--every`` steps
through :class:`~resilient_flows.checkpoint.Checkpointer` (whose heartbeat, and under Slurm the
job comment pointing at it, is what the agent chooses victims by), and on ``SIGUSR1`` commits a
checkpoint of the step it is in and exits 75. Requeued, it runs again from the top of its batch
script, restores and carries on; its final weights equal an uninterrupted run's, bit for bit.

``--no-signal-checkpoint`` makes it exit at once on the signal instead, as a job does whose state
cannot be written within the scheduler's grace time: it then loses the work since its newest
checkpoint, which is what the agent's policy weighs. ::

    sbatch -n1 --requeue --wrap "python -m resilient_flows.examples.preemptible RUN --steps 1000 --every 50"
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from resilient_flows.training import EXIT_PREEMPTED

__all__ = ["PREEMPTED", "STATE", "main", "step_weights", "train"]

STATE = 1 << 12
#: The exit status of a job that stopped to be requeued (``EX_TEMPFAIL``), as workflow members use.
PREEMPTED = EXIT_PREEMPTED


def step_weights(w: np.ndarray, step: int) -> None:
    """One step of "training": a deterministic update that depends on the step and on ``w``."""
    rng = np.random.default_rng(step)
    w += 1e-3 * np.tanh(rng.standard_normal(w.shape) - 0.5 * w)


def train(steps: int) -> np.ndarray:
    """The weights after ``steps`` uninterrupted steps: the reference a preempted run must equal."""
    w = np.zeros(STATE)
    for step in range(steps):
        step_weights(w, step)
    return w


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("dir", type=Path, help="checkpoints in DIR/shared, final weights in DIR/final.npy")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--every", type=int, required=True, help="checkpoint every this many steps (and step 0)")
    parser.add_argument("--step-s", type=float, default=0.1, help="seconds a step takes (default 0.1)")
    parser.add_argument("--no-signal-checkpoint", action="store_true", help="exit on SIGUSR1 without a checkpoint")
    args = parser.parse_args(argv)

    from resilient_flows.checkpoint import Checkpointer

    stop: list[bool] = []
    signal.signal(signal.SIGUSR1, lambda *_: stop.append(True))
    state = {"w": np.zeros(STATE)}
    ckpt = Checkpointer(args.dir / "shared", keep=2)
    restored = ckpt.restore(state)
    start = 0 if restored is None else restored + 1
    with open(args.dir / "starts", "a") as f:  # what each run of the script resumed from, for the tests
        f.write(f"{-1 if restored is None else restored} {os.environ.get('SLURM_RESTART_COUNT', '0')} {time.time()}\n")
    for step in range(start, args.steps):
        step_weights(state["w"], step)
        time.sleep(args.step_s)
        if stop:
            if not args.no_signal_checkpoint:
                ckpt.save(step, state)
            ckpt.close()
            with open(args.dir / "stops", "a") as f:
                f.write(f"{step} {time.time()}\n")
            return PREEMPTED
        if step == 0 or (step + 1) % args.every == 0:
            ckpt.save(step, state)
    ckpt.close()
    np.save(args.dir / "final.npy", state["w"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
