"""Key/value cache for step-by-step decoding, reorderable for beam search."""

from __future__ import annotations

from dataclasses import dataclass, fields

from torch import Tensor


@dataclass
class LayerCache:
    """One decoder layer's cache.

    self_k (B, H, t, K) / self_v (B, H, t, Dv): keys and values of the t target positions decoded
    so far. cross_k (B, H, S, K) / cross_v (B, H, S, Dv): the encoder output projected once per
    sentence for encoder-decoder attention.
    """

    self_k: Tensor | None = None
    self_v: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None


class DecoderCache:
    """What ``Transformer.decode`` keeps between steps: one LayerCache per layer and the length.

    ``reorder(index)`` selects rows along the batch dimension, which is how beam search keeps the
    cache of each surviving hypothesis (fairseq's ``reorder_incremental_state``).
    """

    def __init__(self, n_layers: int) -> None:
        self.layers = [LayerCache() for _ in range(n_layers)]
        self.length = 0  # target positions already in the cache

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (LongTensor (B_new,)) of every cached tensor, in that order."""
        for layer in self.layers:
            for f in fields(layer):
                t = getattr(layer, f.name)
                if t is not None:
                    setattr(layer, f.name, t.index_select(0, index))
