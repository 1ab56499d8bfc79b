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
from transduce.model.cache import DecoderCache, LayerCache


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
        self, positions: int, n: int, h: int, k_size: int, v_size: int, like: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The buffers (N, capacity, H, K) and (N, capacity, H, Dv) with room for ``positions``,
        made (like ``like``) or doubled where smaller, the cached positions (self_k / self_v,
        which must be current) copied in."""
        if not self._buffers or self._buffers[0][0].size(1) < positions:
            capacity = max(2 * positions, 16)
            kb = like.new_empty(n, capacity, h, k_size)  # (N, capacity, H, K)
            vb = like.new_empty(n, capacity, h, v_size)  # (N, capacity, H, Dv)
            if self.self_k is not None and self.self_v is not None:  # t > 0
                t = self.self_k.size(2)
                kb.narrow(1, 0, t).copy_(self.self_k.transpose(1, 2))
                vb.narrow(1, 0, t).copy_(self.self_v.transpose(1, 2))
            self._buffers = [(kb, vb)]
        return self._buffers[0]

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

    def __init__(self, n_layers: int) -> None:
        super().__init__(n_layers, EngineLayerCache)
        # a sentence's native steps (``native_row``): they write the buffers only, leaving the
        # layers' self_k / self_v views behind until ``settle``
        self.row_state: RowState | None = None

    def settle(self) -> None:
        """The layers' self_k / self_v views made current after native steps, which wrote the
        ``length`` positions into the first rows of the buffers; what reads the views calls
        this first."""
        state = self.row_state
        if state is None:
            return
        self.row_state = None
        for layer in self.layers:
            kb, vb = layer._buffers[0]
            layer.self_k = _positions(kb, state.rows, 0, self.length)  # (N, H, length, K)
            layer.self_v = _positions(vb, state.rows, 0, self.length)

    def select_sources(self, index: Tensor) -> None:
        """Keep source rows ``index`` (LongTensor (B_new,)) of the cross-attention cache."""
        self.settle()
        super().select_sources(index)

    def reorder(self, index: Tensor) -> None:
        """Keep hypothesis rows ``index`` (LongTensor (N_new,)) of the self-attention cache.

        When ``index`` keeps the number of rows and leaves at least half of them where they are
        (``index[i] == i``: beam search puts a hypothesis in its parent's slot where it can), only
        the other rows are copied, in place; otherwise all rows are gathered."""
        self.settle()
        if self.slots is not None:
            self.slots = self.slots.index_select(0, index)
        moved = _moved_rows(index, self.layers[0].self_k if self.layers else None)
        for layer in self.layers:
            if moved is None:
                layer.reorder(index)
            elif moved[0].numel():
                layer.move_rows(*moved)


__all__ = ["EngineCache", "EngineLayerCache"]
