"""The engine's key/value cache: the model's, plus one sentence's folded encoder-decoder
attention per layer."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from transduce.model.cache import DecoderCache, LayerCache


@dataclass
class EngineLayerCache(LayerCache):
    """A decoder layer's ``LayerCache`` and, for a batch of one sentence, its encoder-decoder
    attention folded (A, c, M of ``fold_cross_attention``), made from cross_k / cross_v."""

    cross_folded: tuple[Tensor, Tensor, Tensor] | None = None

    def select_sources(self, index: Tensor) -> None:
        """Keep source-sentence rows ``index`` (B_new,); the fold is of one sentence (B = 1)."""
        super().select_sources(index)
        if index.numel() != 1:
            self.cross_folded = None


class EngineCache(DecoderCache):
    """``DecoderCache`` whose layers are ``EngineLayerCache``s."""

    layers: list[EngineLayerCache]  # type: ignore[assignment]

    def __init__(self, n_layers: int) -> None:
        super().__init__(n_layers, EngineLayerCache)


__all__ = ["EngineCache", "EngineLayerCache"]
