"""The learning rate of GPT training: a linear warm-up, then a cosine decay to a floor.

A pure function of the step, wrapped in a ``LambdaLR`` whose state (its step count, the last
rates) a checkpoint holds, so a resumed member continues on the same curve.
"""

from __future__ import annotations

import functools
import math

import torch

__all__ = ["lr_factor", "warmup_cosine"]


def lr_factor(step: int, warmup: int, total: int, floor: float) -> float:
    """The fraction of the peak rate at ``step`` of ``total``: ``(step + 1) / warmup`` during the
    warm-up (no step at rate 0), then a half cosine from 1 to ``floor`` at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    decay = max(1, total - 1 - warmup)
    progress = min(1.0, (step - warmup) / decay)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_cosine(
    optimizer: torch.optim.Optimizer, warmup: int, total: int, floor: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler to step once after each optimizer step."""
    factor = functools.partial(lr_factor, warmup=warmup, total=total, floor=floor)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
