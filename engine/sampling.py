"""Token sampling without host syncs (gpt-fast's `multinomial_sample_one_no_sync`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglet.kernels.topk import argmax


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax)
    top_p: float = 1.0  # nucleus sampling mass; 1 = off

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"gen.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"gen.top_p={self.top_p} must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] fp32 after temperature and top-p."""
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)  # [..., V]
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)  # [..., V]
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        drop = sorted_p.cumsum(-1) - sorted_p >= params.top_p  # [..., V]
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [B, V] -> tokens [B] int64; argmax(p / Exp(1)) draws from p without a host sync."""
    if params.greedy:
        return argmax(logits)
    probs = probs_from_logits(logits, params)  # [B, V]
    q = torch.empty_like(probs).exponential_(1, generator=generator)  # [B, V]
    return argmax(probs / q)
