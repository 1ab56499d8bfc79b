"""The inference engine's copies of a layer's weights: the projections laid out for decoding
(``kernels.Projection``), the layer norms as closures over the model's own parameters, and the
FFN. ``DecodingModel`` makes one per layer and computes its layers from them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transduce import kernels
from transduce.inference.engine.folded_attention import FoldWeights
from transduce.kernels import Projection, ProjectionLayout
from transduce.model.layers import DecoderLayer, EncoderLayer

Norm = Callable[[Tensor], Tensor]


def layer_norm_of(norm: nn.LayerNorm) -> Norm:
    """The layer norm as a closure over the model's own parameters; ``torch.layer_norm``:
    ``F.layer_norm``'s checks cost a fifth of the call at batch 1."""
    shape, weight, bias, eps = norm.normalized_shape, norm.weight, norm.bias, norm.eps
    return lambda x: torch.layer_norm(x, shape, weight, bias, eps)


@dataclass(frozen=True)
class LayerWeights:
    """An encoder layer's weights: self-attention and the FFN. The projections are copies;
    ``norms`` (the layer norms' parameters) are the model's own."""

    qkv: Projection  # self-attention W^Q, W^K, W^V stacked: W^T (D, H*K + H*K + H*Dv)
    self_out: Projection
    ffn_in: Projection
    ffn_out: Projection
    norms: tuple[Norm, ...]
    n_heads: int
    d_k: int
    d_v: int
    activation: Callable[[Tensor], Tensor] | None  # the FFN's; None: ReLU, in place


@dataclass(frozen=True)
class DecoderLayerWeights(LayerWeights):
    """A decoder layer's weights for a step: an encoder layer's, and encoder-decoder
    attention's."""

    cross_query: Projection
    cross_kv: Projection  # W^K, W^V of encoder-decoder attention stacked: W^T (D, H*K + H*Dv)
    cross_out: Projection
    fold: FoldWeights | None  # for fold_cross_attention; None = no fold


def _layer_fields(
    layer: EncoderLayer | DecoderLayer, layout: ProjectionLayout, one_row: bool
) -> dict[str, Any]:
    """``LayerWeights``' fields for ``layer``'s self-attention, FFN and norms."""
    sa, ffn = layer.self_attn, layer.ffn

    def projection(weight: Tensor, bias: Tensor | None) -> Projection:
        return Projection.of(weight, bias, layout, one_row=one_row)

    return {
        "qkv": projection(*kernels.stacked_weights((sa.w_q, sa.w_k, sa.w_v))),
        "self_out": projection(sa.w_o.weight, sa.w_o.bias),
        "ffn_in": projection(ffn.w_1.weight, ffn.w_1.bias),
        "ffn_out": projection(ffn.w_2.weight, ffn.w_2.bias),
        "norms": tuple(layer_norm_of(cast(nn.LayerNorm, n)) for n in layer.norms),
        "n_heads": sa.n_heads,
        "d_k": sa.d_k,
        "d_v": sa.d_v,
        "activation": None if ffn.activation is F.relu else ffn.activation,
    }


def encoder_layer_weights(layer: EncoderLayer, layout: ProjectionLayout) -> LayerWeights:
    """An encoder layer's weights on ``layout``."""
    # many rows (B*S) at once: no layout for one row
    return LayerWeights(**_layer_fields(layer, layout, one_row=False))


def decoder_layer_weights(
    layer: DecoderLayer, layout: ProjectionLayout, fold: bool
) -> DecoderLayerWeights:
    """A decoder layer's weights on ``layout``, with copies for the fold of encoder-decoder
    attention (``folded_attention.py``) if ``fold``."""
    ca = layer.cross_attn
    return DecoderLayerWeights(
        **_layer_fields(layer, layout, one_row=True),
        cross_query=Projection.of(ca.w_q.weight, ca.w_q.bias, layout),
        # the encoder output, once per search (many rows): no layout for one row
        cross_kv=Projection.of(*kernels.stacked_weights((ca.w_k, ca.w_v)), layout, one_row=False),
        cross_out=Projection.of(ca.w_o.weight, ca.w_o.bias, layout),
        fold=FoldWeights.of(ca) if fold else None,
    )


def feed_forward(w: LayerWeights, x: Tensor) -> Tensor:
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (eq. 2), or another ``activation``: x (N, D) ->
    (N, D)."""
    if w.activation is None:  # the ReLU in the product's call where the projection can
        return w.ffn_out(w.ffn_in.relu(x))  # (N, F) between
    return w.ffn_out(w.activation(w.ffn_in(x)))  # (N, F) between


__all__ = [
    "DecoderLayerWeights",
    "LayerWeights",
    "Norm",
    "decoder_layer_weights",
    "encoder_layer_weights",
    "feed_forward",
    "layer_norm_of",
]
