"""Encoder and decoder layers (section 3.1) and the residual connection around each sub-layer.

Each sub-layer is wrapped as in the paper, ``LayerNorm(x + Dropout(Sublayer(x)))`` (post-norm), or
optionally as ``x + Dropout(Sublayer(LayerNorm(x)))`` (pre-norm, which then needs a final norm).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from transduce import kernels
from transduce.kernels import KernelOptions
from transduce.model.attention import AttentionRecord, MultiHeadAttention
from transduce.model.cache import LayerCache
from transduce.model.feed_forward import PositionwiseFeedForward
from transduce.model.masks import causal_mask

Sublayer = Callable[[Tensor], Tensor]


def residual(
    x: Tensor, sublayer: Sublayer, norm: Sublayer, *, pre_norm: bool, dropout: float, training: bool
) -> Tensor:
    """post-norm: LayerNorm(x + Dropout(Sublayer(x))) (the paper);
    pre-norm: x + Dropout(Sublayer(LayerNorm(x)))."""
    if pre_norm:
        return kernels.dropout_add(x, sublayer(norm(x)), dropout, training)
    return norm(kernels.dropout_add(x, sublayer(x), dropout, training))


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (its parameters and state-dict keys; its function, within rounding)
    computed by ``kernels.layer_norm``: the native CPU kernel while training, else PyTorch's."""

    def forward(self, x: Tensor) -> Tensor:
        shape = tuple(self.normalized_shape)
        return kernels.layer_norm(x, shape, self.weight, self.bias, self.eps)


class _Sublayers(nn.Module):
    """The residual wrapping shared by the encoder and decoder layers: n layer norms."""

    def __init__(self, *, d_model: int, dropout: float, pre_norm: bool, n: int) -> None:
        super().__init__()
        self.norms = nn.ModuleList(LayerNorm(d_model) for _ in range(n))
        self.dropout = dropout  # P_drop of the residual connections
        self.pre_norm = pre_norm

    def residual(self, i: int, x: Tensor, sublayer: Sublayer) -> Tensor:
        return residual(
            x,
            sublayer,
            self.norms[i],
            pre_norm=self.pre_norm,
            dropout=self.dropout,
            training=self.training,
        )


class EncoderLayer(_Sublayers):
    """Self-attention then FFN, each with residual connection and layer norm."""

    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        d_k: int,
        d_v: int,
        d_ff: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        pre_norm: bool = False,
        activation: str = "relu",
        options: KernelOptions = KernelOptions(),
    ) -> None:
        super().__init__(d_model=d_model, dropout=dropout, pre_norm=pre_norm, n=2)
        self.self_attn = MultiHeadAttention(
            d_model=d_model,
            n_heads=n_heads,
            d_k=d_k,
            d_v=d_v,
            dropout=attention_dropout,
            options=options,
        )
        self.ffn = PositionwiseFeedForward(
            d_model=d_model,
            d_ff=d_ff,
            activation_dropout=activation_dropout,
            activation=activation,
            options=options,
        )

    def forward(
        self, x: Tensor, mask: Tensor | None, record: AttentionRecord | None = None
    ) -> Tensor:
        """x (B, S, D); mask broadcastable to (B, H, S, S) (source padding). Returns (B, S, D).
        ``record`` keeps the attention weights (``AttentionRecord.encoder``)."""
        weights = None if record is None else record.encoder
        x = self.residual(0, x, lambda h: self.self_attn(h, h, mask, weights))
        return self.residual(1, x, self.ffn)


class DecoderLayer(_Sublayers):
    """Masked self-attention, encoder-decoder attention, FFN (section 3.1)."""

    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        d_k: int,
        d_v: int,
        d_ff: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        pre_norm: bool = False,
        activation: str = "relu",
        options: KernelOptions = KernelOptions(),
    ) -> None:
        super().__init__(d_model=d_model, dropout=dropout, pre_norm=pre_norm, n=3)
        self.self_attn, self.cross_attn = (
            MultiHeadAttention(
                d_model=d_model,
                n_heads=n_heads,
                d_k=d_k,
                d_v=d_v,
                dropout=attention_dropout,
                options=options,
            )
            for _ in range(2)
        )
        self.ffn = PositionwiseFeedForward(
            d_model=d_model,
            d_ff=d_ff,
            activation_dropout=activation_dropout,
            activation=activation,
            options=options,
        )

    def _self_attention(
        self, h: Tensor, cache: LayerCache | None, record: list[Tensor] | None
    ) -> Tensor:
        q, k, v = self.self_attn.project_qkv(h)  # (N, H, T, K), (N, H, T, K), (N, H, T, Dv)
        if cache is not None:
            k, v = cache.append(k, v)  # (N, H, t + T, K), (N, H, t + T, Dv)
        n_q, n_k = q.size(2), k.size(2)
        if n_q == n_k:  # no cached prefix: plain causal attention, no mask tensor needed
            return self.self_attn.attend(q, k, v, None, is_causal=True, record=record)
        # A single new query may see every cached key, so no mask is needed then.
        mask = None if n_q == 1 else causal_mask(n_q, n_k, device=h.device)
        return self.self_attn.attend(q, k, v, mask, record=record)

    def _cross_attention(
        self,
        h: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        cache: LayerCache | None,
        record: list[Tensor] | None,
    ) -> Tensor:
        if cache is not None and cache.cross_k is not None and cache.cross_v is not None:
            k, v = cache.cross_k, cache.cross_v
        else:
            k, v = self.cross_attn.project_key_value(memory)  # (B, H, S, K), (B, H, S, Dv)
            if cache is not None:
                cache.cross_k, cache.cross_v = k, v
        q = self.cross_attn.project_query(h)  # (N, H, T, K)
        n, b, t = q.size(0), k.size(0), q.size(2)
        if n == b:
            return self.cross_attn.attend(q, k, v, memory_mask, record=record)
        # N = B*G hypotheses, G per sentence (a beam). The G hypotheses of a sentence attend to
        # the same keys, so they are queried together as G*T positions: one product per sentence
        # rather than G, and no per-hypothesis copies of the encoder keys and values.
        if n % b:
            raise ValueError(f"{n} target rows are not a multiple of {b} source rows")
        g = n // b
        # (N, H, T, K) -> (B, G, H, T, K) -> (B, H, G, T, K) -> (B, H, G*T, K)
        q = q.unflatten(0, (b, g)).transpose(1, 2).flatten(2, 3)
        grouped: list[Tensor] | None = None if record is None else []
        out = self.cross_attn.attend(q, k, v, memory_mask, record=grouped)  # (B, G*T, D)
        if record is not None and grouped:
            # (B, H, G*T, S) -> (B, H, G, T, S) -> (B, G, H, T, S) -> (N, H, T, S)
            record.append(grouped[0].unflatten(2, (g, t)).transpose(1, 2).flatten(0, 1))
        return out.unflatten(1, (g, t)).flatten(0, 1)  # (B, G, T, D) -> (N, T, D)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        cache: LayerCache | None = None,
        record: AttentionRecord | None = None,
    ) -> Tensor:
        """x (N, T, D) target states, memory (B, S, D) encoder output, memory_mask broadcastable
        to (B, H, T, S); N = B, or N = B*G for G hypotheses per sentence, rows sentence-major.
        With a cache, x holds only the new positions, and keys/values of the earlier ones come
        from (and are appended to) the cache. Returns (N, T, D). ``record`` keeps the attention
        weights (``AttentionRecord.decoder`` and ``.cross``)."""
        own, cross = (None, None) if record is None else (record.decoder, record.cross)
        x = self.residual(0, x, lambda h: self._self_attention(h, cache, own))
        x = self.residual(
            1, x, lambda h: self._cross_attention(h, memory, memory_mask, cache, cross)
        )
        return self.residual(2, x, self.ffn)


__all__ = ["DecoderLayer", "EncoderLayer", "residual"]
