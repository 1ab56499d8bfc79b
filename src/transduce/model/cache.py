"""Key/value cache for step-by-step decoding, reorderable for beam search."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


def _select(t: Tensor | None, index: Tensor) -> Tensor | None:
    return None if t is None else t.index_select(0, index)


@dataclass
class LayerCache:
    """One decoder layer's cache.

    self_k (N, H, t, K) / self_v (N, H, t, Dv): keys and values of the t target positions decoded
    so far, one row per hypothesis. cross_k (B, H, S, K) / cross_v (B, H, S, Dv): the encoder
    output projected once per source sentence for encoder-decoder attention. N = B * G when each
    sentence has G hypotheses (a beam), rows sentence-major (row i*G + g is hypothesis g of
    sentence i); the G hypotheses of a sentence share its cross-attention keys and values.

    ``append`` keeps self_k / self_v as views into preallocated buffers (N, H, capacity, K) that
    double when full, so a step writes only its new position instead of copying the whole cache
    (``torch.cat``), and ``reorder`` gathers the rows straight into a second pair of buffers.
    """

    self_k: Tensor | None = None
    self_v: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None
    # the layer's stacked self-attention projection (weight, bias), made once per search
    qkv_weights: tuple[Tensor, Tensor | None] | None = None
    _buffers: list[tuple[Tensor, Tensor]] = field(default_factory=list, repr=False)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys k (N, H, T, K) and values v (N, H, T, Dv) of T new positions; returns
        all cached keys (N, H, t + T, K) and values (N, H, t + T, Dv)."""
        t = 0 if self.self_k is None else self.self_k.size(2)
        n, new = k.size(0), k.size(2)
        if not self._buffers or self._buffers[0][0].size(2) < t + new:
            capacity = max(2 * (t + new), 16)
            kb = k.new_empty(n, k.size(1), capacity, k.size(3))  # (N, H, capacity, K)
            vb = v.new_empty(n, v.size(1), capacity, v.size(3))  # (N, H, capacity, Dv)
            if t:
                kb[:, :, :t] = self.self_k
                vb[:, :, :t] = self.self_v
            self._buffers = [(kb, vb)]
        kb, vb = self._buffers[0]
        kb[:n, :, t : t + new] = k
        vb[:n, :, t : t + new] = v
        self.self_k, self.self_v = kb[:n, :, : t + new], vb[:n, :, : t + new]
        return self.self_k, self.self_v

    def reorder(self, index: Tensor) -> None:
        """Keep hypothesis rows ``index`` (N_new,) of self_k / self_v, in that order."""
        if not self._buffers:  # not filled by ``append`` (a test's fake model)
            self.self_k, self.self_v = _select(self.self_k, index), _select(self.self_v, index)
            return
        kb, vb = self._buffers[0]
        n, t = index.numel(), self.self_k.size(2)
        spare = self._buffers[1] if len(self._buffers) > 1 else None
        if spare is None or spare[0].size(0) < n or spare[0].size(2) != kb.size(2):
            spare = (kb.new_empty(n, *kb.shape[1:]), vb.new_empty(n, *vb.shape[1:]))
        # one gather into the spare buffers (index_select writes into the strided views)
        torch.index_select(self.self_k, 0, index, out=spare[0][:n, :, :t])
        torch.index_select(self.self_v, 0, index, out=spare[1][:n, :, :t])
        self._buffers = [spare, (kb, vb)]
        self.self_k, self.self_v = spare[0][:n, :, :t], spare[1][:n, :, :t]

    def select_sources(self, index: Tensor) -> None:
        """Keep source-sentence rows ``index`` (B_new,) of cross_k / cross_v."""
        self.cross_k, self.cross_v = _select(self.cross_k, index), _select(self.cross_v, index)


class DecoderCache:
    """What ``Transformer.decode`` keeps between steps: one LayerCache per layer and the length.

    ``reorder(index)`` selects hypothesis rows (the self-attention keys and values), which is how
    beam search keeps the cache of each surviving hypothesis (fairseq's
    ``reorder_incremental_state``) and expands B sentences to B*W beams.
    ``select_sources(index)`` selects source-sentence rows (the cross-attention keys and values),
    for dropping finished sentences from the batch. Keeping the two apart means beams never copy
    the per-sentence encoder keys and values.
    """

    def __init__(self, n_layers: int) -> None:
        self.layers = [LayerCache() for _ in range(n_layers)]
        self.length = 0  # target positions already in the cache

    def reorder(self, index: Tensor) -> None:
        """Keep hypothesis rows ``index`` (LongTensor (N_new,)) of the self-attention cache."""
        for layer in self.layers:
            layer.reorder(index)

    def select_sources(self, index: Tensor) -> None:
        """Keep source-sentence rows ``index`` (LongTensor (B_new,)) of the cross-attention cache."""
        for layer in self.layers:
            layer.select_sources(index)
