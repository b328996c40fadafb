"""The member: a byte-level GPT trained with AdamW, warm-up and cosine, gradient clipping, and a
shuffled multi-worker ``DataLoader``; and its held-out evaluation, for ``evaluate:``.

Everything a resumed member needs to continue bit for bit is in its checkpoint: the weights,
AdamW's moments, the scheduler's step, the RNG states (dropout), and the data position.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from resilient_flows.examples.gpt.data import START_METHOD, ByteWindows, corpus_digest, split
from resilient_flows.examples.gpt.model import GPT, SIZES, parameter_count
from resilient_flows.examples.gpt.schedule import warmup_cosine
from resilient_flows.training import ResumableLoader, TrainContext

__all__ = ["Params", "adamw", "build_model", "evaluate", "held_out_loss", "train"]


class Params(BaseModel):
    """What a member may set; ``size`` picks the model's shape from :data:`SIZES`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: Literal["tiny", "small", "medium", "large"] = "tiny"
    batch_size: int = Field(16, ge=1)
    lr: float = Field(2e-3, gt=0)  # the peak, reached at the end of the warm-up
    warmup: int = Field(20, ge=0)  # steps
    lr_floor: float = Field(0.1, ge=0, le=1)  # the fraction of the peak the cosine ends at
    weight_decay: float = Field(0.1, ge=0)  # on matrices only, not on biases and layer norms
    clip: float = Field(1.0, gt=0)  # the largest gradient norm
    dropout: float = Field(0.1, ge=0, lt=1)
    num_workers: int = Field(2, ge=0)  # the DataLoader's worker processes
    eval_windows: int = Field(64, ge=1)  # held-out windows of `block` bytes that evaluation reads


def build_model(p: dict[str, Any]) -> GPT:
    """The model of ``p["size"]``, from the current torch RNG."""
    shape = SIZES[p["size"]]
    return GPT(dataclasses.replace(shape, dropout=p["dropout"]))


def adamw(model: nn.Module, p: dict[str, Any]) -> torch.optim.AdamW:
    """AdamW with weight decay on the weight matrices and embeddings only (GPT-2's choice)."""
    decay = [w for w in model.parameters() if w.dim() >= 2]
    rest = [w for w in model.parameters() if w.dim() < 2]
    groups = [{"params": decay, "weight_decay": p["weight_decay"]}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=p["lr"], betas=(0.9, 0.95))


def train(ctx: TrainContext) -> dict[str, Any]:
    """Train ``steps`` steps from the restored checkpoint, if any; the result has the held-out loss."""
    p = ctx.params
    torch.manual_seed(ctx.seed)
    model = build_model(p)
    net = ctx.wrap(model)  # DDP on several ranks, each training its share of the global batch
    optimizer = adamw(net, p)
    scheduler = warmup_cosine(optimizer, p["warmup"], p["steps"], p["lr_floor"])
    workers: dict[str, Any] = {"num_workers": p["num_workers"]}
    if p["num_workers"]:
        workers.update(persistent_workers=True, multiprocessing_context=START_METHOD)
    train_bytes, _ = split()
    loader = ctx.loader(
        ByteWindows(train_bytes, model.config.block), p["batch_size"], shuffle=True, drop_last=True, **workers
    )
    if not isinstance(loader, ResumableLoader):  # never: windows of the corpus are a map-style dataset
        raise TypeError(f"a corpus of windows gets a ResumableLoader, not a {type(loader).__name__}")
    ctx.track(model=model, optimizer=optimizer, scheduler=scheduler)  # and the loader's position
    model.train()
    for step, (x, y) in ctx.batches(loader, p["steps"]):
        x, y = x.to(ctx.device), y.to(ctx.device)
        loss = nn.functional.cross_entropy(net(x).flatten(0, 1), y.flatten()) * loader.rank_weight
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), p["clip"])
        lr = optimizer.param_groups[0]["lr"]  # this step's: the scheduler sets the next one's
        optimizer.step()
        scheduler.step()
        ctx.log(step, loss=loss.item(), lr=lr, grad_norm=norm.item())
    return ctx.result(
        model,
        **held_out_loss(model, p["eval_windows"]),
        epoch=loader.epoch,
        sample=loader.position,
        parameters=parameter_count(model.config),
        corpus=corpus_digest(),
    )


train.params = Params  # type: ignore[attr-defined]


def held_out_loss(model: GPT, windows: int) -> dict[str, float]:
    """Mean next-byte cross-entropy on the first ``windows`` held-out windows (nats), and in bits
    per byte, the unit byte-level models are compared in (8 would be no model at all)."""
    _, held_out = split()
    data = ByteWindows(held_out, model.config.block)
    count = min(windows, len(data))
    was_training, device = model.training, next(model.parameters()).device
    model.eval()
    total = 0.0
    with torch.no_grad():
        for first in range(0, count, 16):
            pairs = [data[i] for i in range(first, min(first + 16, count))]
            x, y = torch.stack([x for x, _ in pairs]).to(device), torch.stack([y for _, y in pairs]).to(device)
            total += nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum").item()
    model.train(was_training)
    loss = total / (count * model.config.block)
    return {"eval_loss": loss, "eval_bits_per_byte": loss / math.log(2)}


def evaluate(params: dict[str, Any], state: dict[str, Any]) -> dict[str, float]:
    """The held-out loss of a checkpoint (``evaluate:`` in a workflow; analytics call it)."""
    model = build_model(params)
    model.load_state_dict(state["model"])
    return held_out_loss(model, params["eval_windows"])
