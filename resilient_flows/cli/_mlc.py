"""``resilient-flows mlc generate | train``: build the recommender's training set through Parsl, then fit it."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from resilient_flows.cli._console import print_document
from resilient_flows.errors import WorkflowError

#: The version of the ``mlc train --json`` document; README.md ("Output for scripts") lists its fields.
TRAIN_VERSION = 1


def add_parsers(commands: argparse._SubParsersAction) -> None:
    mlc = commands.add_parser("mlc", help="build and train the checkpoint-interval recommender")
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
    train.add_argument(
        "--json", action="store_true", help="print a JSON document for scripts instead (README: Output for scripts)"
    )
    train.set_defaults(handler=_train)


def _generate(args: argparse.Namespace) -> int:
    from resilient_flows.workflow import generate

    done = generate(args.samples, args.out, args.site, args.seed, args.trials, args.chunk)
    return 0 if done == args.samples else 1


def _train(args: argparse.Namespace) -> int:
    from resilient_flows.mlc import fit, read_rows

    pairs = [pair for path in args.data for pair in read_rows(path)]
    if len(pairs) < 10:
        raise WorkflowError(f"{len(pairs)} training rows in {', '.join(map(str, args.data))}; at least 10 are needed")
    model, errors = fit([p for p, _ in pairs], [c for _, c in pairs], seed=args.seed)
    model.save(args.out)
    if args.json:
        print_document(
            {
                "version": TRAIN_VERSION,
                "rows": len(pairs),
                "validation_error": dict(errors),
                "kept": model.kind,
                "model": str(args.out),
            }
        )
        return 0
    shown = ", ".join(f"{kind} {error:.4f}" for kind, error in errors.items())
    Console().print(f"{len(pairs)} rows; validation error (log targets): {shown}; kept the {model.kind}: {args.out}")
    return 0
