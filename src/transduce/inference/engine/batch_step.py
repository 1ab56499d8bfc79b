"""A batch's decoder step in one native call, for searches on the lineage table.

A beam search on a batch (32 sentences x 4 beams) spends each step in some 20 operators a
layer: products, attention, residual sums and norms, and the Python between them; the Python
alone was ~8% of SMALL's beam search on a batch (benchmarks/RESULTS.md).
``kernels.native.decoder_batch_step`` calls the same operators with the same arguments in the
same order from C++ (``DecodingModel._layer``'s lineage path, every layer, then the final norm
and the pre-softmax projection), so the logits are the same numbers.

``BatchPlan.of`` returns None where it does not apply: int8 products, an activation other than
the model's three (ReLU, swish, GELU), K != Dv, layer norms with different epsilons. Float32
products go to the library that ``kernels.Projection`` chose for many rows
(``Projection.many_rows``).
``step`` returns None for a step it does not take (a single row, more hypotheses a sentence
than the attention kernel takes, a folded encoder-decoder attention); the engine then takes
its Python path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transduce.inference.engine.cache import EngineCache, first_capacity
from transduce.inference.engine.layer_weights import DecoderLayerWeights
from transduce.kernels import Projection, native
from transduce.kernels.attention import NATIVE_MAX_QUERIES
from transduce.model.layers import DecoderLayer
from transduce.model.transformer import Transformer


def _projections(w: DecoderLayerWeights) -> tuple[Projection, ...]:
    """A layer's products in the kernel's order (batch_step.cpp's ``Proj``)."""
    return (w.qkv, w.self_out, w.cross_query, w.cross_out, w.ffn_in, w.ffn_out)


# batch_step.cpp's ``Activation``: the engine's (None: ReLU, in the product's call) by code
ACTIVATIONS: dict[Callable[[Tensor], Tensor] | None, int] = {None: 0, F.silu: 1, F.gelu: 2}


@dataclass(frozen=True)
class BatchPlan:
    """What ``decoder_batch_step`` takes besides a step's tensors: each product's weight in its
    library's layout, bias (empty for none), library (``Projection.many_rows``) and output
    count, 6 a layer then the pre-softmax projection's; the layer norms' parameters (the
    model's own: 3 pairs a layer, then the final norm's, empty after post-norm layers); L, H, K,
    pre-norm, the FFN's activation (``ACTIVATIONS``); the norms' epsilon."""

    weights: list[Tensor]
    biases: list[Tensor]
    kinds: list[int]
    outs: list[int]
    norms: list[Tensor]
    dims: list[int]
    eps: float

    @classmethod
    def of(
        cls, model: Transformer, layers: tuple[DecoderLayerWeights, ...], generator: Projection
    ) -> BatchPlan | None:
        """The plan for the engine's ``layers`` and ``generator`` of ``model``, or None where
        the native step does not apply (the module docstring)."""
        projections = [p for w in layers for p in _projections(w)] + [generator]
        if not layers or not native.available():
            return None
        many = [p.many_rows() for p in projections]  # None for int8
        if any(m is None for m in many):
            return None
        activations = {w.activation for w in layers}
        if len(activations) != 1 or any(w.d_k != w.d_v for w in layers):
            return None
        activation = ACTIVATIONS.get(activations.pop())
        if activation is None:
            return None
        model_layers = [cast(DecoderLayer, layer) for layer in model.decoder.layers]
        norms = [cast(nn.LayerNorm, n) for layer in model_layers for n in layer.norms]
        pre = model.config.norm == "pre"
        final = cast(nn.LayerNorm, model.decoder.final_norm) if pre else None
        if len({n.eps for n in [*norms, *([final] if final is not None else [])]}) != 1:
            return None
        empty = norms[0].weight.new_empty(0)
        params: list[Tensor] = [t for n in norms for t in (n.weight, n.bias)]
        params += [final.weight, final.bias] if final is not None else [empty, empty]
        chosen = [cast(tuple[Tensor, int], m) for m in many]
        return cls(
            weights=[w for w, _ in chosen],
            biases=[empty if p.bias is None else p.bias for p in projections],
            kinds=[kind for _, kind in chosen],
            outs=[p.out_features for p in projections],
            norms=params,
            dims=[len(layers), layers[0].n_heads, layers[0].d_k, int(pre), activation],
            eps=float(norms[0].eps),
        )


def step(
    plan: BatchPlan,
    x: Tensor,
    cache: EngineCache,
    lineage: Tensor,
    memory: Tensor,
    mask: Tensor | None,
) -> Tensor | None:
    """x (N, D) the step's input of N = B*G hypothesis rows (G of each of memory's B sentences)
    at position ``cache.length`` -> logits (N, V), the step's keys and values written into the
    layers' buffers where ``lineage`` (N, L) says (``EngineCache.step_lineage``); None where the
    step is not taken (the module docstring). The cache's encoder-decoder keys and values must
    be made (``DecodingModel._cross_keys``)."""
    n, b, t = x.size(0), memory.size(0), cache.length
    if n < 2 or n % b or n // b > NATIVE_MAX_QUERIES:
        return None
    if mask is not None and mask.dtype != torch.bool:
        return None
    kv: list[Tensor] = []
    cross: list[Tensor] = []
    _, h, k, *_ = plan.dims
    for layer in cache.layers:
        if layer.cross_folded is not None or layer.cross_k is None or layer.cross_v is None:
            return None
        # the first buffers as DecodingModel._layer's steps make them
        kv += layer.reserve_rows(t + 1, n, t, h, k, k, x, first_capacity(memory.size(1)))
        cross += [layer.cross_k, layer.cross_v]
    no_mask = x.new_empty(0, dtype=torch.bool)
    return native.decoder_batch_step(
        x,
        plan.weights,
        plan.biases,
        plan.kinds,
        plan.outs,
        plan.norms,
        kv,
        lineage,
        t,
        cross,
        no_mask if mask is None else mask,
        plan.dims,
        plan.eps,
    )


__all__ = ["BatchPlan", "step"]
