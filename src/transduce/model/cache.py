"""Key/value cache for step-by-step decoding, reorderable for beam search.

Decoding one position at a time, masked self-attention needs the keys and values of every
position decoded so far, and encoder-decoder attention the encoder output projected once: the
cache keeps both, so a step computes only its new position. This is the plain cache of the
model's own ``Transformer.decode`` (each step appends with ``torch.cat``); the inference engine
keeps its own, with preallocated buffers (``transduce.inference.engine.cache``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def _select(t: Tensor | None, index: Tensor) -> Tensor | None:
    """Rows ``index`` (M,) of ``t`` (N, ...), in that order; None stays None."""
    return None if t is None else t.index_select(0, index)


@dataclass
class LayerCache:
    """One decoder layer's cache.

    self_k (N, H, t, K) / self_v (N, H, t, Dv): keys and values of the t target positions decoded
    so far, one row per hypothesis. cross_k (B, H, S, K) / cross_v (B, H, S, Dv): the encoder
    output projected once per source sentence for encoder-decoder attention. N = B * G when each
    sentence has G hypotheses (a beam), rows sentence-major (row i*G + g is hypothesis g of
    sentence i); the G hypotheses of a sentence share its cross-attention keys and values.
    """

    self_k: Tensor | None = None
    self_v: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys k (N, H, T, K) and values v (N, H, T, Dv) of T new positions; returns
        all cached keys (N, H, t + T, K) and values (N, H, t + T, Dv)."""
        if self.self_k is None or self.self_v is None:
            self.self_k, self.self_v = k, v
        else:
            self.self_k = torch.cat([self.self_k, k], dim=2)  # (N, H, t + T, K)
            self.self_v = torch.cat([self.self_v, v], dim=2)  # (N, H, t + T, Dv)
        return self.self_k, self.self_v

    def reorder(self, index: Tensor) -> None:
        """Keep hypothesis rows ``index`` (N_new,) of self_k / self_v, in that order."""
        self.self_k = _select(self.self_k, index)
        self.self_v = _select(self.self_v, index)

    def select_sources(self, index: Tensor) -> None:
        """Keep source-sentence rows ``index`` (B_new,) of cross_k / cross_v."""
        self.cross_k = _select(self.cross_k, index)
        self.cross_v = _select(self.cross_v, index)


class DecoderCache:
    """What ``Transformer.decode`` keeps between steps: one LayerCache per layer and the length.

    ``reorder(index)`` selects hypothesis rows (the self-attention keys and values), which is how
    beam search keeps the cache of each surviving hypothesis (fairseq's
    ``reorder_incremental_state``) and expands B sentences to B*W beams.
    ``select_sources(index)`` selects source-sentence rows (the cross-attention keys and values),
    for dropping finished sentences from the batch. Keeping the two apart means beams never copy
    the per-sentence encoder keys and values. ``layer``: the class of each layer's cache.
    """

    def __init__(self, n_layers: int, layer: type[LayerCache] = LayerCache) -> None:
        self.layers = [layer() for _ in range(n_layers)]
        self.length = 0  # target positions already in the cache
        self.slots: Tensor | None = None  # (N,) word slots among them (position_unit: word)

    def reorder(self, index: Tensor) -> None:
        """Keep hypothesis rows ``index`` (LongTensor (N_new,)) of the self-attention cache."""
        if self.slots is not None:
            self.slots = self.slots.index_select(0, index)
        for layer in self.layers:
            layer.reorder(index)

    def select_sources(self, index: Tensor) -> None:
        """Keep source rows ``index`` (LongTensor (B_new,)) of the cross-attention cache."""
        for layer in self.layers:
            layer.select_sources(index)
