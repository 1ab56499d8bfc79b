"""Attention masks as pure functions.

One convention: boolean, True = "this query may attend to this key". Every mask returned here
broadcasts against attention scores of shape (B, H, T, T').
"""

from __future__ import annotations

import torch
from torch import Tensor


def key_padding_mask(valid: Tensor) -> Tensor:
    """(B, T') bool, True on real tokens -> (B, 1, 1, T') mask hiding padded keys."""
    return valid[:, None, None, :]


def causal_mask(n_queries: int, n_keys: int, device: torch.device | None = None) -> Tensor:
    """(1, 1, T, T') mask letting query i see keys 0 .. i + (T' - T).

    The queries are the last ``n_queries`` positions of a sequence of ``n_keys`` positions, which
    covers both the full pass (T == T') and cached decoding (the keys include earlier steps).
    """
    offset = n_keys - n_queries
    q = torch.arange(n_queries, device=device)[:, None]
    k = torch.arange(n_keys, device=device)[None, :]
    return (k <= q + offset)[None, None]


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of the masks that are not None (None = attend everywhere)."""
    out: Tensor | None = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else out & m
    return out
