"""Scaled dot-product attention (section 3.2.1, eq. 1) and multi-head attention (section 3.2.2)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from transduce import kernels
from transduce.kernels import KernelOptions
from transduce.model.masks import causal_mask


@dataclass
class AttentionRecord:
    """Attention weights kept by a pass that asks for them (``Transformer.encode`` / ``decode``
    with ``record=``): one tensor per layer, (B, H, T, T') each, rows summing to 1 over the keys
    a query may attend (all-zero rows where it may attend none)."""

    encoder: list[Tensor] = field(default_factory=list)  # self-attention, (B, H, S, S)
    decoder: list[Tensor] = field(default_factory=list)  # masked self-attention, (N, H, T, T')
    cross: list[Tensor] = field(default_factory=list)  # encoder-decoder, (N, H, T, S)


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    options: KernelOptions = KernelOptions(),
) -> Tensor:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V  (eq. 1).

    query (B, H, T, K), key (B, H, T', K), value (B, H, T', Dv), mask bool broadcastable to
    (B, H, T, T') with True = may attend; a query whose keys are all masked gets zero weights.
    ``is_causal`` (T == T') lets query i see keys 0..i only. Returns (B, H, T, Dv).
    ``dropout_p`` drops attention weights (not in the paper; 0 by default). ``options.attention``
    picks how it is computed (the fused kernel or the formula), not what.
    """
    return kernels.attention(
        query, key, value, mask, dropout_p=dropout_p, is_causal=is_causal, path=options.attention
    )


def split_heads(x: Tensor, n_heads: int, length: int | None = None) -> Tensor:
    """(B, T, H*size) -> (B, H, T, size), a view (also of a column slice of a stacked
    projection); or rows (B*T, H*size) with ``length`` = T given."""
    if x.dim() == 2:  # not view(-1, ...): a view of no rows cannot infer it
        assert length is not None, "rows need the length T"
        batch = x.size(0) // length
    else:
        batch, length = x.size(0), x.size(1)
    size = x.size(-1) // n_heads
    # (B, T, H, size) -> (B, H, T, size)
    return x.view(batch, length, n_heads, size).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """Concat(head_1, ..., head_h): (B, H, T, Dv) -> (B, T, H*Dv)."""
    b, h, t, dv = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dv)  # (B, T, H, Dv) -> (B, T, H*Dv)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    W^Q, W^K: (D, H*K); W^V: (D, H*Dv); W^O: (H*Dv, D). ``d_k`` and ``d_v`` are independent of
    ``d_model / n_heads`` (Table 3 rows A and B).
    """

    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        d_k: int,
        d_v: int,
        dropout: float = 0.0,
        bias: bool = True,
        options: KernelOptions = KernelOptions(),
    ) -> None:
        super().__init__()
        self.n_heads, self.d_k, self.d_v = n_heads, d_k, d_v
        self.dropout = dropout
        self.options = options
        self.w_q = kernels.Linear(d_model, n_heads * d_k, bias, options.matmul)
        self.w_k = kernels.Linear(d_model, n_heads * d_k, bias, options.matmul)
        self.w_v = kernels.Linear(d_model, n_heads * d_v, bias, options.matmul)
        self.w_o = kernels.Linear(n_heads * d_v, d_model, bias, options.matmul)

    def _heads(self, x: Tensor, projections: tuple[kernels.Linear, ...]) -> tuple[Tensor, ...]:
        """x (B, T, D) through ``projections`` (one product for all) -> each (B, H, T, size)."""
        outs = kernels.stacked_linear(x, projections)  # each (B, T, H*size)
        path = self.options.attention
        return tuple(split_heads(kernels.attention_input(o, path), self.n_heads) for o in outs)

    def project_query(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, K)."""
        return self._heads(x, (self.w_q,))[0]

    def project_key_value(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, T', D) -> keys (B, H, T', K), values (B, H, T', Dv)."""
        k, v = self._heads(x, (self.w_k, self.w_v))
        return k, v

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention: (B, T, D) -> queries (B, H, T, K), keys (B, H, T, K), values
        (B, H, T, Dv)."""
        q, k, v = self._heads(x, (self.w_q, self.w_k, self.w_v))
        return q, k, v

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool = False,
        record: list[Tensor] | None = None,
    ) -> Tensor:
        """Projected heads -> (B, T, D): attention per head, concatenation, W^O. With ``record``,
        the weights softmax(QK^T/sqrt(d_k)) (B, H, T, T') are appended to it (dropout aside)."""
        p = self.dropout if self.training else 0.0
        if record is None:
            heads = attention(q, k, v, mask, dropout_p=p, is_causal=is_causal, options=self.options)
        else:
            heads = self._attend_recorded(q, k, v, mask, is_causal, record)
        return self.w_o(merge_heads(heads))  # (B, H, T, Dv) -> (B, T, H*Dv) -> (B, T, D)

    def _attend_recorded(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        record: list[Tensor],
    ) -> Tensor:
        """Eq. 1 through its weights, which are kept: (B, H, T, Dv)."""
        if is_causal:
            causal = causal_mask(q.size(-2), k.size(-2), device=q.device)
            mask = causal if mask is None else mask & causal
        weights = kernels.attention_weights(q, k, mask)  # (B, H, T, T')
        record.append(weights.detach())
        p = self.dropout if self.training else 0.0
        return kernels.dropout(weights, p, self.training) @ v

    def forward(
        self,
        query: Tensor,
        memory: Tensor,
        mask: Tensor | None = None,
        record: list[Tensor] | None = None,
    ) -> Tensor:
        """query (B, T, D) attends over memory (B, T', D); mask broadcastable to (B, H, T, T').
        ``record``: see ``attend``."""
        if query is memory:  # self-attention: one stacked projection
            return self.attend(*self.project_qkv(query), mask, record=record)
        k, v = self.project_key_value(memory)
        return self.attend(self.project_query(query), k, v, mask, record=record)


__all__ = ["AttentionRecord", "MultiHeadAttention", "attention", "merge_heads", "split_heads"]
