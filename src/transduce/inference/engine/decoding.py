"""The decoder for inference: one new position per step on the key/value cache, computed from
a snapshot of the weights laid out for it.

``Transformer.decode`` runs the decoder modules, which serve training too: every step pays for
module calls, attribute lookups and the general code paths of training (dropout, masks, T
positions). ``DecodingModel`` computes the same function as ``Transformer.decode`` in eval mode for
the single-position steps of a search, with plain tensor operations on weights it copied once:

- every projection as a ``kernels.Projection``: each row count on the layout and matrix library
  that multiplied it fastest, chosen once for the model's weights (``kernels.ProjectionLayout``;
  for one row, the weight's columns in one block per thread);
- W^Q, W^K, W^V of self-attention stacked into one product, W^K, W^V of encoder-decoder
  attention into another;
- for one sentence, encoder-decoder attention folded into two products a step, with W^Q and W^O
  multiplied into the sentence's keys and values once (``folded_attention.py``).

The encoder runs from the same kind of snapshot (``encode``). It is a snapshot: after the model's
weights change (training, ``load_state_dict``, ``.to``), make a new one. Embeddings, positions and
layer norms use the model's own parameters; decoding several positions at once (``tgt`` with
T > 1, or no cache) and a model in training mode run the model itself. The speed-ups over
``Transformer.decode`` are measured in benchmarks/RESULTS.md.

The engine implements the ``ModelConfig`` fields and values listed in ``IMPLEMENTED`` and refuses
a model with any other, so a new model option cannot be decoded wrongly in silence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from transduce import kernels
from transduce.config import ModelConfig
from transduce.inference.engine import batch_step, native_row
from transduce.inference.engine.cache import EngineCache, EngineLayerCache, first_capacity
from transduce.inference.engine.folded_attention import (
    fold_cross_attention,
    fold_pays,
    folded_cross_attention,
)
from transduce.inference.engine.layer_weights import (
    DecoderLayerWeights,
    LayerWeights,
    Norm,
    decoder_layer_weights,
    encoder_layer_weights,
    feed_forward,
)
from transduce.kernels import AttentionPath, Matmul, Projection, ProjectionLayout
from transduce.model.attention import split_heads
from transduce.model.layers import DecoderLayer, EncoderLayer
from transduce.model.transformer import Transformer, source_mask

# Every ModelConfig field with the values the engine implements (None: every value). Dropout is
# any value since the engine decodes in eval mode (a model in training mode runs itself).
IMPLEMENTED: dict[str, tuple[Any, ...] | None] = {
    "n_layers": None,
    "d_model": None,
    "d_ff": None,
    "n_heads": None,
    "d_k": None,
    "d_v": None,
    "dropout": None,
    "attention_dropout": None,
    "activation_dropout": None,
    "positional": ("sinusoidal", "learned"),
    "max_positions": None,
    "norm": ("post", "pre"),
    "tie_embeddings": (True, False),
    "architecture": ("transformer",),
    "rnn_attention": None,
    "input_feeding": None,  # the recurrent baseline's, not read here
    "position_unit": ("token", "word"),
    "activation": ("relu", "swish", "gelu"),
    "output_bias": (True, False),
}


def check_implemented(cfg: ModelConfig) -> None:
    """A ValueError naming the first field of ``cfg`` (or its value) the engine does not
    implement."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name not in IMPLEMENTED:
            raise ValueError(
                f"DecodingModel does not implement ModelConfig.{f.name} (= {value!r}); "
                "teach inference/engine/decoding.py about it and add it to IMPLEMENTED"
            )
        allowed = IMPLEMENTED[f.name]
        if allowed is not None and value not in allowed:
            raise ValueError(
                f"DecodingModel does not implement ModelConfig.{f.name} = {value!r} "
                f"(it implements {', '.join(map(repr, allowed))})"
            )


def _as_dtype(x: Tensor, dtype: torch.dtype) -> Tensor:
    # a Python comparison costs less than the call to .to() that would return x unchanged
    return x if x.dtype == dtype else x.to(dtype)


class DecodingModel:
    """A Transformer for searches: the decoding contract (``encode``, ``decode``, ``new_cache``)
    with the encoder and single-position steps computed from a snapshot of the weights (see the
    module docstring). Greedy and beam search take it in place of the model; ``Translator`` uses
    one.

    ``matmul`` picks the matrix library for the float32 products on the CPU (``kernels.Matmul``,
    chosen by ``kernels.ProjectionLayout.choose``); ``attention`` the attention path
    (``kernels.AttentionPath``): "auto" takes the fused kernel, and for the encoder-decoder
    attention of beams what ``kernels.grouped_queries_path`` picks. Either gives the same
    function up to float rounding. What runs the model's modules (several positions at once,
    training mode) takes the model's own ``KernelOptions``.

    ``one_row_parts``: one-row products (a batch of one sentence, greedy) split W's columns into
    this many blocks multiplied at once, one per thread (``kernels.ProjectionLayout``); None =
    the kernels' choice for the weights' device and dtype, or 1 (no blocks) where the native
    step below takes one sentence's rows. Made at construction: a later change
    of the thread count keeps the split.

    ``fold_one_sentence``: for a batch of one sentence whose source is short enough
    (``fold_pays``), encoder-decoder attention in two products a step instead of four
    (``folded_attention.py``); None = on where one-row products are bound by reading the weights
    (``kernels.one_row_is_read_bound``: float32 on the CPU); float32 only, never with int8.

    ``int8``: every projection (the encoder's, the decoder's and the pre-softmax matrix) with
    its weights quantised to int8 per output channel and its input per row on every call
    (``kernels.Int8Projection``: a row's result the same whatever the other rows), float32 CPU
    weights only. Embeddings, layer norms, softmax and attention over the cache stay float32.
    No fold: it would multiply a sentence alone by the float32 W^Q, W^O and the same sentence
    in a batch by the int8 ones, so its translation would depend on its company (it saved 6%
    of a batch-1 int8 greedy search of benchmarks/decode.py's SMALL, 1 thread). Decoding several
    positions at once (scoring) then runs one position at a time through the same int8 steps,
    so that every output of this model comes from the int8 weights. Memory: the int8 copies (a
    quarter of the float32 ones) in place of the float32 copies: one where the native int8
    kernel takes every product, two where the library kernels split the row counts between
    them (``kernels.Int8Projection`` says which).

    ``native_row_step``: a step of the hypothesis rows of one sentence (a sentence decoded
    alone: greedy, or a beam of up to ``native_row.MAX_ROWS``) in one native call through the
    whole decoder (``native_row.py``), float32 weights on the CPU, with int8 products where
    ``int8``; None = where it applies (the native kernels built), False = never, True = a
    ValueError where it does not apply. It computes the same function within float32 rounding
    (int8: the same int8 sums).

    ``lineage_steps``: a batch's one-position steps attend over the cache through a table of
    where each hypothesis' positions lie (``EngineCache.lineage``), so that a beam's reorder
    moves rows of that table instead of the cached keys and values, and the step's keys are
    written in the same native call (``kernels.cached_self_attention``); None = where it runs
    (``attention`` "auto", float32 CPU weights, the native kernels built), False = never, True
    = a ValueError where it does not run. Steps with gradients on, several positions at once
    and a sentence's native steps take their own paths (the table's positions gathered first).
    The same function within float32 rounding.

    ``native_batch_step``: such a step of a batch through every layer and the pre-softmax
    projection in one native call of the same operators (``batch_step.py``), float32 products
    on the libraries chosen for them; None = where it applies, False = never, True = a
    ValueError where it does not. The same numbers as the layers' Python.

    Extra memory: one copy of the projection weights of the encoder, of the decoder and of the
    pre-softmax matrix; a second of the decoder's and the pre-softmax matrix for one row (the
    native step's packing, else the column blocks, or for some layouts the small ones'
    transposed copies: ``kernels.Projection``); with the fold, a third of the decoder's W^Q and
    W^O.
    """

    model: Transformer
    int8: bool
    attention: AttentionPath
    layout: ProjectionLayout
    one_row_parts: int
    encoder_layers: tuple[LayerWeights, ...]
    layers: tuple[DecoderLayerWeights, ...]
    generator: Projection
    pre_norm: bool
    row_plan: native_row.RowPlan | None
    lineage_steps: bool
    batch_plan: batch_step.BatchPlan | None

    def __init__(
        self,
        model: Transformer,
        *,
        matmul: Matmul = "auto",
        attention: AttentionPath = "auto",
        one_row_parts: int | None = None,
        fold_one_sentence: bool | None = None,
        int8: bool = False,
        native_row_step: bool | None = None,
        lineage_steps: bool | None = None,
        native_batch_step: bool | None = None,
    ) -> None:
        check_implemented(model.config)
        kernels.KernelOptions(matmul=matmul, attention=attention)  # checks both values
        self.model = model
        # the decoder and its embedding, looked up once: a step at batch 1 felt each lookup
        self._decoder = model.decoder
        self._embedding = model.decoder.embed
        self.int8 = int8
        self.attention = attention
        weight = model.generator.weight
        self.row_plan = None
        if native_row_step is not False:
            self.row_plan = native_row.RowPlan.of(model, int8=int8)
        if native_row_step and self.row_plan is None:
            raise ValueError(
                "native_row_step needs float32 CPU weights, one layer-norm epsilon and the "
                "native kernels built"
            )
        if one_row_parts is None and self.row_plan is not None:
            one_row_parts = 1  # the native step multiplies a sentence's rows: no column blocks
        self.layout = layout = ProjectionLayout.choose(weight, matmul, one_row_parts, int8=int8)
        self.one_row_parts = layout.one_row_parts
        if fold_one_sentence and weight.dtype != torch.float32:
            raise ValueError(f"fold_one_sentence needs float32 weights, not {weight.dtype}")
        if fold_one_sentence and int8:  # float32 W^Q, W^O for one sentence, int8 for several
            raise ValueError(
                "fold_one_sentence with int8: a sentence alone would be translated otherwise "
                "than in a batch"
            )
        if fold_one_sentence is None:
            fold_one_sentence = not int8 and kernels.one_row_is_read_bound(weight)
        with torch.no_grad():
            self.encoder_layers = tuple(
                encoder_layer_weights(cast(EncoderLayer, layer), layout)
                for layer in model.encoder.layers  # a ModuleList: typed as Module
            )
            self.layers = tuple(
                decoder_layer_weights(cast(DecoderLayer, layer), layout, fold_one_sentence)
                for layer in model.decoder.layers
            )
            self.generator = Projection.of(  # D -> V; the bias of output_bias
                weight, model.generator.bias, layout
            )
        self.pre_norm = model.config.norm == "pre"
        # the table's steps attend in the native kernel: "auto"'s path, not a pinned one
        self.lineage_steps = (
            lineage_steps is not False
            and attention == "auto"
            and kernels.cached_attention_runs(weight)
        )
        if lineage_steps and not self.lineage_steps:
            raise ValueError(
                "lineage_steps needs attention='auto', float32 CPU weights and the native "
                "kernels built"
            )
        self.batch_plan = None
        if native_batch_step is not False and self.lineage_steps:
            self.batch_plan = batch_step.BatchPlan.of(model, self.layers, self.generator)
        if native_batch_step and self.batch_plan is None:
            raise ValueError(
                "native_batch_step needs lineage steps, float32 products (not int8), K = Dv "
                "and one layer-norm epsilon"
            )
        # (src_valid, its version counter, its source_mask): see memo_source_mask
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
        x = encoder.inputs(src)  # (B, S, D)
        b, s, d = x.shape
        mask = source_mask(src_valid)  # (B, 1, 1, S) or None
        x = x.reshape(b * s, d)  # (B, S, D) -> (B*S, D): the projections take rows
        for weights in self.encoder_layers:
            x = self._encoder_layer(x, weights, b, s, mask)
        return encoder.final_norm(x.view(b, s, d)), src_valid

    def new_cache(self) -> EngineCache:
        """An empty cache for ``decode`` (the model's, in buffers, with room for the fold); its
        steps attend through a lineage table, never gathering the cache's rows, where the
        native kernel runs (``kernels.cached_attention_runs``) and ``lineage_steps``."""
        return EngineCache(len(self.layers), lineage=self.lineage_steps)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_valid: Tensor, cache: EngineCache | None = None
    ) -> Tensor:
        """``Transformer.decode`` in eval mode: tgt (N, T), memory (B, S, D), src_valid (B, S)
        -> logits (N, T, V), N = B*G target rows, G per sentence (rows sentence-major). In
        training mode, the model's own (with dropout); with int8 weights, T > 1 (or no cache)
        one position at a time (``_steps``)."""
        if cache is None or tgt.size(1) != 1 or self.model.training:
            if isinstance(cache, EngineCache):
                cache.settle()
            if self.int8 and not self.model.training:
                return self._steps(tgt, memory, src_valid, cache)
            return self.model.decode(tgt, memory, src_valid, cache)
        decoder, embedding = self._decoder, self._embedding  # (a module's lookups cost ~2 us)
        embed = embedding.weight  # (V, D)
        if decoder.word_slot is None:
            position = _as_dtype(decoder.positions.encoding(cache.length, 1), embed.dtype)  # (1, D)
            # E[tgt] * sqrt(D) + PE[t] (section 3.4-3.5) as one operation
            x = torch.add(position, F.embedding(tgt.view(-1), embed), alpha=embedding.scale)
        else:  # positions counted in word slots: one per row
            x = decoder.inputs(tgt, cache).view(tgt.size(0), -1)  # (N, 1, D) -> (N, D)
        mask = self.memo_source_mask(src_valid)  # (B, 1, 1, S) or None
        engine_cache = isinstance(cache, EngineCache)
        one_sentence = memory.size(0) == 1 and x.size(0) <= native_row.MAX_ROWS
        if engine_cache and one_sentence and self.row_plan is not None:
            logits = self._row_step(x, memory, mask, cache)
            if logits is not None:
                decoder.advance(cache, tgt)
                return logits.unsqueeze(1)  # (N, V) -> (N, 1, V)
        lineage = None  # hypothesis rows attend where the cache's lineage table says
        if engine_cache:
            if not torch.is_grad_enabled():
                lineage = cache.step_lineage(x.size(0), x)
            if lineage is None:
                cache.settle()
        if lineage is not None and self.batch_plan is not None:  # the layers in one call
            for weights, layer_cache in zip(self.layers, cache.layers, strict=True):
                self._cross_keys(weights, layer_cache, memory, mask)
            logits = batch_step.step(self.batch_plan, x, cache, lineage, memory, mask)
            if logits is not None:
                decoder.advance(cache, tgt)
                return logits.unsqueeze(1)  # (N, V) -> (N, 1, V)
        for weights, layer_cache in zip(self.layers, cache.layers, strict=True):
            x = self._layer(x, weights, layer_cache, memory, mask, lineage, cache.length)
        decoder.advance(cache, tgt)
        if self.pre_norm:
            x = decoder.final_norm(x)
        return self.generator(x).unsqueeze(1)  # (N, V) -> (N, 1, V)

    def _steps(
        self, tgt: Tensor, memory: Tensor, src_valid: Tensor, cache: EngineCache | None
    ) -> Tensor:
        """tgt (N, T) -> logits (N, T, V) by T one-position steps on ``cache`` (None: a new
        one): the causal decoder's logits of all positions, through the int8 projections."""
        if tgt.size(1) == 0:  # no position: the model's own (empty) logits
            return self.model.decode(tgt, memory, src_valid, cache)
        cache = self.new_cache() if cache is None else cache
        logits = [
            self.decode(tgt[:, t : t + 1], memory, src_valid, cache) for t in range(tgt.size(1))
        ]
        return torch.cat(logits, dim=1)  # T x (N, 1, V) -> (N, T, V)

    def memo_source_mask(self, src_valid: Tensor) -> Tensor | None:
        """``source_mask(src_valid)``, made once per ``src_valid`` rather than every step (a
        search passes the same tensor until it drops sentences)."""
        # Tensors made under torch.inference_mode (the searches') have no version counter; the
        # searches never change src_valid in place, so for those the identity is the key.
        version = -1 if src_valid.is_inference() else src_valid._version
        memo = self._mask_memo  # one attribute, replaced whole: safe across threads
        if memo is None or memo[0] is not src_valid or memo[1] != version:
            memo = self._mask_memo = (src_valid, version, source_mask(src_valid))
        return memo[2]

    def sublayer(self, x: Tensor, norm: Norm, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """``model.layers.residual`` without dropout, written out: at batch 1 a step is mostly
        Python between small products, and every call more lets the thread pool fall asleep
        between them (benchmarks/RESULTS.md, 2026-11-25)."""
        if self.pre_norm:
            return x + sublayer(norm(x))
        return norm(x + sublayer(x))

    def _encoder_layer(
        self, x: Tensor, w: LayerWeights, b: int, s: int, mask: Tensor | None
    ) -> Tensor:
        """x (B*S, D) -> (B*S, D): one encoder layer (``EncoderLayer.forward``), B sentences."""
        h, dtype, path = w.n_heads, x.dtype, self.attention

        def self_attention(y: Tensor) -> Tensor:
            qkv = kernels.attention_input(w.qkv(y), path)  # (B*S, H*K + H*K + H*Dv)
            sizes = (h * w.d_k, h * w.d_k, h * w.d_v)
            q, k, v = (split_heads(t, h, s) for t in qkv.split(sizes, 1))  # (B, H, S, size)
            out = kernels.attention(q, k, v, mask, path=path)  # (B, H, S, Dv)
            out = out.transpose(1, 2).reshape(b * s, h * w.d_v)  # (B, S, H, Dv) -> (B*S, H*Dv)
            return w.self_out(_as_dtype(out, dtype))

        x = self.sublayer(x, w.norms[0], self_attention)
        return self.sublayer(x, w.norms[1], lambda y: feed_forward(w, y))

    def _layer(
        self,
        x: Tensor,
        w: DecoderLayerWeights,
        cache: EngineLayerCache,
        memory: Tensor,
        mask: Tensor | None,
        lineage: Tensor | None = None,
        t: int = 0,
    ) -> Tensor:
        """x (N, D) -> (N, D): one decoder layer (``DecoderLayer.forward``) for position ``t``;
        with ``lineage`` (``EngineCache.step_lineage``), self-attention through it."""
        h, n, dtype, path = w.n_heads, x.size(0), x.dtype, self.attention

        def self_attention(y: Tensor) -> Tensor:
            qkv = kernels.attention_input(w.qkv(y), path)  # (N, H*K + H*K + H*Dv)
            if w.d_k == w.d_v:  # one call for the three views
                q, k, v = qkv.view(n, 3, h, 1, w.d_k).unbind(1)  # 3 x (N, H, 1, K)
            else:
                sizes = (h * w.d_k, h * w.d_k, h * w.d_v)
                q, k, v = (split_heads(t, h, 1) for t in qkv.split(sizes, 1))  # (N, H, 1, size)
            if lineage is not None:  # the rows' positions where the lineage table says
                first = first_capacity(memory.size(1))
                out = cache.step_attention(q, k, v, lineage, t, first)  # (N, H, 1, Dv)
            else:
                keys, values = cache.append(k, v)  # (N, H, t + 1, K), (N, H, t + 1, Dv)
                # the one new query may see every cached key: no mask
                out = kernels.attention(q, keys, values, path=path)  # (N, H, 1, Dv)
            return w.self_out(_as_dtype(out.reshape(n, h * w.d_v), dtype))  # -> (N, H*Dv)

        x = self.sublayer(x, w.norms[0], self_attention)
        x = self.sublayer(x, w.norms[1], lambda y: self._cross_attention(y, w, cache, memory, mask))
        return self.sublayer(x, w.norms[2], lambda y: feed_forward(w, y))

    def _cross_attention(
        self,
        y: Tensor,
        w: DecoderLayerWeights,
        cache: EngineLayerCache,
        memory: Tensor,
        mask: Tensor | None,
    ) -> Tensor:
        """y (N, D) -> (N, D): encoder-decoder attention of N = B*G rows, G per sentence."""
        self._cross_keys(w, cache, memory, mask)
        if cache.cross_folded is not None:
            return folded_cross_attention(y, cache.cross_folded, w.cross_out.bias)
        keys, values = cache.cross_k, cache.cross_v
        assert keys is not None and values is not None  # made by _cross_keys
        return self.grouped_cross_attention(y, w, keys, values, mask)

    def _cross_keys(
        self, w: DecoderLayerWeights, cache: EngineLayerCache, memory: Tensor, mask: Tensor | None
    ) -> None:
        """The sentences' projected keys and values (cache.cross_k, cross_v), made once a
        search, and for a batch of one sentence their fold where it pays (cache.cross_folded)."""
        if cache.cross_folded is not None:  # this sentence's fold, made at its first step below
            return
        if cache.cross_k is None:  # MultiHeadAttention.project_key_value, each contiguous
            kv = w.cross_kv(memory.flatten(0, 1))  # (B*S, H*K + H*Dv)
            kv = kernels.attention_input(kv, self.attention)
            k, v = kv.split((w.n_heads * w.d_k, w.n_heads * w.d_v), 1)
            # (B, H, S, size), copied once: the formula below multiplies them faster
            cache.cross_k, cache.cross_v = (
                split_heads(t, w.n_heads, memory.size(1)).contiguous() for t in (k, v)
            )
        keys, values = cache.cross_k, cache.cross_v
        assert values is not None
        b, _, s, _ = keys.shape  # (B, H, S, K)
        if b == 1 and w.fold is not None and fold_pays(s, memory.size(-1), w.d_k, w.d_v):
            valid = None if mask is None else mask.reshape(-1)  # (1, 1, 1, S) -> (S,)
            cache.cross_folded = fold_cross_attention(w.fold, keys, values, valid)

    def _row_step(
        self, x: Tensor, memory: Tensor, mask: Tensor | None, cache: EngineCache
    ) -> Tensor | None:
        """x (N, D), the step's input of N hypothesis rows of one sentence -> logits (N, V) by
        ``native_row.step``, position ``cache.length`` written into the layers' buffers; None
        where it does not apply (no valid source position: PyTorch's attention gives zero
        weights there)."""
        plan, t, rows = self.row_plan, cache.length, x.size(0)
        assert plan is not None
        state = cache.row_state
        if state is None or state.capacity <= t or state.rows != rows:
            state = self._row_state(plan, memory, mask, cache, t, rows)
            if state is None:
                return None
            cache.row_state = state
        return native_row.step(plan, state, x, t)

    def _row_state(
        self,
        plan: native_row.RowPlan,
        memory: Tensor,
        mask: Tensor | None,
        cache: EngineCache,
        t: int,
        rows: int,
    ) -> native_row.RowState | None:
        """The sentence's ``RowState`` for ``rows`` hypothesis rows: the cross-attention
        tensors, and buffers with room past position ``t`` (the views made current first, the
        buffers grown where full)."""
        cache.settle()
        for w, layer_cache in zip(self.layers, cache.layers, strict=True):
            self._cross_keys(w, layer_cache, memory, mask)
        cross: list[Tensor] = []
        folded = all(layer.cross_folded is not None for layer in cache.layers)
        if folded:
            for layer in cache.layers:
                assert layer.cross_folded is not None
                cross += [f.contiguous() for f in layer.cross_folded]
        else:
            valid = None if mask is None else mask.reshape(-1)  # (1, 1, 1, S) -> (S,)
            if valid is not None and not bool(valid.any()):
                return None
            additive = memory.new_zeros(0 if valid is None else valid.numel())
            if valid is not None:
                additive.masked_fill_(~valid, float("-inf"))  # (S,): 0 or -inf
            for layer in cache.layers:
                assert layer.cross_k is not None and layer.cross_v is not None
                # contiguous: the model's own decode of several positions leaves views
                cross += [layer.cross_k.contiguous(), layer.cross_v.contiguous(), additive]
        _, _, h, d_k, d_v, *_ = plan.dims
        buffers: list[Tensor] = []
        for layer in cache.layers:  # first buffers as _layer's
            kb, vb = layer.reserve(t + 1, rows, h, d_k, d_v, memory, first_capacity(memory.size(1)))
            if kb.size(0) < rows:  # more rows than the cache holds: not a step on this cache
                raise ValueError(f"{rows} rows against a cache of {kb.size(0)} rows")
            buffers += [kb.narrow(0, 0, rows), vb.narrow(0, 0, rows)]  # the rows in use
        return native_row.RowState(buffers, cross, folded, buffers[0].size(1), rows)

    def grouped_cross_attention(
        self,
        y: Tensor,
        w: DecoderLayerWeights,
        keys: Tensor,
        values: Tensor,
        mask: Tensor | None,
    ) -> Tensor:
        """y (N, D) -> (N, D): encoder-decoder attention of N = B*G rows, G per sentence, on the
        projected keys (B, H, S, K) and values (B, H, S, Dv), unfolded."""
        b, n, path = keys.size(0), y.size(0), self.attention
        if n % b:
            raise ValueError(f"{n} target rows are not a multiple of {b} source rows")
        # The G = N / B hypotheses of a sentence query its keys together as G positions
        # (see DecoderLayer._cross_attention).
        q = split_heads(kernels.attention_input(w.cross_query(y), path), w.n_heads, n // b)
        if n != b:  # G > 1 hypotheses a sentence (beams)
            path = kernels.grouped_queries_path(q, path)
        out = kernels.attention(q, keys, values, mask, path=path)  # (B, H, G, Dv)
        out = out.transpose(1, 2).reshape(n, w.n_heads * w.d_v)  # (B, G, H, Dv) -> (N, H*Dv)
        return w.cross_out(_as_dtype(out, y.dtype))


__all__ = ["IMPLEMENTED", "DecodingModel", "check_implemented"]
