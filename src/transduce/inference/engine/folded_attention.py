"""Encoder-decoder attention of one sentence folded into two products a decoding step.

With the paper's W_h^Q (D, K) and W_h^O (Dv, D) (head h's blocks of W^Q and W^O), head h's
scores for a decoder state x (1, D) against the sentence's keys K_h (S, K) are
(x W_h^Q + b_h^Q) K_h^T / sqrt(d_k) = x A_h + c_h, and

    MultiHead = sum_h softmax(x A_h + c_h) V_h W_h^O + b^O = p M + b^O, with

    A_h = W_h^Q K_h^T / sqrt(d_k)  (D, S),   c_h = b_h^Q K_h^T / sqrt(d_k)  (1, S),
    M_h = V_h W_h^O  (S, D),                  p = [softmax_h]  (1, H*S), head-major.

A, c and M are made once per sentence; a step then multiplies x by A and p by M instead of
projecting the query (W^Q), attending and projecting the heads (W^O). That is the same function
up to float rounding. It pays where a step is mostly operator calls and reading W^Q and W^O (a
batch-1 search on the CPU: ``DecodingModel``) and while A and M, 2 H S D numbers, are smaller than
what they replace (``fold_pays``); a batch would need them for every sentence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from transduce.model.attention import MultiHeadAttention


@dataclass(frozen=True)
class FoldWeights:
    """Copies of one attention module's W^Q, b^Q and W^O, laid out per head for the fold."""

    w_q: Tensor  # (H, D, K): W_h^Q
    b_q: Tensor | None  # (H, 1, K): b_h^Q
    w_o: Tensor  # (H, Dv, D): W_h^O

    @classmethod
    def of(cls, attn: MultiHeadAttention) -> FoldWeights:
        """Copies (not views: a snapshot, and no autograd graph) of ``attn``'s weights."""
        h, k, dv = attn.n_heads, attn.d_k, attn.d_v
        d = attn.w_q.weight.size(1)
        with torch.no_grad():
            # (H*K, D) -> (H, D, K)
            w_q = attn.w_q.weight.view(h, k, d).transpose(1, 2).contiguous()
            b = attn.w_q.bias
            b_q = None if b is None else b.view(h, 1, k).clone()  # (H*K,) -> (H, 1, K)
            # (D, H*Dv) -> (H, Dv, D)
            w_o = attn.w_o.weight.view(d, h, dv).permute(1, 2, 0).contiguous()
        return cls(w_q, b_q, w_o)


def fold_pays(n_keys: int, d_model: int, d_k: int, d_v: int) -> bool:
    """Whether A and M (2 H S D numbers) are fewer than what a step would read instead: W^Q,
    W^O (D H (d_k + d_v)) and the keys and values (H S (d_k + d_v)): up to 73 source tokens for
    the paper's base model, 85 for d_model 256 with 64-wide heads; measured on the CPU, the
    rule's cut-off is about where the fold stops paying (benchmarks/RESULTS.md)."""
    return n_keys * (2 * d_model - d_k - d_v) < d_model * (d_k + d_v)


def fold_cross_attention(
    weights: FoldWeights, keys: Tensor, values: Tensor, valid: Tensor | None
) -> tuple[Tensor, Tensor, Tensor] | None:
    """keys (1, H, S, K), values (1, H, S, Dv): one sentence's projected memory; valid (S,)
    bool, True on real source tokens (None: all) -> A (H, D, S), c (H, 1, S) with -inf on padded
    positions, M (H*S, D) (see the module docstring); None when no position is valid, where
    ``attention`` gives zero weights and the fold would give NaN."""
    if valid is not None and not bool(valid.any()):
        return None
    scale = 1.0 / math.sqrt(keys.size(-1))
    keys_t = keys[0].transpose(1, 2)  # (H, S, K) -> (H, K, S)
    a = torch.bmm(weights.w_q, keys_t).mul_(scale)  # (H, D, S)
    if weights.b_q is None:
        c = keys_t.new_zeros(keys_t.size(0), 1, keys_t.size(2))
    else:
        c = torch.bmm(weights.b_q, keys_t).mul_(scale)  # (H, 1, S)
    if valid is not None:
        c.masked_fill_(~valid, float("-inf"))
    m = torch.bmm(values[0], weights.w_o)  # (H, S, D)
    return a, c, m.view(-1, m.size(-1))  # (H, S, D) -> (H*S, D)


def folded_cross_attention(
    y: Tensor, folded: tuple[Tensor, Tensor, Tensor], bias: Tensor | None
) -> Tensor:
    """y (G, D), the G hypotheses of one sentence -> MultiHead (G, D) from
    ``fold_cross_attention``'s A, c, M and W^O's bias b^O."""
    a, c, m = folded  # (H, D, S), (H, 1, S), (H*S, D)
    g = y.size(0)
    scores = torch.baddbmm(c, y.expand(a.size(0), g, y.size(1)), a)  # (H, G, S)
    p = scores.softmax(-1)
    # (H, G, S) -> (G, H*S): head-major as M's rows
    p = p.view(1, -1) if g == 1 else p.transpose(0, 1).reshape(g, -1)
    return p @ m if bias is None else torch.addmm(bias, p, m)


__all__ = ["FoldWeights", "fold_cross_attention", "fold_pays", "folded_cross_attention"]
