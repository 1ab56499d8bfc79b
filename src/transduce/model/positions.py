"""Positional encodings (section 3.5): the paper's sinusoids, or learned (Table 3 row E); and,
beyond the paper, positions counted in words (``word_positions``, ``slot_positions``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def positional_table(
    n_positions: int,
    d_model: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
) -> Tensor:
    """Sinusoidal encodings, interleaved as in the paper: (n_positions, D) with

    PE(pos, 2i) = sin(pos / 10000^(2i / d_model)),  PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model)).
    """
    pos = torch.arange(n_positions, dtype=torch.float64, device=device)[:, None]  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=device)  # (ceil(D/2),)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (P, ceil(D/2))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64, device=device)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.to(dtype)


class SinusoidalPositions(nn.Module):
    """Adds the fixed sinusoidal table; grows it when a longer sequence arrives."""

    def __init__(self, *, d_model: int, max_positions: int = 1024) -> None:
        super().__init__()
        self.d_model = d_model
        self.table: Tensor
        self.register_buffer("table", positional_table(max_positions, d_model), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x (B, T, D) + PE[offset : offset + T]."""
        return x + self.encoding(offset, x.size(1)).to(x.dtype)

    def encoding(self, offset: int, length: int) -> Tensor:
        """PE[offset : offset + length]: (length, D) float32."""
        end = offset + length
        if end > self.table.size(0):
            # a normal tensor even when first needed under torch.inference_mode, so that
            # training can use the grown table afterwards
            with torch.inference_mode(False):
                self.table = positional_table(2 * end, self.d_model, device=self.table.device)
        return self.table.narrow(0, offset, length)

    def at(self, index: Tensor, limit: int) -> Tensor:
        """PE[index]: index (B, T) long, every value below ``limit`` -> (B, T, D) float32. The
        caller's bound, not index.max(), which would wait for the device."""
        self.encoding(0, limit)  # grow the table
        return nn.functional.embedding(index, self.table)


class LearnedPositions(nn.Module):
    """Learned positional embeddings (Table 3 row E); at most ``max_positions`` positions."""

    def __init__(self, *, d_model: int, max_positions: int = 1024) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x (B, T, D) + P[offset : offset + T]."""
        return x + self.encoding(offset, x.size(1))

    def encoding(self, offset: int, length: int) -> Tensor:
        """P[offset : offset + length]: (length, D)."""
        end = offset + length
        if end > self.weight.size(0):
            raise ValueError(
                f"sequence of {end} positions is longer than max_positions={self.weight.size(0)} "
                "of the learned positional embeddings"
            )
        return self.weight.narrow(0, offset, length)

    def at(self, index: Tensor, limit: int) -> Tensor:
        """P[index]: index (B, T) long, every value below ``limit`` -> (B, T, D)."""
        self.encoding(0, limit)  # the length check
        return nn.functional.embedding(index, self.weight)


def word_positions(starts: Tensor) -> Tensor:
    """starts (B, S) bool, True on a token that begins a word -> (B, S) long: each token's word
    index (0 for the first word; the pieces of a word share it; 0 before any start)."""
    return (starts.long().cumsum(1) - 1).clamp_min(0)


def slot_positions(slots: Tensor, before: Tensor | None = None) -> Tensor:
    """slots (N, T) bool, True on a decoder input that is a word slot; before (N,) the slots in
    inputs already decoded (None: none) -> (N, T) long: the slots up to and including each input,
    which is the index of the word that the next word slot will hold."""
    counts = slots.long().cumsum(1)  # (N, T)
    return counts if before is None else counts + before[:, None]


def make_positions(
    kind: str, *, d_model: int, max_positions: int
) -> SinusoidalPositions | LearnedPositions:
    """'sinusoidal' (the paper's default) or 'learned' (Table 3 row E)."""
    if kind == "sinusoidal":
        return SinusoidalPositions(d_model=d_model, max_positions=max_positions)
    if kind == "learned":
        return LearnedPositions(d_model=d_model, max_positions=max_positions)
    raise ValueError(f"positional must be 'sinusoidal' or 'learned', got {kind!r}")


__all__ = [
    "LearnedPositions",
    "SinusoidalPositions",
    "make_positions",
    "positional_table",
    "slot_positions",
    "word_positions",
]
