"""The static tensors of one shape of search and the decoding step on them (``static.py``): on
CUDA captured once as a CUDA graph and replayed, by this search and by later searches of the
same shape, which copy their own values into the same tensors.

Shapes: N target rows = B sentences x G hypotheses, rows sentence-major; L layers; H heads; K, Dv
the key and value sizes; S source positions; C the capacity (target positions); V the vocabulary.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from transduce import kernels
from transduce.inference.engine.cache import EngineCache
from transduce.inference.engine.decoding import DecodingModel
from transduce.inference.engine.layer_weights import DecoderLayerWeights, feed_forward
from transduce.model.attention import split_heads
from transduce.model.positions import LearnedPositions


@dataclass
class CaptureStream:
    """The stream a decoder's captures run on (made at its first), warmed up there once; how
    many captures it ran and the host's seconds in them, warm-up steps included (a lower bound
    on what a new shape costs: the warm-up runs on the device after the host has gone on)."""

    stream: Any = None  # a torch.cuda.Stream
    captures: int = 0
    seconds: float = 0.0


# un-captured steps before the decoder's first capture: CUDA libraries set up handles and
# workspaces on first use, which a capture may not do (later captures: one)
WARMUP_STEPS = 2

# (N rows, B sentences, S source positions, C capacity, masked, cache dtype)
SlotKey = tuple[int, int, int, int, bool, torch.dtype]


def slot_capacity(engine: DecodingModel, wanted: int, t: int) -> int:
    """The capacity of a slot for ``wanted`` positions with ``t`` decoded: at most the learned
    positions' max_positions, and room for position t (past that limit the positions' own
    check refuses it, as the engine's does)."""
    positions = engine.model.decoder.positions
    if isinstance(positions, LearnedPositions):
        wanted = min(wanted, positions.weight.size(0))
    return max(wanted, t + 1)


class Slot:
    """Static tensors for searches of one ``SlotKey`` and the step on them.

    Step inputs ``tokens`` (N,) and ``position`` (1,) (t); the self-attention cache of every
    layer twice, on two sides, each ``(keys (L, N, H, C, K), values (L, N, H, C, Dv))``: the
    step reads and writes the ``side`` in use (``all_keys``, ``all_values``), and a reorder
    (``move_rows``) gathers its rows into the other side, which is then the one in use (one
    pass over the cache, where a reorder in place reads and writes it twice). Zeros where
    never written (finite: a masked position's weight is 0, and 0 x NaN would not be); the
    encoder-decoder keys ``cross_keys`` (L, B, H, S, K) and values, the source ``mask``
    (B, 1, 1, S) or None; on CUDA a graph of the step and its output logits (N, V) for each
    side. ``user``: the search now using it (a weak reference: a search that ended lets it
    go)."""

    cross_keys: Tensor  # (L, B, H, S, K)
    cross_values: Tensor  # (L, B, H, S, Dv)

    def __init__(
        self, engine: DecodingModel, key: SlotKey, eager: EngineCache | None, like: Slot | None
    ) -> None:
        """Zeroed tensors of ``key``'s shapes, the other sizes those of the engine's cache
        ``eager`` after a step, or of the slot ``like``."""
        rows, sentences, source, capacity, masked, dtype = key
        self.engine, self.key, self.capacity = engine, key, capacity
        cross_k: Tensor
        cross_v: Tensor
        if like is not None:
            like_keys: Tensor = like.all_keys
            n_layers, _, h, _, k_size = like_keys.shape
            v_size = like.all_values.size(4)
            cross_k, cross_v = like.cross_keys[0], like.cross_values[0]
        else:
            assert eager is not None
            first = eager.layers[0]
            assert first.self_k is not None and first.self_v is not None
            assert first.cross_k is not None and first.cross_v is not None
            n_layers, h = len(eager.layers), first.self_k.size(1)
            k_size, v_size = first.self_k.size(3), first.self_v.size(3)
            cross_k, cross_v = first.cross_k, first.cross_v  # (B, H, S, .)
        device = cross_k.device
        embed = engine.model.decoder.embed.weight
        # PE[0 : C] in the embeddings' dtype, as the engine adds it (grows a sinusoidal table)
        self.table = engine.model.decoder.positions.encoding(0, capacity).to(embed.dtype)
        self.range = torch.arange(capacity, device=device)  # (C,)
        # every layer's in one tensor, so that a reorder moves them all in two calls
        shape_k = (n_layers, rows, h, capacity, k_size)
        shape_v = (n_layers, rows, h, capacity, v_size)
        self.sides = [
            (
                torch.zeros(shape_k, dtype=dtype, device=device),
                torch.zeros(shape_v, dtype=dtype, device=device),
            )
            for _ in range(2)
        ]
        self.side = 0  # the side the next step reads and writes
        self.cross_keys = cross_k.new_zeros(n_layers, *cross_k.shape)  # (L, B, H, S, K)
        self.cross_values = cross_v.new_zeros(n_layers, *cross_v.shape)
        shape = (sentences, 1, 1, source)
        self.mask = torch.zeros(shape, dtype=torch.bool, device=device) if masked else None
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)  # (N,)
        self.position = torch.zeros(1, dtype=torch.long, device=device)  # (1,)
        self.graphs: list[Any] = [None, None]  # a torch.cuda.CUDAGraph of each side once captured
        self.outputs: list[Tensor | None] = [None, None]  # (N, V): each graph's output
        self.user: weakref.ref[Any] | None = None

    @property
    def nbytes(self) -> int:
        """The bytes of its caches, both sides, and of its two graphs' outputs, (N, V) each,
        counted before they are captured (the graphs' other memory not counted)."""
        tensors = [t for side in self.sides for t in side] + [self.cross_keys, self.cross_values]
        weight = self.engine.model.generator.weight  # (V, D): the logits' size and dtype
        outputs = 2 * self.tokens.numel() * weight.size(0) * weight.element_size()
        return outputs + sum(t.numel() * t.element_size() for t in tensors)

    @property
    def all_keys(self) -> Tensor:
        """(L, N, H, C, K): every layer's self-attention keys, on the side in use."""
        return self.sides[self.side][0]

    @property
    def all_values(self) -> Tensor:
        """(L, N, H, C, Dv): every layer's self-attention values, on the side in use."""
        return self.sides[self.side][1]

    def move_rows(self, rows: Tensor, t: int) -> None:
        """Row r of the cache becomes its row ``rows[r]`` (rows (N,)), for positions < t: the
        rows of the side in use gathered into the other side, which becomes the one in use."""
        other = 1 - self.side
        for now, then in zip(self.sides[self.side], self.sides[other], strict=True):
            torch.index_select(now.narrow(3, 0, t), 1, rows, out=then.narrow(3, 0, t))
        self.side = other

    def in_use(self) -> bool:
        """Whether a search that has not ended holds this slot."""
        return self.user is not None and self.user() is not None

    def load(self, eager: EngineCache, mask: Tensor | None, t: int) -> None:
        """Copy in a search's state from the engine's cache after its first t steps: the
        self-attention keys and values (N, H, t, .) and the encoder-decoder ones, and ``mask``."""
        keys, values = self.all_keys, self.all_values
        for i, layer in enumerate(eager.layers):
            assert layer.self_k is not None and layer.self_v is not None
            assert layer.cross_k is not None and layer.cross_v is not None
            keys[i].narrow(2, 0, t).copy_(layer.self_k)
            values[i].narrow(2, 0, t).copy_(layer.self_v)
            self.cross_keys[i].copy_(layer.cross_k)
            self.cross_values[i].copy_(layer.cross_v)
        if self.mask is not None and mask is not None:
            self.mask.copy_(mask)

    def load_slot(self, other: Slot, t: int) -> None:
        """Copy in the state of ``other`` (a slot of the same search, smaller) after t steps."""
        self.all_keys.narrow(3, 0, t).copy_(other.all_keys.narrow(3, 0, t))
        self.all_values.narrow(3, 0, t).copy_(other.all_values.narrow(3, 0, t))
        self.cross_keys.copy_(other.cross_keys)
        self.cross_values.copy_(other.cross_values)
        if self.mask is not None and other.mask is not None:
            self.mask.copy_(other.mask)

    def run(self, capture: CaptureStream | None) -> Tensor:
        """The step on the inputs written into ``tokens`` and ``position`` -> logits (N, V):
        with a ``capture`` stream (CUDA graphs), the graph's output (captured there at the first
        call; overwritten by the next replay), else a new tensor."""
        side = self.side
        if capture is None:
            return self.compute(side)
        with torch.cuda.device(self.tokens.device):  # the model's GPU, not the current one
            if self.graphs[side] is None:
                self._capture(capture, side)
            logits = self.outputs[side]
            assert logits is not None
            self.graphs[side].replay()
        return logits

    def _capture(self, capture: CaptureStream, side: int) -> None:
        """The step on ``side`` as a CUDA graph, captured on the decoder's capture stream after
        warm-up steps there (they write the position being decoded, which the step writes
        again).

        ``capture_begin`` / ``capture_end`` rather than the ``torch.cuda.graph`` context, which
        also synchronises the device and empties the caching allocator: at every capture, every
        search's memory would go back and be allocated again. Errors are those of this thread
        only ("thread_local"): the server decodes while its other threads serve."""
        start = time.perf_counter()
        first = capture.stream is None
        if capture.stream is None:
            capture.stream = torch.cuda.Stream(device=self.tokens.device)
        stream = capture.stream
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_STEPS if first else 1):
                self.compute(side)
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                self.outputs[side] = self.compute(side)
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        self.graphs[side] = graph
        capture.captures += 1
        capture.seconds += time.perf_counter() - start

    def compute(self, side: int) -> Tensor:
        """One step of all N rows on the cache of ``side``: ``tokens`` at position
        ``position`` -> (N, V)."""
        engine = self.engine
        decoder = engine.model.decoder
        embed = decoder.embed.weight  # (V, D)
        position = self.table.index_select(0, self.position)  # (1, D)
        # E[tgt] * sqrt(D) + PE[t] (section 3.4-3.5), as DecodingModel.decode
        x = torch.add(position, F.embedding(self.tokens, embed), alpha=decoder.embed.scale)
        visible = (self.range <= self.position).view(1, 1, 1, -1)  # (1, 1, 1, C): keys <= t
        all_keys, all_values = self.sides[side]
        for i, weights in enumerate(engine.layers):
            x = self._layer(x, weights, i, visible, all_keys[i], all_values[i])
        if engine.pre_norm:
            x = decoder.final_norm(x)
        return engine.generator(x)  # (N, V)

    def _layer(
        self, x: Tensor, w: DecoderLayerWeights, i: int, visible: Tensor, keys: Tensor,
        values: Tensor,
    ) -> Tensor:  # fmt: skip
        """x (N, D) -> (N, D): decoder layer i at position t (``DecodingModel._layer``), its
        self-attention cache keys (N, H, C, K) and values (N, H, C, Dv)."""
        engine, h, n = self.engine, w.n_heads, x.size(0)
        path = engine.attention

        def self_attention(y: Tensor) -> Tensor:
            qkv = kernels.attention_input(w.qkv(y), path)  # (N, H*K + H*K + H*Dv)
            sizes = (h * w.d_k, h * w.d_k, h * w.d_v)
            q, k, v = (split_heads(t, h, 1) for t in qkv.split(sizes, 1))  # (N, H, 1, size)
            keys.index_copy_(2, self.position, k.to(keys.dtype))  # position t of every row
            values.index_copy_(2, self.position, v.to(values.dtype))
            out = kernels.attention(q, keys, values, visible, path=path)  # (N, H, 1, Dv)
            return w.self_out(out.reshape(n, h * w.d_v).to(y.dtype))  # -> (N, H*Dv)

        cross_k, cross_v = self.cross_keys[i], self.cross_values[i]  # (B, H, S, .)
        x = engine.sublayer(x, w.norms[0], self_attention)
        x = engine.sublayer(
            x,
            w.norms[1],
            lambda y: engine.grouped_cross_attention(y, w, cross_k, cross_v, self.mask),
        )
        return engine.sublayer(x, w.norms[2], lambda y: feed_forward(w, y))


__all__ = ["WARMUP_STEPS", "CaptureStream", "Slot", "SlotKey", "slot_capacity"]
