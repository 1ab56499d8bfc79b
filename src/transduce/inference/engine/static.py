"""Decoding steps on static buffers, replayed as one CUDA graph.

On a GPU the engine's step (``DecodingModel.decode``) is some fifteen kernels a layer, each
launched from Python, and a batch of a few hundred rows takes the device less time than the
launches take the host: the step is bound by launches. ``StaticDecoder`` keeps the decoding
contract over a ``DecodingModel`` and runs every step after the first on tensors whose shapes
and addresses stay the same from step to step, so that on CUDA the whole step is captured once
as a CUDA graph (``torch.cuda.CUDAGraph``) and replayed with one launch:

- the self-attention cache in (N, H, capacity, K) buffers, written at position t in place and
  attended through a mask of the positions <= t (the engine attends its t + 1 cached positions,
  a shape that changes every step); when full the capacity doubles and the search moves to
  tensors of the larger shape, so a search of L steps uses about log2(L / capacity) + 1 shapes;
- the step's inputs (tokens, t) in tensors written before each replay, the logits in the graph's
  own output, copied out for the search;
- the tensors of a shape and their graph (a ``Slot``, ``static_slot.py``) kept for later
  searches of that shape (rows, sentences, source length, capacity, masked or not, dtype),
  which copy their own values in and replay the graph without capturing it again: the
  ``MAX_SLOTS`` shapes used last within ``kernels.kept_graph_bytes`` (a decoder's, so an
  ensemble's members each), none shared by two searches running at once;
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

import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from torch import Tensor

from transduce import kernels
from transduce.inference.engine.cache import EngineCache
from transduce.inference.engine.decoding import DecodingModel
from transduce.inference.engine.static_slot import CaptureStream, Slot, SlotKey, slot_capacity

# positions a buffer holds at first (doubled when full)
DEFAULT_CAPACITY = 64
# slots (static tensors and graphs of one shape of search) a decoder keeps for later searches,
# within kernels.kept_graph_bytes: a file's batches came in 17 shapes on Multi30k's test2016
# (beam 4), and keeping 16 rather than 4 let its later passes capture nothing
# (benchmarks/RESULTS.md)
MAX_SLOTS = 16


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
        # the stream every capture runs on (CUDA graphs), else None: the steps run eagerly
        self.capture = CaptureStream() if graphs else None
        # slots by shape, least recently used first: later searches of a shape reuse its graph
        self.slots: OrderedDict[SlotKey, Slot] = OrderedDict()

    def claim(
        self, key: SlotKey, eager: EngineCache | None, search: object, like: Slot | None = None
    ) -> Slot:
        """The slot of ``key`` for ``search``: the kept one if no running search holds it, else
        a new one (kept if none is, else private to this search), made from the shapes of
        ``eager`` or of the slot ``like``. At most MAX_SLOTS are kept, of
        ``kernels.kept_graph_bytes`` in all (``Slot.nbytes`` when each is kept); the least
        recently used that no search holds goes first, and a slot larger than that alone is
        not kept."""
        slot = self.slots.get(key)
        if slot is not None and not slot.in_use():
            self.slots.move_to_end(key)
        else:
            slot = Slot(self.engine, key, eager, like)
            bound = kernels.kept_graph_bytes(self.device)
            if key not in self.slots and slot.nbytes <= bound:
                self.slots[key] = slot
                idle = [k for k, kept in self.slots.items() if not kept.in_use() and k != key]
                held = sum(kept.nbytes for kept in self.slots.values())
                for old in idle:
                    if len(self.slots) <= MAX_SLOTS and held <= bound:
                        break
                    held -= self.slots.pop(old).nbytes
        slot.user = weakref.ref(search)
        return slot

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
    """One search on the static tensors of a ``Slot`` (``StaticDecoder``): how many positions
    it has decoded, and which static rows its rows are."""

    def __init__(self, owner: StaticDecoder, eager: EngineCache, src_valid: Tensor, rows: int):
        self.owner = owner
        eager.settle()  # the views, after a native first step (native_row.py)
        first = eager.layers[0]
        assert first.cross_k is not None and first.self_k is not None  # one step decoded
        sentences, source = first.cross_k.size(0), first.cross_k.size(2)  # B, S
        if rows % sentences or rows != first.self_k.size(0):
            raise ValueError(
                f"{rows} target rows against a cache of {first.self_k.size(0)} rows and "
                f"{sentences} sentences"
            )
        self.group = rows // sentences  # G
        device = first.cross_k.device
        self.t = eager.length  # positions cached
        mask = owner.engine.memo_source_mask(src_valid)  # (B, 1, 1, S) or None, as the engine's
        capacity = slot_capacity(owner.engine, max(owner.capacity, 2 * self.t), self.t)
        key = (rows, sentences, source, capacity, mask is not None, first.self_k.dtype)
        self.slot = owner.claim(key, eager, self)
        self.slot.load(eager, mask, self.t)
        for layer in eager.layers:  # copied: the engine's buffers are not needed any more
            layer.drop_self_attention()
        self.sents = torch.arange(sentences, device=device)  # (B',) static sentence of each
        self.whole = True  # no sentence dropped: the search's rows are the static ones
        self.slots = torch.arange(self.group, device=device)  # (G,)
        self.every_row = torch.arange(rows, device=device)  # (N,)

    def _grow(self) -> None:
        """Twice the capacity: the state moved into a larger slot (the learned positions'
        limit refuses a position past it)."""
        old = self.slot
        rows, sentences, source, capacity, masked, dtype = old.key
        capacity = slot_capacity(self.owner.engine, 2 * capacity, self.t)
        key = (rows, sentences, source, capacity, masked, dtype)
        self.slot = self.owner.claim(key, None, self, like=old)
        self.slot.load_slot(old, self.t)
        old.user = None  # free for another search

    def _current_rows(self) -> Tensor:
        """(n,) the static row of each of the search's rows: sentence-major, G a sentence."""
        return (self.sents[:, None] * self.group + self.slots).view(-1)  # (B', G) -> (B'*G,)

    def step(self, tgt: Tensor) -> Tensor:
        """tgt (n, 1) -> logits (n, 1, V) for the search's n rows."""
        n = tgt.size(0)
        if n != self.sents.numel() * self.group:
            raise ValueError(
                f"{n} target rows for {self.sents.numel()} sentences of {self.group} hypotheses"
            )
        if self.t >= self.slot.capacity:
            self._grow()
        slot = self.slot
        rows = None if self.whole else self._current_rows()
        if rows is None:
            slot.tokens.copy_(tgt.view(-1))
        else:
            slot.tokens.index_copy_(0, rows, tgt.view(-1))
        slot.position.fill_(self.t)
        logits = slot.run(self.owner.capture)
        self.t += 1
        if rows is not None:
            logits = logits.index_select(0, rows)
        elif self.owner.graphs:
            logits = logits.clone()  # the graph's output: the next replay overwrites it
        return logits.unsqueeze(1)  # (n, V) -> (n, 1, V)

    def reorder(self, index: Tensor) -> None:
        """The search's row j becomes its row ``index[j]`` (``DecodingCache.reorder``), before
        ``select_sources`` drops sentences: row j then belongs to the sentence of row
        ``index[j]`` (the searches keep a sentence's hypotheses together), in slot j mod G. With
        one hypothesis a sentence no row moves."""
        if self.group == 1 or self.t == 0:
            return
        j = torch.arange(index.numel(), device=index.device)
        if self.whole:  # no sentence dropped yet: the search's rows are the static rows
            src = index
            dst = index - index % self.group + j % self.group
        else:
            src = self._current_rows().index_select(0, index)  # (n',) static rows read
            dst = self.sents.index_select(0, index // self.group) * self.group + j % self.group
        # static row r takes row rows[r]: src where written, itself elsewhere
        rows = self.every_row.index_copy(0, dst, src)  # (N,)
        self.slot.move_rows(rows, self.t)

    def select_sources(self, index: Tensor) -> None:
        """Keep the search's sentences ``index`` (B_new,) (``DecodingCache.select_sources``)."""
        self.sents = self.sents.index_select(0, index)
        self.whole = False


__all__ = ["DEFAULT_CAPACITY", "StaticCache", "StaticDecoder"]
