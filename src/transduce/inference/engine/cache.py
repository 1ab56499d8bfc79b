"""The engine's key/value cache: the model's (``transduce.model.cache``) kept in preallocated
buffers, plus one sentence's folded encoder-decoder attention per layer.

A step at batch 1 is mostly operator calls, and ``torch.cat`` would copy the whole cache every
step: here ``append`` writes only the new position into buffers that double when full, handing
out views (``as_strided``); ``reorder`` gathers rows straight into a second pair of buffers, or,
when a beam moves few rows, copies only those in place (``EngineCache.reorder``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from transduce import kernels
from transduce.inference.engine.native_row import RowState
from transduce.kernels import native
from transduce.model.cache import DecoderCache, LayerCache


def first_capacity(source_length: int) -> int:
    """The positions a search's first self-attention buffers hold: twice the source's length
    (a translation is rarely longer), at most its length + 64 (the default limit is + 50), so
    that outputs that long never grow (copy) them (~1.5% of SMALL's beam search on a batch,
    benchmarks/RESULTS.md)."""
    return min(2 * source_length, source_length + 64)


def _positions(buffer: Tensor, n: int, start: int, length: int) -> Tensor:
    """Rows 0..n-1, positions start..start+length-1 of a contiguous (N, capacity, H, size) buffer
    as an (n, H, length, size) view: one call where narrow, narrow and transpose are three (a
    step at batch 1 is mostly operator calls)."""
    _, capacity, h, size = buffer.shape
    stride = (capacity * h * size, size, h * size, 1)
    offset = buffer.storage_offset() + start * h * size
    return buffer.as_strided((n, h, length, size), stride, offset)


@dataclass
class EngineLayerCache(LayerCache):
    """A decoder layer's ``LayerCache`` in buffers and, for a batch of one sentence, its
    encoder-decoder attention folded (A, c, M of ``fold_cross_attention``), made from cross_k /
    cross_v.

    ``append`` keeps self_k / self_v as views into preallocated buffers that double when full,
    so a step writes only its new position instead of copying the whole cache (``torch.cat``),
    and ``reorder`` gathers the rows straight into a second pair of buffers. The buffers are
    position-major within a row, (N, capacity, H, K), and self_k / self_v their transposed views:
    a step's keys are then one block of H*K per row rather than H scattered blocks of K, and a
    row's t positions one block rather than H. The fused attention kernel, which searches use,
    takes those strides as they are (the formula, with gradients on, would copy the keys).
    """

    cross_folded: tuple[Tensor, Tensor, Tensor] | None = None
    _buffers: list[tuple[Tensor, Tensor]] = field(default_factory=list, repr=False)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys k (N, H, T, K) and values v (N, H, T, Dv) of T new positions; returns
        all cached keys (N, H, t + T, K) and values (N, H, t + T, Dv)."""
        t = 0 if self.self_k is None else self.self_k.size(2)
        n, new = k.size(0), k.size(2)
        kb, vb = self.reserve(t + new, n, k.size(1), k.size(3), v.size(3), k)
        _positions(kb, n, t, new).copy_(k)
        _positions(vb, n, t, new).copy_(v)
        self.self_k = _positions(kb, n, 0, t + new)  # (N, H, t + T, K)
        self.self_v = _positions(vb, n, 0, t + new)
        return self.self_k, self.self_v

    def reserve(
        self,
        positions: int,
        n: int,
        h: int,
        k_size: int,
        v_size: int,
        like: Tensor,
        first_capacity: int = 0,
    ) -> tuple[Tensor, Tensor]:
        """The buffers (N, capacity, H, K) and (N, capacity, H, Dv) with room for ``positions``,
        made (like ``like``, with room for ``first_capacity`` at least) or doubled where
        smaller, the cached positions (self_k / self_v, which must be current) copied in."""
        if not self._buffers or self._buffers[0][0].size(1) < positions:
            capacity = max(2 * positions, 16, 0 if self._buffers else first_capacity)
            kb = like.new_empty(n, capacity, h, k_size)  # (N, capacity, H, K)
            vb = like.new_empty(n, capacity, h, v_size)  # (N, capacity, H, Dv)
            if self.self_k is not None and self.self_v is not None:  # t > 0
                t = self.self_k.size(2)
                kb.narrow(1, 0, t).copy_(self.self_k.transpose(1, 2))
                vb.narrow(1, 0, t).copy_(self.self_v.transpose(1, 2))
            self._buffers = [(kb, vb)]
        return self._buffers[0]

    def reserve_rows(
        self,
        positions: int,
        n: int,
        t: int,
        h: int,
        k_size: int,
        v_size: int,
        like: Tensor,
        first_capacity: int = 0,
    ) -> tuple[Tensor, Tensor]:
        """The buffers with room for ``positions`` positions of ``n`` rows, made (with room for
        ``first_capacity`` at least) or grown (the first ``t`` positions of every row kept): a
        cache whose rows are never gathered (``EngineCache.lineage``), so its views need not be
        current."""
        have = self._buffers[0] if self._buffers else None
        if have is not None and have[0].size(0) >= n and have[0].size(1) >= positions:
            return have
        rows = n if have is None else max(n, have[0].size(0))
        capacity = 0 if have is None else have[0].size(1)
        if capacity < positions:
            capacity = max(2 * positions, 16, first_capacity if have is None else 0)
        kb = like.new_empty(rows, capacity, h, k_size)  # (R, capacity, H, K)
        vb = like.new_empty(rows, capacity, h, v_size)  # (R, capacity, H, Dv)
        if have is not None and t:
            old_rows = have[0].size(0)
            kb.narrow(0, 0, old_rows).narrow(1, 0, t).copy_(have[0].narrow(1, 0, t))
            vb.narrow(0, 0, old_rows).narrow(1, 0, t).copy_(have[1].narrow(1, 0, t))
        self._buffers = [(kb, vb)]
        return kb, vb

    def step_attention(
        self, q: Tensor, k: Tensor, v: Tensor, lineage: Tensor, t: int, first_capacity: int = 0
    ) -> Tensor:
        """A one-position step's self-attention without gathering rows: k (N, H, 1, K), v (N, H,
        1, Dv) written at position ``t`` of rows 0..N-1, q (N, H, 1, K) over each hypothesis'
        positions as ``lineage`` (N, L) places them (``native.cached_self_attention``) -> (N, H,
        1, Dv). self_k / self_v are left behind until ``EngineCache.settle``. New buffers have
        room for ``first_capacity`` positions at least."""
        n, h = q.size(0), q.size(1)
        kb, vb = self.reserve_rows(t + 1, n, t, h, k.size(3), v.size(3), k, first_capacity)
        return kernels.cached_self_attention(q, k, v, kb, vb, lineage, t)

    def gather_rows(self, lineage: Tensor, t: int) -> None:
        """self_k / self_v made the first ``t`` positions of hypothesis rows 0..N-1 as ``lineage``
        (N, L) places them (position p of row i in buffer row lineage[i, p]), gathered into
        buffers of their own."""
        kb, vb = self._buffers[0]
        n, capacity = lineage.size(0), kb.size(1)
        if t:
            # position p of row i is row lineage[i, p] * capacity + p of the (R * capacity) rows
            flat = (lineage[:, :t] * capacity + torch.arange(t, device=lineage.device)).view(-1)
            news = []
            for b in (kb, vb):
                new = b.new_empty(n, capacity, *b.shape[2:])  # (N, capacity, H, size)
                gathered = b.view(-1, *b.shape[2:]).index_select(0, flat)  # (N*t, H, size)
                new.narrow(1, 0, t).copy_(gathered.view(n, t, *b.shape[2:]))
                news.append(new)
            kb, vb = news
        self._buffers = [(kb, vb)]
        self.self_k = _positions(kb, n, 0, t)  # (N, H, t, K)
        self.self_v = _positions(vb, n, 0, t)

    def reorder(self, index: Tensor) -> None:
        """Keep hypothesis rows ``index`` (N_new,) of self_k / self_v, in that order."""
        if not self._buffers:  # not filled by ``append``
            super().reorder(index)
            return
        kb, vb = self._buffers[0]
        assert self.self_k is not None and self.self_v is not None  # buffers hold them
        n, t = index.numel(), self.self_k.size(2)
        spare = self._buffers[1] if len(self._buffers) > 1 else None
        if spare is None or spare[0].size(0) < n or spare[0].size(1) != kb.size(1):
            spare = (kb.new_empty(n, *kb.shape[1:]), vb.new_empty(n, *vb.shape[1:]))
        # one gather into the spare buffers: row i's t positions are one block of each
        k_new, v_new = (b.narrow(0, 0, n).narrow(1, 0, t) for b in spare)  # (N_new, t, H, K)
        torch.index_select(self.self_k.transpose(1, 2), 0, index, out=k_new)
        torch.index_select(self.self_v.transpose(1, 2), 0, index, out=v_new)
        self._buffers = [spare, (kb, vb)]
        self.self_k, self.self_v = k_new.transpose(1, 2), v_new.transpose(1, 2)

    def move_rows(self, dst: Tensor, src: Tensor) -> None:
        """In place: row ``dst[i]`` of self_k / self_v becomes a copy of row ``src[i]`` (all
        sources are read before any row is written). dst, src (M,) LongTensors."""
        for t in (self.self_k, self.self_v):
            if t is not None:
                # in the buffers, (N, t, H, K) holds a row's positions as one block
                rows = t.transpose(1, 2) if self._buffers else t
                rows.index_copy_(0, dst, rows.index_select(0, src))

    def drop_self_attention(self) -> None:
        """Forget the self-attention keys and values and free their buffers (a cache that moved
        them elsewhere: ``static.StaticDecoder``)."""
        self.self_k = self.self_v = None
        self._buffers = []

    def select_sources(self, index: Tensor) -> None:
        """Keep source-sentence rows ``index`` (B_new,); the fold is of one sentence (B = 1)."""
        super().select_sources(index)
        if index.numel() != 1:
            self.cross_folded = None


def _in_own_rows(layer: EngineLayerCache, n: int, t: int) -> bool:
    """Whether the layer's views are its buffers' first ``n`` rows and ``t`` positions (the
    identity table holds for them)."""
    if not layer._buffers or layer.self_k is None or layer.self_v is None:
        return False
    kb, vb = layer._buffers[0]
    return (
        layer.self_k.shape[0] == n
        and layer.self_k.shape[2] == t
        and layer.self_k.data_ptr() == kb.data_ptr()
        and layer.self_v.data_ptr() == vb.data_ptr()
        and layer.self_k.stride(0) == kb.stride(0)
    )


def _moved_rows(index: Tensor, keys: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """(dst, src): the rows that ``reorder(index)`` changes and where each comes from, when
    there are at most half of them; None when ``index`` changes the row count or moves more
    (copying in place reads and writes a moved row twice, gathering every row once)."""
    if keys is None or index.numel() != keys.size(0):
        return None
    if not kernels.reads_are_cheap(index.device):  # counting the moved rows would wait
        return None
    n = index.numel()
    dst = (index != torch.arange(n, device=index.device)).nonzero().squeeze(1)  # (M,)
    if 2 * dst.numel() > n:
        return None
    return dst, index.index_select(0, dst)


class EngineCache(DecoderCache):
    """``DecoderCache`` whose layers are ``EngineLayerCache``s."""

    layers: list[EngineLayerCache]  # type: ignore[assignment]

    def __init__(self, n_layers: int, *, lineage: bool = False) -> None:
        super().__init__(n_layers, EngineLayerCache)
        # a sentence's native steps (``native_row``): they write the buffers only, leaving the
        # layers' self_k / self_v views behind until ``settle``
        self.row_state: RowState | None = None
        # whether steps may attend through ``lineage`` (``step_lineage``): made so by the engine
        # where ``native.cached_self_attention`` runs
        self.lineage_steps = lineage
        # (N, L) int64: position p < length of hypothesis row i lies in buffer row lineage[i, p]
        # (every layer's), so a reorder permutes this table instead of the cached keys; the
        # layers' self_k / self_v views are left behind until ``settle``
        self.lineage: Tensor | None = None

    @property
    def reorder_moves_rows(self) -> bool:
        """Whether ``reorder`` copies rows: not while it permutes the lineage table
        (``inference.contract.reorder_moves_rows``)."""
        return self.lineage is None

    def step_lineage(self, n: int, like: Tensor) -> Tensor | None:
        """The lineage table for a one-position step of ``n`` rows at position ``length``, with
        room for it (made the identity where there is none); None where steps do not attend
        through it (``lineage_steps`` off, a sentence's native steps pending)."""
        if not self.lineage_steps or self.row_state is not None:
            return None
        t, lineage = self.length, self.lineage
        if lineage is None:  # the views are current: every row's positions in its own row
            if t and not all(_in_own_rows(layer, n, t) for layer in self.layers):
                return None  # positions cached other than by the engine's steps
            size = max(2 * (t + 1), 16)
            lineage = torch.arange(n, device=like.device).unsqueeze(1).repeat(1, size)
        elif lineage.size(1) <= t:  # (N, L) -> (N, 2 (t + 1))
            grown = lineage.new_empty(lineage.size(0), 2 * (t + 1))
            grown.narrow(1, 0, lineage.size(1)).copy_(lineage)
            lineage = grown
        if lineage.size(0) != n:
            return None
        self.lineage = lineage
        return lineage

    def settle(self) -> None:
        """The layers' self_k / self_v views made current after native steps, which wrote the
        ``length`` positions into the first rows of the buffers (a sentence's steps) or where
        ``lineage`` places them (gathered here); what reads the views calls this first."""
        self._settle_rows()
        lineage, self.lineage = self.lineage, None
        if lineage is not None:
            for layer in self.layers:
                layer.gather_rows(lineage, self.length)

    def _settle_rows(self) -> None:
        state = self.row_state
        if state is None:
            return
        self.row_state = None
        for layer in self.layers:
            kb, vb = layer._buffers[0]
            layer.self_k = _positions(kb, state.rows, 0, self.length)  # (N, H, length, K)
            layer.self_v = _positions(vb, state.rows, 0, self.length)

    def _reorder_native_rows(self, index: Tensor) -> bool:
        """A sentence's native steps (``row_state``), ``index`` (N,) keeping their row count:
        the rows that move copied within the buffers the steps write, in one native call
        (``native.reorder_row_buffers``), and the state kept for the next step (settled, the
        next step would make it anew: ~0.1 ms a step of a sentence's beam). False, and nothing
        done, elsewhere."""
        state = self.row_state
        if state is None or index.numel() != state.rows:
            return False
        # (the native steps run on CPUs, with the native kernels: so does this)
        native.reorder_row_buffers(state.buffers, index, self.length)
        return True

    def select_sources(self, index: Tensor) -> None:
        """Keep source rows ``index`` (LongTensor (B_new,)) of the cross-attention cache."""
        self._settle_rows()  # the sentence's native state holds its cross-attention
        super().select_sources(index)

    def reorder(self, index: Tensor) -> None:
        """Keep hypothesis rows ``index`` (LongTensor (N_new,)) of the self-attention cache.

        With a lineage table, only the table's rows are gathered. Otherwise, when ``index``
        keeps the number of rows and leaves at least half of them where they are (``index[i] ==
        i``: beam search puts a hypothesis in its parent's slot where it can), only the other
        rows are copied, in place; otherwise all rows are gathered."""
        if self.lineage is not None:
            self.lineage = self.lineage.index_select(0, index)  # (N_new, L)
            if self.slots is not None:
                self.slots = self.slots.index_select(0, index)
            return
        if self._reorder_native_rows(index):
            if self.slots is not None:
                self.slots = self.slots.index_select(0, index)
            return
        self.settle()
        if self.slots is not None:
            self.slots = self.slots.index_select(0, index)
        moved = _moved_rows(index, self.layers[0].self_k if self.layers else None)
        for layer in self.layers:
            if moved is None:
                layer.reorder(index)
            elif moved[0].numel():
                layer.move_rows(*moved)


__all__ = ["EngineCache", "EngineLayerCache", "first_capacity"]
