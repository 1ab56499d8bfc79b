"""The decoder for inference: one new position per step on the key/value cache, computed from
a snapshot of the weights laid out for it.

``Transformer.decode`` runs the decoder modules, which serve training too: every step pays for
module calls, attribute lookups and the general code paths of training (dropout, masks, T
positions); on a CPU at batch 1 that was about a fifth of a step (the speed-ups below).
``DecodingModel`` computes the same function as ``Transformer.decode`` in eval mode for the
single-position steps of a search, with plain tensor operations on weights it copied once:

- every projection of a decoder step as ``addmm(bias, x, W_t)`` with ``W_t`` the weight
  transposed to (in, out), which MKL multiplies faster than nn.Linear's (out, in) layout at
  most decoding shapes (Intel machine, 2 threads, float32: 1.0-1.2x at 1, 32 and 128 rows,
  1.0-1.7x at 4 rows except 0.6x for the 1024 -> 256 projection; up to 2.5x for one or two
  rows on the AMD machine; benchmarks/RESULTS.md);
- W^Q, W^K, W^V of self-attention stacked into one product;
- on x86 CPUs not made by Intel, float32 products through oneDNN's inner product instead of MKL,
  whose sgemm runs AVX-512 kernels only on Intel's CPUs: 1.3-2.7x faster products at 4-128 rows
  on an AMD Zen 5 (benchmarks/RESULTS.md, 2026-11-24); one row keeps MKL for small weights.

Against ``Transformer.decode`` (benchmarks/RESULTS.md, 2026-11-23): 1.22-1.25x faster batch-1
greedy search, 1.18-1.21x batch-32 greedy, 1.06-1.08x batch-32 beam 4, SMALL and BASE.

It is a snapshot: after the model's weights change (training, ``load_state_dict``, ``.to``),
make a new one. The encoder, the cross-attention keys and values (projected once per sentence)
and decoding several positions at once (``tgt`` with T > 1, or no cache) run the model itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from transduce.model.attention import MultiHeadAttention, _fp32_on_cpu, attention
from transduce.model.cache import DecoderCache, LayerCache
from transduce.model.layers import DecoderLayer
from transduce.model.linear import (
    ONE_ROW_MKL_MAX_ELEMENTS,
    CpuMatmul,
    onednn_linear,
    use_onednn,
)
from transduce.model.transformer import Transformer, source_mask


def transposed(weight: Tensor, block: int = 256) -> Tensor:
    """(out, in) -> a contiguous (in, out) copy, written ``block`` rows at a time: about twice as
    fast as ``weight.t().contiguous()`` on the CPU, whose strided copy misses the cache."""
    out = weight.new_empty(weight.size(1), weight.size(0))  # (in, out)
    for i in range(0, weight.size(0), block):
        out[:, i : i + block].copy_(weight[i : i + block].t())
    return out


@dataclass(frozen=True)
class _Projection:
    """x (N, in) -> x W^T + b (N, out), through MKL's addmm on W^T (in, out) stored contiguous,
    or oneDNN's inner product on W (out, in) where ``weight`` is kept (``model.linear``)."""

    weight_t: Tensor | None  # W^T (in, out); None when oneDNN takes every row count
    bias: Tensor | None
    weight: Tensor | None = None  # W (out, in) for oneDNN; None = MKL only

    @classmethod
    def of(cls, weight: Tensor, bias: Tensor | None, onednn: bool = False) -> _Projection:
        bias = None if bias is None else bias.clone()
        if not onednn:
            return cls(transposed(weight), bias)
        one_row_mkl = weight.numel() <= ONE_ROW_MKL_MAX_ELEMENTS
        return cls(transposed(weight) if one_row_mkl else None, bias, weight.contiguous().clone())

    def __call__(self, x: Tensor) -> Tensor:
        if self.weight is not None and (self.weight_t is None or x.size(0) > 1):
            return onednn_linear(x, self.weight, self.bias)
        if self.bias is None:
            return x @ self.weight_t
        return torch.addmm(self.bias, x, self.weight_t)


@dataclass(frozen=True)
class _LayerWeights:
    """One decoder layer's weights for a step. The projections are copies; ``norms`` (the layer
    norms' parameters) and ``cross_attn`` (the module) are the model's own."""

    qkv: _Projection  # self-attention W^Q, W^K, W^V stacked: (D, H*K + H*K + H*Dv)
    self_out: _Projection
    cross_query: _Projection
    cross_out: _Projection
    ffn_in: _Projection
    ffn_out: _Projection
    norms: tuple[tuple[tuple[int, ...], Tensor, Tensor, float], ...]  # F.layer_norm's arguments
    cross_attn: MultiHeadAttention  # projects the encoder output once per sentence
    n_heads: int
    d_k: int
    d_v: int

    @classmethod
    def of(cls, layer: DecoderLayer, onednn: bool = False) -> _LayerWeights:
        sa, ca, ffn = layer.self_attn, layer.cross_attn, layer.ffn
        return cls(
            qkv=_Projection.of(*sa.stack_qkv(), onednn),
            self_out=_Projection.of(sa.w_o.weight, sa.w_o.bias, onednn),
            cross_query=_Projection.of(ca.w_q.weight, ca.w_q.bias, onednn),
            cross_out=_Projection.of(ca.w_o.weight, ca.w_o.bias, onednn),
            ffn_in=_Projection.of(ffn.w_1.weight, ffn.w_1.bias, onednn),
            ffn_out=_Projection.of(ffn.w_2.weight, ffn.w_2.bias, onednn),
            norms=tuple((n.normalized_shape, n.weight, n.bias, n.eps) for n in layer.norms),
            cross_attn=ca,
            n_heads=sa.n_heads,
            d_k=sa.d_k,
            d_v=sa.d_v,
        )


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
    with single-position steps computed from a snapshot of the decoder's weights (see the module
    docstring). Greedy and beam search take it in place of the model; ``Translator`` uses one.

    ``cpu_matmul`` picks the library for the step's float32 products on the CPU (``use_onednn``):
    "auto" (oneDNN on x86 CPUs not made by Intel, else MKL), "mkl" or "onednn". The two give the
    same function up to float rounding. The encoder and the cross-attention keys and values run
    the model's modules, whose library ``model.linear.set_cpu_matmul`` chooses.

    Extra memory: one copy of the decoder's projection weights and of the pre-softmax matrix
    (with oneDNN, small projections keep a second, transposed copy for one-row products).
    """

    def __init__(self, model: Transformer, cpu_matmul: CpuMatmul = "auto") -> None:
        if model.generator.bias is not None:
            raise ValueError("the pre-softmax projection of a Transformer has no bias")
        self.model = model
        self.onednn = use_onednn(cpu_matmul, model.generator.weight)
        with torch.no_grad():
            self.layers = tuple(
                _LayerWeights.of(layer, self.onednn) for layer in model.decoder.layers
            )
            self.generator = _Projection.of(model.generator.weight, None, self.onednn)  # D -> V
        self.pre_norm = model.config.norm == "pre"
        # (src_valid, its version counter, its source_mask): see _source_mask
        self._mask_memo: tuple[Tensor, int, Tensor | None] | None = None

    @property
    def training(self) -> bool:
        """The model's mode: searches refuse a model in training mode (its encoder would drop)."""
        return self.model.training

    def encode(self, src: Tensor, src_valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, D), src_valid (B, S): ``Transformer.encode``."""
        return self.model.encode(src, src_valid)

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

    def _sublayer(self, x: Tensor, norm: tuple, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """``DecoderLayer``'s residual wrapping (post- or pre-norm), without dropout."""
        if self.pre_norm:
            return x + sublayer(F.layer_norm(x, *norm))
        return F.layer_norm(x + sublayer(x), *norm)

    def _layer(
        self, x: Tensor, w: _LayerWeights, cache: LayerCache, memory: Tensor, mask: Tensor | None
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
            if cache.cross_k is None:
                cache.cross_k, cache.cross_v = w.cross_attn.project_key_value(memory)
            b = cache.cross_k.size(0)  # (B, H, S, K)
            if n % b:
                raise ValueError(f"{n} target rows are not a multiple of {b} source rows")
            # The G = N / B hypotheses of a sentence query its keys together as G positions
            # (see DecoderLayer._cross_attention).
            q = _attention_input(w.cross_query(y))  # (N, H*K)
            q = q.view(b, n // b, h, w.d_k).transpose(1, 2)  # (B, G, H, K) -> (B, H, G, K)
            out = attention(q, cache.cross_k, cache.cross_v, mask)  # (B, H, G, Dv)
            out = out.transpose(1, 2).reshape(n, h * w.d_v)  # (B, G, H, Dv) -> (N, H*Dv)
            return w.cross_out(_as_dtype(out, dtype))

        def ffn(y: Tensor) -> Tensor:
            return w.ffn_out(w.ffn_in(y).relu_())

        x = self._sublayer(x, w.norms[0], self_attention)
        x = self._sublayer(x, w.norms[1], cross_attention)
        return self._sublayer(x, w.norms[2], ffn)


__all__ = ["DecodingModel", "transposed"]
