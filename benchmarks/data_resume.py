"""Data-exact resume across kills and rank counts: ``ctx.loader`` side by side with a plain DataLoader.

    python benchmarks/data_resume.py --quick [--json PATH]     # under a minute on a quiet machine
    python benchmarks/data_resume.py         [--json PATH]     # the same checks under mpiexec: minutes
    python benchmarks/data_resume.py --full  [--json PATH]

Three measurements, each of the resumable loader (``ctx.loader``) and of the baseline (a
``DataLoader`` with a shuffling ``DistributedSampler``, whose epoch restarts on resume), in the same run:

1. **Samples.** A member is launched under ``mpiexec`` on 4 ranks, SIGKILLed mid-epoch, resumed on 3
   ranks and preempted (SIGTERM) mid-epoch, resumed on 2 and SIGKILLed, and finished on 4, with
   ``num_workers=2``. Every rank logs the id of every sample it trains; the steps that survive (those
   of the last attempt that trained each step) give, per epoch, the samples trained twice
   (``duplicated``) and never (``skipped``), and whether a sample trained on two rank counts had
   the same random augmentation both times. The last attempt's dataset reads against the samples it
   trained tell whether the resume loaded the skipped part of its epoch (an O(1) resume loads none).
2. **Weights.** Where the layout does not change (2 ranks, killed and resumed on 2), the final
   weights' digest against an uninterrupted run's.
3. **Latency.** In one process, the time from a restored position to the first batch (2 workers),
   at positions from 0 to 95 % of an epoch and for two epoch lengths, against the epoch's own
   loading time, for the resumable loader and for the exact alternative to it that Hugging Face's
   Trainer uses: iterating over the skipped batches.

``--quick`` runs the same chains with the same faults, but forks each attempt's ranks
(``torchrun``-style) from this process, which imported torch once (:mod:`forked_ranks`): a rank
starts at the member's entry point in milliseconds instead of seconds of imports, and its state
comes from the checkpoint on disk as after any launch. It times one epoch length at three
positions. The default and ``--full`` launch every attempt under ``mpiexec``, as a workflow's
members are, several chains at a time (one per 4 CPUs, at least two); the latency rounds run
after them, alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

import data_resume_member as member  # noqa: E402
import forked_ranks  # noqa: E402

from resilient_flows.checkpoint import CheckpointConfig  # noqa: E402
from resilient_flows.training import MemberSpec  # noqa: E402

POSITIONS = (0.0, 0.25, 0.5, 0.75, 0.95)
DEFAULT = {
    "samples": 100,
    "batch": 12,
    "epochs": 3,
    "chain": [(4, ["kill", 6]), (3, ["preempt", 13]), (2, ["kill", 22]), (4, None)],
    "same": [(2, ["kill", 10]), (2, ["preempt", 17]), (2, None)],
    "lengths": [2000, 8000],
    "positions": POSITIONS,
    "rounds": 3,
    "launcher": "mpiexec",
}
QUICK = {**DEFAULT, "lengths": [4000], "positions": (0.0, 0.5, 0.95), "launcher": "fork"}
FULL = {
    "samples": 1000,
    "batch": 24,
    "epochs": 4,
    "chain": [(4, ["kill", 30]), (3, ["preempt", 61]), (2, ["kill", 100]), (4, ["preempt", 140]), (3, None)],
    "same": [(4, ["kill", 50]), (4, ["kill", 120]), (4, None)],
    "lengths": [4000, 16000, 64000],
    "positions": POSITIONS,
    "rounds": 5,
    "launcher": "mpiexec",
}
SAMPLE_S = 0.0001  # what one sample costs to load: a decode, an augmentation
BATCH = 32


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)]), "OMP_NUM_THREADS": "1"}


def run_chain(root: Path, name: str, setup: dict[str, Any], attempts: list, plain: bool) -> dict[str, Any]:
    """Launch the attempts of one member, each on its rank count with its fault; its ledger."""
    faults = {str(i + 1): fault for i, (_, fault) in enumerate(attempts) if fault is not None}
    params = {"samples": setup["samples"], "batch": setup["batch"], "workers": 2, "plain": plain, "faults": faults}
    per_epoch = -(-setup["samples"] // setup["batch"])
    spec = MemberSpec(
        name=name,
        workload="data_resume_member:train",
        params=params,
        seed=5,
        steps=per_epoch * setup["epochs"],
        checkpoint=CheckpointConfig(interval_steps=4),
    )
    launches = []
    for ranks, _ in attempts:
        path = root / f"{name}-{len(launches) + 1}.json"
        path.write_text(json.dumps(replace(spec, ranks=ranks).to_dict()))
        launches.append({"ranks": ranks, "exit": launch(path, root, ranks, setup["launcher"])})
    directory = root / "run" / "members" / name
    return {"launches": launches, "directory": directory, "per_epoch": per_epoch}


def launch(path: Path, root: Path, ranks: int, launcher: str) -> int:
    """One attempt of the member of ``path`` on ``ranks`` ranks; its exit status."""
    if launcher == "fork":
        return forked_ranks.run_forked(path, root / "run", ranks, path.with_suffix(".log"))
    command = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "resilient_flows.training.mpi_member"]
    done = subprocess.run([*command, str(path), str(root / "run")], env=_env(), capture_output=True, timeout=600)
    return done.returncode


def samples_report(chain: dict[str, Any], setup: dict[str, Any]) -> dict[str, Any]:
    directory, epochs = chain["directory"], setup["epochs"]
    per_epoch = member.ledger(directory, setup["samples"], epochs)
    last = len(chain["launches"])
    trained_by_last = sum(len(row["ids"]) for path in directory.glob(f"ids-a{last}-r*.jsonl") for row in _rows(path))
    result = json.loads((directory / "result.json").read_text()) if (directory / "result.json").exists() else {}
    return {
        "ranks": [launch["ranks"] for launch in chain["launches"]],
        "exits": [launch["exit"] for launch in chain["launches"]],
        "finished": result.get("step") == chain["per_epoch"] * epochs - 1,
        "per_epoch": per_epoch,
        "duplicated_total": sum(epoch["duplicated"] for epoch in per_epoch),
        "skipped_total": sum(epoch["skipped"] for epoch in per_epoch),
        "augmentation_same_on_every_rank_count": member.augmentations_agree(directory),
        "last_attempt_samples_loaded": len(member.loaded(directory, last)),
        "last_attempt_samples_trained": trained_by_last,
        "resumes": member.resumes(directory),
        "digest": result.get("digest"),
    }


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def exactness(setup: dict[str, Any], root: Path) -> dict[str, Any]:
    """The chains of both loaders, and the same-layout pairs, several launches at a time."""
    uninterrupted = [(setup["same"][-1][0], None)]
    jobs = {
        "resumable": ("chain", setup["chain"], False),
        "plain": ("chain-plain", setup["chain"], True),
        "resumable_same": ("same", setup["same"], False),
        "resumable_reference": ("reference", uninterrupted, False),
        "plain_same": ("same-plain", setup["same"], True),
        "plain_reference": ("reference-plain", uninterrupted, True),
    }
    if setup["launcher"] == "fork":  # forked from this process's only thread: one launch at a time
        chains = {key: run_chain(root, name, setup, attempts, plain) for key, (name, attempts, plain) in jobs.items()}
    else:
        with ThreadPoolExecutor(max(2, (os.cpu_count() or 1) // 4)) as pool:  # a launch runs up to 4 ranks
            futures = {
                key: pool.submit(run_chain, root, name, setup, attempts, plain)
                for key, (name, attempts, plain) in jobs.items()
            }
            chains = {key: future.result() for key, future in futures.items()}
    out: dict[str, Any] = {}
    for loader in ("resumable", "plain"):
        report = samples_report(chains[loader], setup)
        same = samples_report(chains[f"{loader}_same"], setup)
        reference = samples_report(chains[f"{loader}_reference"], setup)
        report["same_layout"] = {
            "ranks": same["ranks"],
            "duplicated_total": same["duplicated_total"],
            "skipped_total": same["skipped_total"],
            "weights_bitwise_equal_to_uninterrupted": same["digest"] is not None
            and same["digest"] == reference["digest"],
        }
        out[loader] = report
    return out


class _Costly:
    """A dataset whose samples take :data:`SAMPLE_S` each to load."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        time.sleep(SAMPLE_S)
        return index


def _first_batch_s(length: int, position: float, resumable: bool) -> float:
    """Seconds from a fresh loader at ``position`` of epoch 3 to its first batch, 2 workers."""
    import torch
    from torch.utils.data import DataLoader

    from resilient_flows.training import ResumableLoader

    start = int(length * position) // BATCH * BATCH
    began = time.perf_counter()
    if resumable:
        loader = ResumableLoader(_Costly(length), BATCH, shuffle=True, seed=1, num_workers=2)
        loader.load_state_dict({"epoch": 3, "position": start, "seed": 1, "shuffle": True, "length": length})
        batches = iter(loader)
        next(batches)
    else:  # exact without a position: skip the epoch's first batches by loading them
        loader = DataLoader(_Costly(length), BATCH, shuffle=True, num_workers=2, generator=torch.Generator())
        batches = iter(loader)
        for _ in range(start // BATCH + 1):
            next(batches)
    took = time.perf_counter() - began
    del batches  # its workers stop here, outside the time taken
    return took


def _epoch_s(length: int) -> float:
    """Seconds to load a whole epoch with 2 workers: what a restarted epoch costs."""
    from torch.utils.data import DataLoader

    began = time.perf_counter()
    for _ in DataLoader(_Costly(length), BATCH, shuffle=True, num_workers=2):
        pass
    return time.perf_counter() - began


def latency(setup: dict[str, Any]) -> dict[str, Any]:
    """Median first-batch time per epoch length and position, against the epoch's loading time."""
    rows = []
    for length in setup["lengths"]:
        epoch_s = statistics.median(_epoch_s(length) for _ in range(setup["rounds"]))
        for position in setup["positions"]:
            timed = {kind: [] for kind in ("resumable", "skip_by_iterating")}
            for _ in range(setup["rounds"]):
                timed["resumable"].append(_first_batch_s(length, position, True))
                timed["skip_by_iterating"].append(_first_batch_s(length, position, False))
            medians = {kind: statistics.median(values) for kind, values in timed.items()}
            rows.append(
                {
                    "epoch_samples": length,
                    "epoch_s": epoch_s,
                    "position": position,
                    "resumable_s": medians["resumable"],
                    "skip_by_iterating_s": medians["skip_by_iterating"],
                    "resumable_over_epoch": medians["resumable"] / epoch_s,
                    "skip_by_iterating_over_epoch": medians["skip_by_iterating"] / epoch_s,
                }
            )
    for row in rows:  # against the same loader at the epoch's start
        start = next(r for r in rows if r["epoch_samples"] == row["epoch_samples"] and r["position"] == 0.0)
        row["resumable_over_position_0"] = row["resumable_s"] / start["resumable_s"]
        row["skip_by_iterating_over_position_0"] = row["skip_by_iterating_s"] / start["skip_by_iterating_s"]
    return {"sample_s": SAMPLE_S, "rounds": setup["rounds"], "rows": rows}


def print_report(report: dict[str, Any]) -> None:
    print(f"{report['mode']}, ranks launched by {report['launcher']}; machine load at start: {report['load']}")
    for loader in ("resumable", "plain"):
        got = report["exactness"][loader]
        print(
            f"\n{loader}: ranks {' -> '.join(map(str, got['ranks']))}, exits {got['exits']}, finished {got['finished']}"
        )
        for epoch in got["per_epoch"]:
            print(
                f"  epoch {epoch['epoch']}: trained {epoch['trained']:5d}  duplicated {epoch['duplicated']:4d}  "
                f"skipped {epoch['skipped']:4d}"
            )
        print(f"  augmentation the same on every rank count: {got['augmentation_same_on_every_rank_count']}")
        print(
            f"  last attempt: loaded {got['last_attempt_samples_loaded']} samples, trained "
            f"{got['last_attempt_samples_trained']}"
        )
        same = got["same_layout"]
        print(
            f"  same layout {' -> '.join(map(str, same['ranks']))}: duplicated {same['duplicated_total']}, skipped "
            f"{same['skipped_total']}, weights bitwise equal to uninterrupted: "
            f"{same['weights_bitwise_equal_to_uninterrupted']}"
        )
    print("\nfirst batch after a resume (median), x the epoch's loading time and x the same at position 0:")
    print("  samples  position   resumable           skip-by-iterating")
    for row in report["latency"]["rows"]:
        print(
            f"  {row['epoch_samples']:7d}  {row['position']:8.2f}   "
            f"{row['resumable_over_epoch']:6.3f} ep  {row['resumable_over_position_0']:5.2f}x   "
            f"{row['skip_by_iterating_over_epoch']:6.3f} ep  {row['skip_by_iterating_over_position_0']:5.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the default's chains on forked ranks, one epoch length")
    size.add_argument("--full", action="store_true", help="a longer chain of five attempts, three epoch lengths")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    mode = "full" if args.full else "quick" if args.quick else "default"
    setup = {"full": FULL, "quick": QUICK, "default": DEFAULT}[mode]
    began = time.perf_counter()
    if setup["launcher"] == "fork":
        forked_ranks.warm()  # before anything starts a thread or a worker here
    report: dict[str, Any] = {"mode": mode, "launcher": setup["launcher"], "load": os.getloadavg()}
    with TemporaryDirectory(prefix="data-resume-") as tmp:
        report["exactness"] = exactness(setup, Path(tmp))
    for loader in report["exactness"].values():
        loader.pop("directory", None)
    report["latency"] = latency(setup)
    report["wall_s"] = time.perf_counter() - began
    print_report(report)
    print(f"\n{report['wall_s']:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
