"""What one training step of each size of the flagship GPT costs on this machine's CPU.

A step is what the member does between two ``ctx.steps()`` boundaries: forward and backward over
``batch`` windows of the size's context, gradient clipping, AdamW and the scheduler, on one
thread (a member's default ``threads: 1``); batches come from the same shuffled dataset, drawn
here without a ``DataLoader`` (its workers prefetch behind the step). Each figure is the median
over rounds after one warm-up step; beside it, the ratio to the tiny size's step measured in the
same run (absolute times on a shared machine move with its load, ratios much less), the
parameters and the bytes of a checkpoint's tensors (weights and AdamW's two moments, float32).

Run ``python benchmarks/gpt_sizes.py [--quick | --full] [--json PATH]``: ``--quick``: tiny and
small at batch 16, medium and large at batch 1, 3 rounds; default: 5 rounds; ``--full``: every
size at batch 16, 5 rounds. ``--sizes tiny,small`` measures those only.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import harness
import torch
from harness import options, size_of, with_units, write_json
from report import print_figures

from resilient_flows.examples.gpt import SIZES, Params, parameter_count
from resilient_flows.examples.gpt.data import ByteWindows, split
from resilient_flows.examples.gpt.schedule import warmup_cosine
from resilient_flows.examples.gpt.train import adamw, build_model

MODES = {  # rounds, and the batch of each size
    "quick": {"rounds": 3, "batch": {"tiny": 16, "small": 16, "medium": 1, "large": 1}},
    "default": {"rounds": 5, "batch": {"tiny": 16, "small": 16, "medium": 1, "large": 1}},
    "full": {"rounds": 5, "batch": dict.fromkeys(SIZES, 16)},
}


def step_seconds(size: str, batch: int, rounds: int) -> float:
    """The median of ``rounds`` timed steps of ``size`` at ``batch``, after one untimed step."""
    torch.manual_seed(0)
    p = {**Params().model_dump(), "size": size, "steps": rounds + 1}
    model = build_model(p)
    optimizer = adamw(model, p)
    scheduler = warmup_cosine(optimizer, p["warmup"], p["steps"], p["lr_floor"])
    data = ByteWindows(split()[0], model.config.block)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))
    times = []
    for step in range(rounds + 1):
        rows = [data[int(i)] for i in order[step * batch : (step + 1) * batch]]
        x, y = torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), p["clip"])
        optimizer.step()
        scheduler.step()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def main() -> int:
    parser, _ = options(__doc__, "tiny to large, 3 rounds", "every size at batch 16")
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated sizes (tiny must be one)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    mode = MODES[size_of(args)]
    sizes = args.sizes.split(",")
    torch.set_num_threads(1)
    figures: dict[str, Any] = {}
    labels: dict[str, tuple[str, str, str]] = {}
    for size in sizes:
        batch = mode["batch"][size]
        seconds = step_seconds(size, batch, mode["rounds"])
        tokens = batch * SIZES[size].block
        figures |= {
            f"{size}_parameters": parameter_count(SIZES[size]),
            f"{size}_state_mib": 12 * parameter_count(SIZES[size]) / 2**20,
            f"{size}_step_s": seconds,
            f"{size}_tokens_per_s": tokens / seconds,
        }
        labels |= {
            f"{size}_parameters": (size, "", "parameters"),
            f"{size}_state_mib": (size, "MiB", "weights + AdamW moments"),
            f"{size}_step_s": (size, "s", f"step at batch {batch} x {SIZES[size].block} bytes"),
            f"{size}_tokens_per_s": (size, "bytes/s", "trained per second"),
        }
    for size in sizes:
        if "tiny" in sizes and size != "tiny":
            per_token = figures["tiny_tokens_per_s"] / figures[f"{size}_tokens_per_s"]
            figures[f"{size}_per_byte_vs_tiny"] = per_token
            labels[f"{size}_per_byte_vs_tiny"] = (size, "x", "seconds per byte over tiny's")
    print_figures(harness.console(), figures, labels)
    if args.json is not None:
        write_json(args.json, {"mode": size_of(args), "figures": with_units(figures, labels)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
