"""Embeddings scaled by sqrt(d_model) (section 3.4)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class Embeddings(nn.Module):
    """Token embedding multiplied by sqrt(d_model). weight (V, D) may be shared with the
    pre-softmax projection, so it is initialised N(0, D^-0.5) to give unit-scale inputs."""

    def __init__(self, *, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        self.scale = math.sqrt(d_model)
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, tokens: Tensor) -> Tensor:
        """(B, T) token ids -> (B, T, D)."""
        return nn.functional.embedding(tokens, self.weight) * self.scale


__all__ = ["Embeddings"]
