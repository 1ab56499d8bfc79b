"""Attention of the recurrent decoder over the encoder output, padding masked.

Two scores (Luong et al. 2015, section 3.1), with h_t the decoder's top LSTM state (the current
one, as in Luong's framework; Bahdanau et al. 2015 score the previous state s_{t-1}) and h_s
an encoder output (memory row):

    general   score(h_t, h_s) = h_t^T W h_s
    additive  score(h_t, h_s) = v^T tanh(W1 h_t + W2 h_s)       (Bahdanau's "concat")

The source-side products (W h_s, W2 h_s) depend only on the sentence: ``Attention.keys`` makes
them once per sentence and the cache keeps them. Queries come as N = B*G rows (G hypotheses per
sentence, sentence-major) and are regrouped to (B, G*T, .) so that the G hypotheses of a
sentence share its keys and memory without a copy.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transduce.recurrent.config import ATTENTION_KINDS, AttentionKind


def group_rows(x: Tensor, b: int) -> Tensor:
    """(N, T, A) with N = B*G rows, sentence-major -> (B, G*T, A): the G hypotheses of a
    sentence become one query sequence. Raises ValueError when N is not a multiple of B."""
    n, t, a = x.shape
    if n % b:
        raise ValueError(f"{n} target rows are not a multiple of {b} source rows")
    return x.reshape(b, (n // b) * t, a)  # (B*G, T, A) -> (B, G*T, A)


def general_scores(query: Tensor, keys: Tensor) -> Tensor:
    """Luong's general score: query (B, Q, H) = h_t, keys (B, S, H) = W h_s -> (B, Q, S)."""
    return torch.bmm(query, keys.transpose(1, 2))


def additive_scores(query: Tensor, keys: Tensor, v: Tensor) -> Tensor:
    """Bahdanau's score: query (B, Q, A) = W1 h_t, keys (B, S, A) = W2 h_s, v (A,) -> (B, Q, S).

    Materialises (B, Q, S, A): the price of the additive score."""
    return torch.tanh(query[:, :, None, :] + keys[:, None, :, :]) @ v  # (B, Q, S, A) @ (A,)


def masked_softmax(scores: Tensor, valid: Tensor) -> Tensor:
    """scores (B, Q, S), valid (B, S) bool (True = may attend) -> weights (B, Q, S).

    Padding gets weight exactly 0. A sentence with no real token gets all-zero weights (a zero
    context) instead of NaN, so its output does not depend on how much padding it has."""
    valid = valid[:, None, :]  # (B, S) -> (B, 1, S)
    # the dtype's lowest number rather than -inf: a fully masked row stays finite
    weights = torch.softmax(scores.masked_fill(~valid, torch.finfo(scores.dtype).min), dim=-1)
    return weights * valid


class Attention(nn.Module):
    """One attention kind over the encoder output: its parameters, keys and context."""

    def __init__(self, kind: AttentionKind, hidden_size: int) -> None:
        super().__init__()
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}; got {kind!r}")
        self.kind = kind
        self.w_key = nn.Linear(hidden_size, hidden_size, bias=False)  # W (general), W2 (additive)
        if kind == "additive":
            self.w_query = nn.Linear(hidden_size, hidden_size, bias=False)  # W1
            self.v = nn.Parameter(torch.empty(hidden_size))
            nn.init.uniform_(self.v, -0.1, 0.1)

    def keys(self, memory: Tensor) -> Tensor:
        """memory (B, S, H) -> the source side of the score, (B, S, H): W h_s or W2 h_s."""
        return self.w_key(memory)

    def forward(
        self, query: Tensor, keys: Tensor, memory: Tensor, src_valid: Tensor
    ) -> tuple[Tensor, Tensor]:
        """query (N, T, H) decoder states h_t, N = B*G; keys (B, S, H) from ``keys``; memory
        (B, S, H); src_valid (B, S) -> context c_t (N, T, H), weights (B, G*T, S)."""
        q = group_rows(query, memory.size(0))  # (B, G*T, H)
        if self.kind == "general":
            scores = general_scores(q, keys)
        else:
            scores = additive_scores(self.w_query(q), keys, self.v)
        weights = masked_softmax(scores, src_valid)  # (B, G*T, S)
        context = torch.bmm(weights, memory)  # (B, G*T, H)
        return context.reshape(query.shape), weights  # (B, G*T, H) -> (N, T, H)


__all__ = ["Attention", "additive_scores", "general_scores", "group_rows", "masked_softmax"]
