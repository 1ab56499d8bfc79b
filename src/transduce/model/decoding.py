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
  multiplied into the sentence's keys and values once (``fold_cross_attention``).

Against ``Transformer.decode`` (benchmarks/RESULTS.md, 2026-11-23): 1.22-1.25x faster batch-1
greedy search, 1.18-1.21x batch-32 greedy, 1.06-1.08x batch-32 beam 4, SMALL and BASE.

The encoder runs from the same kind of snapshot (``encode``; its products then take the same
layouts: 1.4-1.6x faster for one sentence, 1.1x for 32 on an AMD Zen 5, benchmarks/RESULTS.md).
It is a snapshot: after the model's weights change (training, ``load_state_dict``, ``.to``),
make a new one. Embeddings, positions and layer norms use the model's own parameters; decoding
several positions at once (``tgt`` with T > 1, or no cache) and a model in training mode run the
model itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from transduce.model.attention import MultiHeadAttention, _fp32_on_cpu, attention
from transduce.model.cache import DecoderCache, LayerCache
from transduce.model.layers import DecoderLayer, EncoderLayer
from transduce.model.linear import CpuMatmul, use_onednn
from transduce.model.projection import Projection
from transduce.model.transformer import Transformer, source_mask


Norm = tuple[tuple[int, ...], Tensor, Tensor, float]  # torch.layer_norm's arguments after x


@dataclass(frozen=True)
class _LayerWeights:
    """An encoder layer's weights: self-attention and the FFN. The projections are copies;
    ``norms`` (the layer norms' parameters) are the model's own."""

    qkv: Projection  # self-attention W^Q, W^K, W^V stacked: (D, H*K + H*K + H*Dv)
    self_out: Projection
    ffn_in: Projection
    ffn_out: Projection
    norms: tuple[Norm, ...]
    n_heads: int
    d_k: int
    d_v: int

    @staticmethod
    def fields_of(layer: EncoderLayer | DecoderLayer, onednn: bool, parts: int) -> dict:
        sa, ffn = layer.self_attn, layer.ffn
        return {
            "qkv": Projection.of(*sa.stack_qkv(), onednn, parts),
            "self_out": Projection.of(sa.w_o.weight, sa.w_o.bias, onednn, parts),
            "ffn_in": Projection.of(ffn.w_1.weight, ffn.w_1.bias, onednn, parts),
            "ffn_out": Projection.of(ffn.w_2.weight, ffn.w_2.bias, onednn, parts),
            "norms": tuple((n.normalized_shape, n.weight, n.bias, n.eps) for n in layer.norms),
            "n_heads": sa.n_heads,
            "d_k": sa.d_k,
            "d_v": sa.d_v,
        }

    @classmethod
    def of(cls, layer: EncoderLayer, onednn: bool = False) -> _LayerWeights:
        return cls(**cls.fields_of(layer, onednn, 1))  # many rows: no one-row blocks


@dataclass(frozen=True)
class _DecoderLayerWeights(_LayerWeights):
    """A decoder layer's weights for a step: an encoder layer's and encoder-decoder attention's;
    ``cross_attn`` (the module) is the model's own."""

    cross_query: Projection
    cross_kv: Projection  # W^K, W^V of encoder-decoder attention stacked: (D, H*K + H*Dv)
    cross_out: Projection
    cross_attn: MultiHeadAttention  # its W^Q and W^O, for fold_cross_attention

    @classmethod
    def of(  # type: ignore[override]
        cls, layer: DecoderLayer, onednn: bool = False, parts: int = 1
    ) -> _DecoderLayerWeights:
        ca = layer.cross_attn
        return cls(
            **cls.fields_of(layer, onednn, parts),
            cross_query=Projection.of(ca.w_q.weight, ca.w_q.bias, onednn, parts),
            # the encoder output, once per search (many rows): no one-row blocks
            cross_kv=Projection.of(*ca.stack_kv(), onednn),
            cross_out=Projection.of(ca.w_o.weight, ca.w_o.bias, onednn, parts),
            cross_attn=ca,
        )


def _feed_forward(w: _LayerWeights, x: Tensor) -> Tensor:
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (eq. 2): x (N, D) -> (N, D)."""
    return w.ffn_out(w.ffn_in(x).relu_())


def fold_cross_attention(
    attn: MultiHeadAttention, keys: Tensor, values: Tensor, valid: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Encoder-decoder attention of one sentence as two products a step instead of four.

    keys (1, H, S, K), values (1, H, S, Dv): the sentence's memory projected by ``attn``; valid
    (S,) bool, True on real source tokens (None: all). With the paper's W_h^Q (D, K) and W_h^O
    (Dv, D) (the blocks of ``attn.w_q`` and ``attn.w_o``), head h's scores for a decoder state
    x (1, D) are (x W_h^Q + b_h^Q) K_h^T / sqrt(d_k) = x A_h + c_h, and
    MultiHead = sum_h softmax(x A_h + c_h) V_h W_h^O + b^O = p M + b^O, with

        A_h = W_h^Q K_h^T / sqrt(d_k)  (D, S),   c_h = b_h^Q K_h^T / sqrt(d_k)  (1, S),
        M_h = V_h W_h^O  (S, D),                  p = [softmax_h]  (1, H*S).

    Returns A (H, D, S), c (H, 1, S) with -inf on padded positions, M (H*S, D): the same
    function as ``attention`` between the projections, up to float rounding. It pays for one
    sentence, where a step is mostly operator calls and reading W^Q and W^O (D x D each) from
    memory; A and M hold 2 H S D numbers per sentence and layer, a batch's would outgrow them.
    """
    h, k, dv = attn.n_heads, attn.d_k, attn.d_v
    d = attn.w_q.weight.size(1)
    scale = 1.0 / math.sqrt(k)
    keys_t = keys[0].transpose(1, 2)  # (H, S, K) -> (H, K, S)
    w_q = attn.w_q.weight.view(h, k, d).transpose(1, 2)  # (H*K, D) -> (H, D, K): W_h^Q
    a = torch.bmm(w_q, keys_t).mul_(scale)  # (H, D, S)
    if attn.w_q.bias is None:
        c = keys_t.new_zeros(h, 1, keys_t.size(2))
    else:
        c = torch.bmm(attn.w_q.bias.view(h, 1, k), keys_t).mul_(scale)  # (H, 1, S)
    if valid is not None:
        c.masked_fill_(~valid, float("-inf"))
    w_o = attn.w_o.weight.view(d, h, dv).permute(1, 2, 0)  # (D, H*Dv) -> (H, Dv, D): W_h^O
    m = torch.bmm(values[0], w_o).view(-1, d)  # (H, S, D) -> (H*S, D)
    return a, c, m


def _folded_cross_attention(
    y: Tensor, folded: tuple[Tensor, Tensor, Tensor], bias: Tensor | None
) -> Tensor:
    """y (G, D), the G hypotheses of one sentence -> MultiHead (G, D) from
    ``fold_cross_attention``'s A, c, M and W^O's bias."""
    a, c, m = folded  # (H, D, S), (H, 1, S), (H*S, D)
    g = y.size(0)
    scores = torch.baddbmm(c, y.expand(a.size(0), g, y.size(1)), a)  # (H, G, S)
    p = scores.softmax(-1)
    # (H, G, S) -> (G, H*S): head-major as M's rows
    p = p.view(1, -1) if g == 1 else p.transpose(0, 1).reshape(g, -1)
    return p @ m if bias is None else torch.addmm(bias, p, m)


def _heads(x: Tensor, n_heads: int) -> Tensor:
    """(N, H*size) -> (N, H, 1, size), a view (also of a column slice)."""
    return x.view(x.size(0), n_heads, 1, -1)


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

    ``fold_cross_attention``: for a batch of one sentence, encoder-decoder attention through
    ``fold_cross_attention`` (two products a step instead of four); None = on for float32 CPU
    weights; float32 only.

    Extra memory: one copy of the projection weights of the encoder, of the decoder and of the
    pre-softmax matrix, and a second of the decoder's and the pre-softmax matrix for one row (the
    column blocks; with oneDNN and no split, small projections keep a transposed copy instead).
    """

    def __init__(
        self,
        model: Transformer,
        cpu_matmul: CpuMatmul = "auto",
        one_row_parts: int | None = None,
        fold_cross_attention: bool | None = None,
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
        if fold_cross_attention and weight.dtype != torch.float32:
            raise ValueError(f"fold_cross_attention needs float32 weights, not {weight.dtype}")
        self.fold_cross = cpu_fp32 if fold_cross_attention is None else fold_cross_attention
        with torch.no_grad():
            self.encoder_layers = tuple(
                _LayerWeights.of(layer, self.onednn) for layer in model.encoder.layers
            )
            self.layers = tuple(
                _DecoderLayerWeights.of(layer, self.onednn, one_row_parts)
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
            x = self._encoder_layer(x, weights, b, mask)
        return encoder.final_norm(x.view(b, s, d)), src_valid

    def new_cache(self) -> DecoderCache:
        return self.model.new_cache()

    def decode(
        self, tgt: Tensor, memory: Tensor, src_valid: Tensor, cache: DecoderCache | None = None
    ) -> Tensor:
        """``Transformer.decode`` in eval mode: tgt (N, T), memory (B, S, D), src_valid (B, S)
        -> logits (N, T, V), N = B*G target rows, G per sentence (rows sentence-major)."""
        if cache is None or tgt.size(1) != 1:
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

    def _encoder_layer(self, x: Tensor, w: _LayerWeights, b: int, mask: Tensor | None) -> Tensor:
        """x (B*S, D) -> (B*S, D): one encoder layer (``EncoderLayer.forward``), B sentences."""
        h, n, dtype = w.n_heads, x.size(0), x.dtype

        def self_attention(y: Tensor) -> Tensor:
            qkv = _attention_input(w.qkv(y))  # (B*S, H*K + H*K + H*Dv)
            sizes = (h * w.d_k, h * w.d_k, h * w.d_v)
            # each (B*S, H*size) -> (B, S, H, size) -> (B, H, S, size)
            q, k, v = (t.view(b, n // b, h, -1).transpose(1, 2) for t in qkv.split(sizes, 1))
            out = attention(q, k, v, mask)  # (B, H, S, Dv)
            out = out.transpose(1, 2).reshape(n, h * w.d_v)  # (B, S, H, Dv) -> (B*S, H*Dv)
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
                q, k, v = (_heads(t, h) for t in qkv.split((h * w.d_k, h * w.d_k, h * w.d_v), 1))
            keys, values = cache.append(k, v)  # (N, H, t + 1, K), (N, H, t + 1, Dv)
            # the one new query may see every cached key: no mask
            out = attention(q, keys, values)  # (N, H, 1, Dv)
            return w.self_out(_as_dtype(out.reshape(n, h * w.d_v), dtype))  # -> (N, H*Dv)

        def cross_attention(y: Tensor) -> Tensor:
            if cache.cross_k is None:  # MultiHeadAttention.project_key_value, each contiguous
                kv = _attention_input(w.cross_kv(memory.flatten(0, 1)))  # (B*S, H*K + H*Dv)
                k, v = kv.split((h * w.d_k, h * w.d_v), 1)
                cache.cross_k, cache.cross_v = (  # (B, S, H, size) -> (B, H, S, size)
                    t.view(*memory.shape[:2], h, -1).transpose(1, 2).contiguous() for t in (k, v)
                )
            b = cache.cross_k.size(0)  # (B, H, S, K)
            if b == 1 and self.fold_cross:
                if cache.cross_folded is None:
                    valid = None if mask is None else mask.reshape(-1)  # (1, 1, 1, S) -> (S,)
                    cache.cross_folded = fold_cross_attention(
                        w.cross_attn, cache.cross_k, cache.cross_v, valid
                    )
                return _folded_cross_attention(y, cache.cross_folded, w.cross_out.bias)
            if n % b:
                raise ValueError(f"{n} target rows are not a multiple of {b} source rows")
            # The G = N / B hypotheses of a sentence query its keys together as G positions
            # (see DecoderLayer._cross_attention).
            q = _attention_input(w.cross_query(y))  # (N, H*K)
            q = q.view(b, n // b, h, w.d_k).transpose(1, 2)  # (B, G, H, K) -> (B, H, G, K)
            # G > 1 (beams): the formula's batched products beat the fused kernel's blocks of G
            # queries (2.5-4x at 4 queries, 20-60 keys; even at 1, benchmarks/RESULTS.md)
            fast = n == b
            out = attention(q, cache.cross_k, cache.cross_v, mask, fast=fast)  # (B, H, G, Dv)
            out = out.transpose(1, 2).reshape(n, h * w.d_v)  # (B, G, H, Dv) -> (N, H*Dv)
            return w.cross_out(_as_dtype(out, dtype))

        x = self._sublayer(x, w.norms[0], self_attention)
        x = self._sublayer(x, w.norms[1], cross_attention)
        return self._sublayer(x, w.norms[2], lambda y: _feed_forward(w, y))


__all__ = ["DecodingModel", "fold_cross_attention"]
