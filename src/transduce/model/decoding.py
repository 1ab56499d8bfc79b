"""The decoder for inference: one new position per step on the key/value cache, computed from
a snapshot of the weights laid out for it.

``Transformer.decode`` runs the decoder modules, which serve training too: every step pays for
module calls, attribute lookups and the general code paths of training (dropout, masks, T
positions); on a CPU at batch 1 that was about a fifth of a step (the speed-ups below).
``DecodingModel`` computes the same function as ``Transformer.decode`` in eval mode for the
single-position steps of a search, with plain tensor operations on weights it copied once:

- every projection as a ``Projection`` (``model/projection.py``): MKL's ``addmm`` on the weight
  transposed to (in, out), which MKL multiplies faster than nn.Linear's (out, in) layout at most
  decoding shapes (Intel machine, 2 threads, float32: 1.0-1.2x at 1, 32 and 128 rows; up to 2.5x
  for one or two rows on the AMD machine); on x86 CPUs not made by Intel, oneDNN's inner product
  on weights in its own layout instead (MKL's sgemm runs AVX-512 kernels only on Intel's CPUs:
  1.3-2.7x faster products at 4-128 rows on an AMD Zen 5); for one row, the weight's columns in
  one block per thread, so that every thread reads part of it (benchmarks/RESULTS.md);
- W^Q, W^K, W^V of self-attention stacked into one product, W^K, W^V of encoder-decoder
  attention into another;
- for one sentence, encoder-decoder attention folded into two products a step, with W^Q and W^O
  multiplied into the sentence's keys and values once (``model/folded_attention.py``).

Against ``Transformer.decode``, before the one-row blocks, the fold, prepacked oneDNN weights
and the encoder snapshot (benchmarks/RESULTS.md, 2026-11-23, Intel machine): 1.22-1.25x faster
batch-1 greedy search, 1.18-1.21x batch-32 greedy, 1.06-1.08x batch-32 beam 4, SMALL and BASE.
Those four and the formula for beams' encoder-decoder attention then made searches 1.13-1.51x
faster on an AMD Zen 5 (RESULTS.md, 2026-11-24, "All of it").

The encoder runs from the same kind of snapshot (``encode``; its products then take the same
layouts: 1.4-1.6x faster for one sentence, 1.1x for 32 on an AMD Zen 5, benchmarks/RESULTS.md).
It is a snapshot: after the model's weights change (training, ``load_state_dict``, ``.to``),
make a new one. Embeddings, positions and layer norms use the model's own parameters; decoding
several positions at once (``tgt`` with T > 1, or no cache) and a model in training mode run the
model itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from transduce.model.attention import _fp32_on_cpu, attention
from transduce.model.cache import DecoderCache, LayerCache
from transduce.model.layers import DecoderLayer, EncoderLayer
from transduce.model.folded_attention import (
    FoldWeights,
    fold_cross_attention,
    fold_pays,
    folded_cross_attention,
)
from transduce.model.linear import CpuMatmul, use_onednn
from transduce.model.projection import Projection
from transduce.model.transformer import Transformer, source_mask


Norm = tuple[tuple[int, ...], Tensor, Tensor, float]  # torch.layer_norm's arguments after x


@dataclass(frozen=True)
class _LayerWeights:
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


@dataclass(frozen=True)
class _DecoderLayerWeights(_LayerWeights):
    """A decoder layer's weights for a step: an encoder layer's, and encoder-decoder
    attention's."""

    cross_query: Projection
    cross_kv: Projection  # W^K, W^V of encoder-decoder attention stacked: W^T (D, H*K + H*Dv)
    cross_out: Projection
    fold: FoldWeights | None  # for fold_cross_attention; None = no fold


def _layer_fields(
    layer: EncoderLayer | DecoderLayer, onednn: bool, parts: int, one_row: bool
) -> dict:
    """``_LayerWeights``' fields for ``layer``'s self-attention, FFN and norms."""
    sa, ffn = layer.self_attn, layer.ffn

    def projection(weight: Tensor, bias: Tensor | None) -> Projection:
        return Projection.of(weight, bias, onednn, parts, one_row=one_row)

    return {
        "qkv": projection(*sa.stack_qkv()),
        "self_out": projection(sa.w_o.weight, sa.w_o.bias),
        "ffn_in": projection(ffn.w_1.weight, ffn.w_1.bias),
        "ffn_out": projection(ffn.w_2.weight, ffn.w_2.bias),
        "norms": tuple((n.normalized_shape, n.weight, n.bias, n.eps) for n in layer.norms),
        "n_heads": sa.n_heads,
        "d_k": sa.d_k,
        "d_v": sa.d_v,
    }


def _encoder_layer_weights(layer: EncoderLayer, onednn: bool) -> _LayerWeights:
    # many rows (B*S) at once: no layout for one row
    return _LayerWeights(**_layer_fields(layer, onednn, 1, one_row=False))


def _decoder_layer_weights(
    layer: DecoderLayer, onednn: bool, parts: int, fold: bool
) -> _DecoderLayerWeights:
    ca = layer.cross_attn
    return _DecoderLayerWeights(
        **_layer_fields(layer, onednn, parts, one_row=True),
        cross_query=Projection.of(ca.w_q.weight, ca.w_q.bias, onednn, parts),
        # the encoder output, once per search (many rows): no layout for one row
        cross_kv=Projection.of(*ca.stack_kv(), onednn, one_row=False),
        cross_out=Projection.of(ca.w_o.weight, ca.w_o.bias, onednn, parts),
        fold=FoldWeights.of(ca) if fold else None,
    )


def _feed_forward(w: _LayerWeights, x: Tensor) -> Tensor:
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (eq. 2): x (N, D) -> (N, D)."""
    return w.ffn_out(w.ffn_in(x).relu_())


def _split_heads(x: Tensor, b: int, s: int, n_heads: int) -> Tensor:
    """(B*S, H*size) -> (B, H, S, size), a view (also of a column slice): S positions of B
    sentences, or S = G hypotheses of B sentences."""
    size = x.size(1) // n_heads  # not -1: a view of no rows cannot infer it
    return x.view(b, s, n_heads, size).transpose(1, 2)  # (B, S, H, size) -> (B, H, S, size)


def _as_dtype(x: Tensor, dtype: torch.dtype) -> Tensor:
    # a Python comparison costs less than the call to .to() that would return x unchanged
    return x if x.dtype == dtype else x.to(dtype)


def _attention_input(x: Tensor) -> Tensor:
    # On the CPU attention() runs in float32 for low-precision inputs; casting the projection
    # once here keeps the cache in float32, as Transformer.decode does (MultiHeadAttention).
    return x.float() if _fp32_on_cpu(x) else x


class DecodingModel:
    """A Transformer for searches: the decoding contract (``encode``, ``decode``, ``new_cache``)
    with the encoder and single-position steps computed from a snapshot of the weights (see the
    module docstring). Greedy and beam search take it in place of the model; ``Translator`` uses
    one.

    ``cpu_matmul`` picks the library for the float32 products on the CPU (``use_onednn``):
    "auto" (oneDNN on x86 CPUs not made by Intel, else MKL), "mkl" or "onednn". The two give the
    same function up to float rounding. What runs the model's modules (several positions at once,
    training mode) takes the library ``model.linear.set_cpu_matmul`` chooses.

    ``one_row_parts``: one-row products (a batch of one sentence, greedy) split W's columns into
    this many blocks multiplied at once, one per thread, where MKL's and oneDNN's one-row products
    use one thread (``split_columns``); None = ``torch.get_num_threads()`` for float32 CPU
    weights, else 1 (no split). Made at construction: a later change of the thread count keeps
    the split.

    ``fold_one_sentence``: for a batch of one sentence whose source is short enough
    (``fold_pays``), encoder-decoder attention in two products a step instead of four
    (``model/folded_attention.py``); None = on for float32 CPU weights; float32 only.

    Extra memory: one copy of the projection weights of the encoder, of the decoder and of the
    pre-softmax matrix; a second of the decoder's and the pre-softmax matrix for one row (the
    column blocks; with oneDNN and no split, the small ones' transposed copies instead); with the
    fold, a third of the decoder's W^Q and W^O.
    """

    def __init__(
        self,
        model: Transformer,
        cpu_matmul: CpuMatmul = "auto",
        one_row_parts: int | None = None,
        fold_one_sentence: bool | None = None,
    ) -> None:
        if model.generator.bias is not None:
            raise ValueError("the pre-softmax projection of a Transformer has no bias")
        self.model = model
        weight = model.generator.weight
        self.onednn = use_onednn(cpu_matmul, weight)
        cpu_fp32 = weight.device.type == "cpu" and weight.dtype == torch.float32
        if one_row_parts is None:
            one_row_parts = torch.get_num_threads() if cpu_fp32 else 1
        if one_row_parts < 1:
            raise ValueError(f"one_row_parts must be at least 1, not {one_row_parts}")
        self.one_row_parts = one_row_parts
        if fold_one_sentence and weight.dtype != torch.float32:
            raise ValueError(f"fold_one_sentence needs float32 weights, not {weight.dtype}")
        fold = cpu_fp32 if fold_one_sentence is None else fold_one_sentence
        with torch.no_grad():
            self.encoder_layers = tuple(
                _encoder_layer_weights(layer, self.onednn) for layer in model.encoder.layers
            )
            self.layers = tuple(
                _decoder_layer_weights(layer, self.onednn, one_row_parts, fold)
                for layer in model.decoder.layers
            )
            self.generator = Projection.of(weight, None, self.onednn, one_row_parts)  # D -> V
        self.pre_norm = model.config.norm == "pre"
        # (src_valid, its version counter, its source_mask): see _source_mask
        self._mask_memo: tuple[Tensor, int, Tensor | None] | None = None

    @property
    def training(self) -> bool:
        """The model's mode: searches refuse a model in training mode (its encoder would drop)."""
        return self.model.training

    def encode(self, src: Tensor, src_valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, D), src_valid (B, S): ``Transformer.encode`` in eval mode
        (in training mode, the model's own, with dropout)."""
        if self.model.training:
            return self.model.encode(src, src_valid)
        if src_valid is None:
            src_valid = src != self.model.pad_id
        encoder = self.model.encoder
        x = encoder.positions(encoder.embed(src))  # (B, S, D)
        b, s, d = x.shape
        mask = source_mask(src_valid)  # (B, 1, 1, S) or None
        x = x.reshape(b * s, d)  # (B, S, D) -> (B*S, D): the projections take rows
        for weights in self.encoder_layers:
            x = self._encoder_layer(x, weights, b, s, mask)
        return encoder.final_norm(x.view(b, s, d)), src_valid

    def new_cache(self) -> DecoderCache:
        return self.model.new_cache()

    def decode(
        self, tgt: Tensor, memory: Tensor, src_valid: Tensor, cache: DecoderCache | None = None
    ) -> Tensor:
        """``Transformer.decode`` in eval mode: tgt (N, T), memory (B, S, D), src_valid (B, S)
        -> logits (N, T, V), N = B*G target rows, G per sentence (rows sentence-major). In
        training mode, the model's own (with dropout)."""
        if cache is None or tgt.size(1) != 1 or self.model.training:
            return self.model.decode(tgt, memory, src_valid, cache)
        decoder = self.model.decoder
        embed = decoder.embed.weight  # (V, D)
        position = _as_dtype(decoder.positions.encoding(cache.length, 1), embed.dtype)  # (1, D)
        # E[tgt] * sqrt(D) + PE[t] (section 3.4-3.5) as one operation
        x = torch.add(position, F.embedding(tgt.view(-1), embed), alpha=decoder.embed.scale)
        mask = self._source_mask(src_valid)  # (B, 1, 1, S) or None
        for weights, layer_cache in zip(self.layers, cache.layers, strict=True):
            x = self._layer(x, weights, layer_cache, memory, mask)
        cache.length += 1
        if self.pre_norm:
            x = decoder.final_norm(x)
        return self.generator(x).unsqueeze(1)  # (N, V) -> (N, 1, V)

    def _source_mask(self, src_valid: Tensor) -> Tensor | None:
        """``source_mask(src_valid)``, made once per ``src_valid`` rather than every step (a
        search passes the same tensor until it drops sentences)."""
        # Tensors made under torch.inference_mode (the searches') have no version counter; the
        # searches never change src_valid in place, so for those the identity is the key.
        version = -1 if src_valid.is_inference() else src_valid._version
        memo = self._mask_memo  # one attribute, replaced whole: safe across threads
        if memo is None or memo[0] is not src_valid or memo[1] != version:
            memo = self._mask_memo = (src_valid, version, source_mask(src_valid))
        return memo[2]

    def _sublayer(self, x: Tensor, norm: Norm, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """The layers' residual wrapping (post- or pre-norm), without dropout."""
        # torch.layer_norm: F.layer_norm's checks cost a fifth of the call at batch 1
        if self.pre_norm:
            return x + sublayer(torch.layer_norm(x, *norm))
        return torch.layer_norm(x + sublayer(x), *norm)

    def _encoder_layer(
        self, x: Tensor, w: _LayerWeights, b: int, s: int, mask: Tensor | None
    ) -> Tensor:
        """x (B*S, D) -> (B*S, D): one encoder layer (``EncoderLayer.forward``), B sentences."""
        h, dtype = w.n_heads, x.dtype

        def self_attention(y: Tensor) -> Tensor:
            qkv = _attention_input(w.qkv(y))  # (B*S, H*K + H*K + H*Dv)
            sizes = (h * w.d_k, h * w.d_k, h * w.d_v)
            q, k, v = (_split_heads(t, b, s, h) for t in qkv.split(sizes, 1))  # (B, H, S, size)
            out = attention(q, k, v, mask)  # (B, H, S, Dv)
            out = out.transpose(1, 2).reshape(b * s, h * w.d_v)  # (B, S, H, Dv) -> (B*S, H*Dv)
            return w.self_out(_as_dtype(out, dtype))

        x = self._sublayer(x, w.norms[0], self_attention)
        return self._sublayer(x, w.norms[1], lambda y: _feed_forward(w, y))

    def _layer(
        self,
        x: Tensor,
        w: _DecoderLayerWeights,
        cache: LayerCache,
        memory: Tensor,
        mask: Tensor | None,
    ) -> Tensor:
        """x (N, D) -> (N, D): one decoder layer (``DecoderLayer.forward``) for one position."""
        h, n = w.n_heads, x.size(0)
        dtype = x.dtype

        def self_attention(y: Tensor) -> Tensor:
            qkv = _attention_input(w.qkv(y))  # (N, H*K + H*K + H*Dv)
            if w.d_k == w.d_v:  # one call for the three views
                q, k, v = qkv.view(n, 3, h, 1, w.d_k).unbind(1)  # 3 x (N, H, 1, K)
            else:
                sizes = (h * w.d_k, h * w.d_k, h * w.d_v)
                q, k, v = (_split_heads(t, n, 1, h) for t in qkv.split(sizes, 1))  # (N, H, 1, size)
            keys, values = cache.append(k, v)  # (N, H, t + 1, K), (N, H, t + 1, Dv)
            # the one new query may see every cached key: no mask
            out = attention(q, keys, values)  # (N, H, 1, Dv)
            return w.self_out(_as_dtype(out.reshape(n, h * w.d_v), dtype))  # -> (N, H*Dv)

        x = self._sublayer(x, w.norms[0], self_attention)
        x = self._sublayer(
            x, w.norms[1], lambda y: self._cross_attention(y, w, cache, memory, mask)
        )
        return self._sublayer(x, w.norms[2], lambda y: _feed_forward(w, y))

    def _cross_attention(
        self,
        y: Tensor,
        w: _DecoderLayerWeights,
        cache: LayerCache,
        memory: Tensor,
        mask: Tensor | None,
    ) -> Tensor:
        """y (N, D) -> (N, D): encoder-decoder attention of N = B*G rows, G per sentence."""
        if cache.cross_folded is not None:  # this sentence's fold, made at its first step below
            return folded_cross_attention(y, cache.cross_folded, w.cross_out.bias)
        if cache.cross_k is None:  # MultiHeadAttention.project_key_value, each contiguous
            kv = _attention_input(w.cross_kv(memory.flatten(0, 1)))  # (B*S, H*K + H*Dv)
            k, v = kv.split((w.n_heads * w.d_k, w.n_heads * w.d_v), 1)
            # (B, H, S, size), copied once: the formula below multiplies them faster
            cache.cross_k, cache.cross_v = (
                _split_heads(t, *memory.shape[:2], w.n_heads).contiguous() for t in (k, v)
            )
        b, _, s, _ = cache.cross_k.shape  # (B, H, S, K)
        n = y.size(0)
        if b == 1 and w.fold is not None and fold_pays(s, y.size(1), w.d_k, w.d_v):
            valid = None if mask is None else mask.reshape(-1)  # (1, 1, 1, S) -> (S,)
            cache.cross_folded = fold_cross_attention(w.fold, cache.cross_k, cache.cross_v, valid)
            if cache.cross_folded is not None:  # None: no valid source position
                return folded_cross_attention(y, cache.cross_folded, w.cross_out.bias)
        if n % b:
            raise ValueError(f"{n} target rows are not a multiple of {b} source rows")
        # The G = N / B hypotheses of a sentence query its keys together as G positions
        # (see DecoderLayer._cross_attention).
        q = _split_heads(_attention_input(w.cross_query(y)), b, n // b, w.n_heads)  # (B,H,G,K)
        # G > 1 (beams) on the CPU: the formula's batched products beat the fused kernel's
        # blocks of G queries (2.5-4x at 4 queries, 20-60 keys; benchmarks/RESULTS.md)
        fast = n == b or q.device.type != "cpu"
        out = attention(q, cache.cross_k, cache.cross_v, mask, fast=fast)  # (B, H, G, Dv)
        out = out.transpose(1, 2).reshape(n, w.n_heads * w.d_v)  # (B, G, H, Dv) -> (N, H*Dv)
        return w.cross_out(_as_dtype(out, y.dtype))


__all__ = ["DecodingModel"]
