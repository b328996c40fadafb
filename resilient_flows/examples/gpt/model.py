"""A GPT of bytes: the decoder-only transformer of GPT-2, small enough to train on a CPU.

Pre-norm blocks (causal self-attention, then a 4x MLP with GELU), learned positions, and the
output layer tied to the byte embedding by computing the logits with the embedding's matrix:
one tensor, not two names for one tensor, so a checkpoint's ``state_dict`` has no aliases.
The vocabulary is the 256 byte values: no tokenizer to fit, ship or keep in step with the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["GPT", "SIZES", "GPTConfig", "parameter_count"]

VOCAB = 256


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a model: ``layers`` blocks of ``width`` channels in ``heads`` heads over
    ``block`` bytes of context."""

    layers: int
    heads: int
    width: int
    block: int
    dropout: float = 0.0


#: The presets ``params: {size: ...}`` selects, from a few MB of weights to GPT-2 small's body.
SIZES: dict[str, GPTConfig] = {
    "tiny": GPTConfig(layers=2, heads=4, width=128, block=64),
    "small": GPTConfig(layers=4, heads=4, width=256, block=128),
    "medium": GPTConfig(layers=8, heads=8, width=512, block=256),
    "large": GPTConfig(layers=12, heads=12, width=768, block=512),
}


def parameter_count(config: GPTConfig) -> int:
    """The model's parameters, from its shape alone: embeddings, then per block two layer norms,
    the attention's projections and the MLP, then the final layer norm."""
    d = config.width
    per_block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (8 * d * d + 5 * d)
    return VOCAB * d + config.block * d + config.layers * per_block + 2 * d


class _Attention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, time, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, time, width))


class _Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.width)
        self.attn = _Attention(config)
        self.ln2 = nn.LayerNorm(config.width)
        self.fc = nn.Linear(config.width, 4 * config.width)
        self.proj = nn.Linear(4 * config.width, config.width)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    """Byte ids (batch x time, time <= ``block``) to next-byte logits (batch x time x 256).

    Initialised as GPT-2 is (normal, std 0.02; the projections into the residual stream scaled
    down by the depth), from the current torch RNG: a member seeds it with its seed."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.width % config.heads:
            raise ValueError(f"width {config.width} is not a multiple of heads {config.heads}")
        self.config = config
        self.wte = nn.Embedding(VOCAB, config.width)
        self.wpe = nn.Embedding(config.block, config.width)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.width)
        for name, parameter in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(parameter)
            elif parameter.dim() >= 2:
                depth = math.sqrt(2 * config.layers) if name.endswith("proj.weight") else 1.0
                nn.init.normal_(parameter, std=0.02 / depth)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)
