"""``resilient-flows mlc generate | train``: build the recommender's training set through Parsl, then fit it.

Labelling one parameter set runs the simulator's search (seconds), so a training set of thousands
is a campaign: chunks of parameter sets go to Parsl apps on a site (the local one by default, a
cluster's for a large set), and rows are appended to the output as chunks finish, so that an
interrupted generation keeps what it labelled and a second call adds to it.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import as_completed
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from resilient_flows.errors import WorkflowError
from resilient_flows.mlc.dataset import read_rows, sample_params, write_rows
from resilient_flows.mlc.recommender import fit

__all__ = ["add_mlc_parser", "generate"]


def generate(
    samples: int,
    out: Path,
    site: str = "local",
    seed: int = 0,
    trials: int = 400,
    chunk: int = 4,
    console: Console | None = None,
) -> int:
    """Label ``samples`` parameter sets (drawn with ``seed``) on ``site``; rows appended to ``out``."""
    import parsl  # Parsl and torch: only when labels are generated, not for `resilient-flows --help`

    from resilient_flows.apps import mlc_label_app
    from resilient_flows.sites import load_site

    if samples < 1 or chunk < 1 or trials < 1:
        raise WorkflowError(f"samples, chunk and trials must be >= 1, got {samples}, {chunk}, {trials}")
    console = console or Console()
    params = [asdict(p) for p in sample_params(samples, seed)]
    out.parent.mkdir(parents=True, exist_ok=True)
    config = load_site(site, run_dir=str(out.parent / f"{out.stem}.parsl"))
    started, done = time.monotonic(), 0
    with parsl.load(config):
        futures = [mlc_label_app(params[i : i + chunk], trials, seed) for i in range(0, samples, chunk)]
        for future in as_completed(futures):
            done += write_rows(future.result(), out)
            console.print(f"{done}/{samples} labelled ({time.monotonic() - started:.0f} s)")
    return done


def add_mlc_parser(subparsers: argparse._SubParsersAction) -> None:
    mlc = subparsers.add_parser("mlc", help="build and train the checkpoint-interval recommender")
    sub = mlc.add_subparsers(required=True, metavar="ACTION")
    gen = sub.add_parser("generate", help="label random parameter sets with the simulator's optimum, via Parsl")
    gen.add_argument("--samples", type=int, required=True, help="how many parameter sets")
    gen.add_argument("--out", type=Path, required=True, help="JSON-lines file the rows are appended to")
    gen.add_argument("--site", default="local", help="a site name or site YAML file (default: local)")
    gen.add_argument("--seed", type=int, default=0, help="draws the parameter sets (default 0)")
    gen.add_argument("--trials", type=int, default=400, help="simulated runs per candidate in the search")
    gen.add_argument("--chunk", type=int, default=4, help="parameter sets per Parsl task")
    gen.set_defaults(handler=_generate)
    train = sub.add_parser("train", help="fit a random forest and an MLP, keep the better, save it as JSON")
    train.add_argument("data", nargs="+", type=Path, help="files written by 'mlc generate'")
    train.add_argument("--out", type=Path, required=True, help="the model file (JSON)")
    train.add_argument("--seed", type=int, default=0)
    train.set_defaults(handler=_train)


def _generate(args: argparse.Namespace) -> int:
    done = generate(args.samples, args.out, args.site, args.seed, args.trials, args.chunk)
    return 0 if done == args.samples else 1


def _train(args: argparse.Namespace) -> int:
    pairs = [pair for path in args.data for pair in read_rows(path)]
    if len(pairs) < 10:
        raise WorkflowError(f"{len(pairs)} training rows in {', '.join(map(str, args.data))}; at least 10 are needed")
    model, errors = fit([p for p, _ in pairs], [c for _, c in pairs], seed=args.seed)
    model.save(args.out)
    shown = ", ".join(f"{kind} {error:.4f}" for kind, error in errors.items())
    Console().print(f"{len(pairs)} rows; validation error (log targets): {shown}; kept the {model.kind}: {args.out}")
    return 0
