"""Decoding steps on static buffers, replayed as one CUDA graph.

On a GPU the engine's step (``DecodingModel.decode``) is some fifteen kernels a layer, each
launched from Python, and a batch of a few hundred rows takes the device less time than the
launches take the host: the step is bound by launches. ``StaticDecoder`` keeps the decoding
contract over a ``DecodingModel`` and runs every step after the first on tensors whose shapes
and addresses stay the same from step to step, so that on CUDA the whole step is captured once
as a CUDA graph (``torch.cuda.CUDAGraph``) and replayed with one launch:

- the self-attention cache in (N, H, capacity, K) buffers, written at position t in place and
  attended through a mask of the positions <= t (the engine attends its t + 1 cached positions,
  a shape that changes every step); when full the capacity doubles and the graph is captured
  again, so a search of L steps captures about log2(L / capacity) + 1 graphs;
- the step's inputs (tokens, t) in tensors written before each replay, the logits in the graph's
  own output, copied out for the search;
- the N rows of the batch as it was at the second step kept throughout: a search that drops
  finished sentences (``select_sources``) or moves hypotheses (``reorder``) moves rows within
  the buffers through a map from its rows to these, and the rows of dropped sentences are
  computed and never read (cheaper on a GPU than a graph for every batch size).

The first step (the searches' BOS, before a beam expands B rows to B*W) runs on the engine's own
cache, and the buffers are filled from it at the second step. Without CUDA, or with
``graphs=False``, the same static step runs eagerly: that is how the tests compare it with the
engine on a CPU. The engine's fold of one sentence's encoder-decoder attention is not used here
(it is for CPUs). Positions counted in word slots (``position_unit: word``) are refused.

Shapes: N target rows = B sentences x G hypotheses, rows sentence-major; H heads; K, Dv the key
and value sizes; S source positions; C the capacity; V the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from transduce import kernels
from transduce.inference.engine.cache import EngineCache
from transduce.inference.engine.decoding import DecodingModel
from transduce.inference.engine.layer_weights import DecoderLayerWeights, feed_forward
from transduce.model.attention import split_heads
from transduce.model.positions import LearnedPositions

# positions a buffer holds at first (doubled when full)
DEFAULT_CAPACITY = 64
# un-captured steps before a capture: CUDA libraries set up handles and workspaces on first use
_WARMUP_STEPS = 2


@dataclass
class StaticCache:
    """The cache of a ``StaticDecoder``: the engine's own (``eager``) for the first step, then
    the static buffers (``steps``). Keeps the decoding contract (``reorder``,
    ``select_sources``) in both."""

    eager: EngineCache
    steps: _StaticSteps | None = field(default=None, repr=False)

    @property
    def length(self) -> int:
        """Target positions in the cache (as ``DecoderCache.length``)."""
        return self.eager.length if self.steps is None else self.steps.t

    def reorder(self, index: Tensor) -> None:
        """Keep hypothesis rows ``index`` (N_new,) in that order (``DecodingCache``)."""
        if self.steps is None:
            self.eager.reorder(index)
        else:
            self.steps.reorder(index)

    def select_sources(self, index: Tensor) -> None:
        """Keep source-sentence rows ``index`` (B_new,) (``DecodingCache``)."""
        if self.steps is None:
            self.eager.select_sources(index)
        else:
            self.steps.select_sources(index)


class StaticDecoder:
    """The decoding contract over ``engine`` with every step after the first on static buffers,
    on CUDA captured once as a CUDA graph and replayed (module docstring).

    ``graphs``: capture and replay (CUDA only); None = where the engine's weights are on a CUDA
    device. ``capacity``: target positions the buffers hold at first (they double when full).
    Give each search its own cache (``new_cache``), as every search does."""

    def __init__(
        self, engine: DecodingModel, *, graphs: bool | None = None, capacity: int = DEFAULT_CAPACITY
    ) -> None:
        if engine.model.decoder.word_slot is not None:
            raise ValueError(
                "StaticDecoder counts positions in tokens; this model counts them in word slots "
                "(position_unit: word)"
            )
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        device = engine.model.generator.weight.device
        if graphs is None:
            graphs = kernels.graphs_capture(device)
        if graphs and not kernels.graphs_capture(device):
            raise ValueError(f"CUDA graphs need the model on a CUDA device, not on {device}")
        self.engine, self.graphs, self.capacity = engine, graphs, capacity
        self.device = device
        # the stream every capture runs on, made at the first; warmed up there once
        self.capture_stream: torch.cuda.Stream | None = None

    @property
    def training(self) -> bool:
        """The model's mode (searches refuse training mode)."""
        return self.engine.training

    def encode(self, src: Tensor, src_valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The engine's encoder: src (B, S) -> memory (B, S, D), src_valid (B, S)."""
        return self.engine.encode(src, src_valid)

    def new_cache(self) -> StaticCache:
        """An empty cache: the engine's, until the second step makes it static."""
        return StaticCache(self.engine.new_cache())

    def decode(
        self, tgt: Tensor, memory: Tensor, src_valid: Tensor, cache: StaticCache | None = None
    ) -> Tensor:
        """``DecodingModel.decode``: tgt (N, T) -> logits (N, T, V). One position a step with a
        cache holding some: on the static buffers; otherwise the engine's own step."""
        if cache is None or self.engine.training:
            eager = None if cache is None else cache.eager
            return self.engine.decode(tgt, memory, src_valid, eager)
        if cache.steps is None:
            if tgt.size(1) != 1 or cache.eager.length == 0:
                return self.engine.decode(tgt, memory, src_valid, cache.eager)
            cache.steps = _StaticSteps(self, cache.eager, src_valid, tgt.size(0))
        elif tgt.size(1) != 1:
            raise ValueError(
                f"a static cache takes one position a step, not {tgt.size(1)}: decode the "
                "positions one at a time"
            )
        return cache.steps.step(tgt)


class _StaticSteps:
    """The static buffers of one search and its step on them (``StaticDecoder``)."""

    def __init__(self, owner: StaticDecoder, eager: EngineCache, src_valid: Tensor, rows: int):
        engine = self.engine = owner.engine
        self.owner, self.graphs = owner, owner.graphs
        first = eager.layers[0]
        assert first.cross_k is not None and first.self_k is not None  # one step decoded
        sentences = first.cross_k.size(0)  # B
        if rows % sentences or rows != first.self_k.size(0):
            raise ValueError(
                f"{rows} target rows against a cache of {first.self_k.size(0)} rows and "
                f"{sentences} sentences"
            )
        self.rows, self.group = rows, rows // sentences  # N, G
        device = first.cross_k.device
        self.t = eager.length  # positions cached
        self.mask = engine.memo_source_mask(src_valid)  # (B, 1, 1, S) or None, as the engine's
        self.cross = [(layer.cross_k, layer.cross_v) for layer in eager.layers]  # (B, H, S, .)
        self.sents = torch.arange(sentences, device=device)  # (B',) static sentence of each
        self.whole = True  # no sentence dropped: the search's rows are the static ones
        self.slot = torch.arange(self.group, device=device)  # (G,)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)  # (N,) step input
        self.position = torch.zeros(1, dtype=torch.long, device=device)  # (1,) t, step input
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: Tensor | None = None  # (N, V): the graph's output
        self.capacity = 0
        self.all_keys = self.all_values = torch.empty(0)  # (L, N, H, C, K), (L, N, H, C, Dv)
        self.keys: list[Tensor] = []  # per layer (N, H, C, K): views of all_keys
        self.values: list[Tensor] = []  # per layer (N, H, C, Dv)
        cached = [(layer.self_k, layer.self_v) for layer in eager.layers]  # (N, H, t, .)
        self._allocate(max(owner.capacity, 2 * self.t), cached)  # type: ignore[arg-type]
        for layer in eager.layers:  # copied: the engine's buffers are not needed any more
            layer.drop_self_attention()

    def _allocate(self, capacity: int, cached: list[tuple[Tensor, Tensor]]) -> None:
        """Buffers of ``capacity`` positions holding the t cached ones of ``cached``; zeros
        elsewhere (finite: a masked position's weight is 0, and 0 x NaN would not be)."""
        positions = self.engine.model.decoder.positions
        if isinstance(positions, LearnedPositions):  # at most max_positions
            capacity = min(capacity, positions.weight.size(0))
        capacity = max(capacity, self.t + 1)  # the table below refuses a position past them
        embed = self.engine.model.decoder.embed.weight
        # PE[0 : C] in the embeddings' dtype, as the engine adds it (grows a sinusoidal table)
        self.table = positions.encoding(0, capacity).to(embed.dtype)  # (C, D)
        self.range = torch.arange(capacity, device=embed.device)  # (C,)
        k0, v0 = cached[0]
        n, h, t, _ = k0.shape
        # every layer's in one tensor, so that a reorder moves them all in two calls
        self.all_keys = k0.new_zeros(len(cached), n, h, capacity, k0.size(3))  # (L, N, H, C, K)
        self.all_values = v0.new_zeros(len(cached), n, h, capacity, v0.size(3))  # (.., Dv)
        for i, (k, v) in enumerate(cached):
            self.all_keys[i].narrow(2, 0, t).copy_(k)
            self.all_values[i].narrow(2, 0, t).copy_(v)
        self.keys = list(self.all_keys.unbind(0))  # per layer (N, H, C, K), views
        self.values = list(self.all_values.unbind(0))
        self.capacity = capacity
        self.graph, self.logits = None, None  # captured again on these buffers

    def _grow(self) -> None:
        """Twice the capacity (the learned positions' limit refuses a position past it)."""
        cached = [
            (k.narrow(2, 0, self.t), v.narrow(2, 0, self.t))
            for k, v in zip(self.keys, self.values, strict=True)
        ]
        self._allocate(2 * self.capacity, cached)

    def _current_rows(self) -> Tensor:
        """(n,) the static row of each of the search's rows: sentence-major, G a sentence."""
        return (self.sents[:, None] * self.group + self.slot).view(-1)  # (B', G) -> (B'*G,)

    def step(self, tgt: Tensor) -> Tensor:
        """tgt (n, 1) -> logits (n, 1, V) for the search's n rows."""
        n = tgt.size(0)
        if n != self.sents.numel() * self.group:
            raise ValueError(
                f"{n} target rows for {self.sents.numel()} sentences of {self.group} hypotheses"
            )
        if self.t >= self.capacity:
            self._grow()
        rows = None if self.whole else self._current_rows()
        if rows is None:
            self.tokens.copy_(tgt.view(-1))
        else:
            self.tokens.index_copy_(0, rows, tgt.view(-1))
        self.position.fill_(self.t)
        if self.graphs:
            with torch.cuda.device(self.tokens.device):  # the model's GPU, not the current one
                if self.graph is None:
                    self._capture()
                assert self.graph is not None and self.logits is not None
                self.graph.replay()
            logits = self.logits if rows is not None else self.logits.clone()  # not overwritten
        else:
            logits = self._compute()
        self.t += 1
        if rows is not None:
            logits = logits.index_select(0, rows)
        return logits.unsqueeze(1)  # (n, V) -> (n, 1, V)

    def reorder(self, index: Tensor) -> None:
        """The search's row j becomes its row ``index[j]`` (``DecodingCache.reorder``), before
        ``select_sources`` drops sentences: row j then belongs to the sentence of row
        ``index[j]`` (the searches keep a sentence's hypotheses together), in slot j mod G. With
        one hypothesis a sentence no row moves."""
        if self.group == 1 or self.t == 0:
            return
        src = self._current_rows().index_select(0, index)  # (n',) static rows read
        j = torch.arange(index.numel(), device=index.device)
        dst = self.sents.index_select(0, index // self.group) * self.group + j % self.group
        for buffer in (self.all_keys, self.all_values):
            cached = buffer.narrow(3, 0, self.t)  # (L, N, H, t, .)
            cached.index_copy_(1, dst, cached.index_select(1, src))  # read, then written

    def select_sources(self, index: Tensor) -> None:
        """Keep the search's sentences ``index`` (B_new,) (``DecodingCache.select_sources``)."""
        self.sents = self.sents.index_select(0, index)
        self.whole = False

    def _capture(self) -> None:
        """The step as a CUDA graph on the current buffers, captured on the decoder's capture
        stream after warm-up steps there (they write the position being decoded, which the
        step writes again): _WARMUP_STEPS at the decoder's first capture, one after.

        ``capture_begin`` / ``capture_end`` rather than the ``torch.cuda.graph`` context, which
        also synchronises the device and empties the caching allocator: once a search here, so
        every search would give its memory back and allocate it again. Errors are those of this
        thread only ("thread_local"): the server decodes while its other threads serve."""
        owner = self.owner
        first = owner.capture_stream is None
        if owner.capture_stream is None:
            owner.capture_stream = torch.cuda.Stream(device=self.tokens.device)
        side = owner.capture_stream
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            for _ in range(_WARMUP_STEPS if first else 1):
                self._compute()
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                self.logits = self._compute()
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = graph

    def _compute(self) -> Tensor:
        """One step of all N static rows: ``tokens`` at position ``position`` -> (N, V)."""
        engine = self.engine
        decoder = engine.model.decoder
        embed = decoder.embed.weight  # (V, D)
        position = self.table.index_select(0, self.position)  # (1, D)
        # E[tgt] * sqrt(D) + PE[t] (section 3.4-3.5), as DecodingModel.decode
        x = torch.add(position, F.embedding(self.tokens, embed), alpha=decoder.embed.scale)
        visible = (self.range <= self.position).view(1, 1, 1, -1)  # (1, 1, 1, C): keys <= t
        for i, weights in enumerate(engine.layers):
            x = self._layer(x, weights, i, visible)
        if engine.pre_norm:
            x = decoder.final_norm(x)
        return engine.generator(x)  # (N, V)

    def _layer(self, x: Tensor, w: DecoderLayerWeights, i: int, visible: Tensor) -> Tensor:
        """x (N, D) -> (N, D): decoder layer i at position t (``DecodingModel._layer``)."""
        engine, h, n = self.engine, w.n_heads, x.size(0)
        path = engine.attention
        keys, values = self.keys[i], self.values[i]

        def self_attention(y: Tensor) -> Tensor:
            qkv = kernels.attention_input(w.qkv(y), path)  # (N, H*K + H*K + H*Dv)
            sizes = (h * w.d_k, h * w.d_k, h * w.d_v)
            q, k, v = (split_heads(t, h, 1) for t in qkv.split(sizes, 1))  # (N, H, 1, size)
            keys.index_copy_(2, self.position, k.to(keys.dtype))  # position t of every row
            values.index_copy_(2, self.position, v.to(values.dtype))
            out = kernels.attention(q, keys, values, visible, path=path)  # (N, H, 1, Dv)
            return w.self_out(out.reshape(n, h * w.d_v).to(y.dtype))  # -> (N, H*Dv)

        cross_k, cross_v = self.cross[i]
        assert cross_k is not None and cross_v is not None
        x = engine.sublayer(x, w.norms[0], self_attention)
        x = engine.sublayer(
            x,
            w.norms[1],
            lambda y: engine.grouped_cross_attention(y, w, cross_k, cross_v, self.mask),
        )
        return engine.sublayer(x, w.norms[2], lambda y: feed_forward(w, y))


__all__ = ["DEFAULT_CAPACITY", "StaticCache", "StaticDecoder"]
