"""The decoding contract: what every search asks of a model, as types.

Greedy and beam search (and everything above them: ``Translator``, the server, validation) use a
model only through ``DecodableModel`` and its cache only through ``DecodingCache``. Any model that
keeps the contract, the Transformer, its inference engine or a recurrent model, gets every search.
What a cache holds is the model's own business (keys and values for the Transformer).

Rows: ``encode`` gives one row per source sentence (B). ``decode`` takes N = B*G target rows, G
hypotheses per sentence, rows sentence-major (row i*G + g is hypothesis g of sentence i), against
the B rows of memory, so nothing per sentence is ever copied per hypothesis.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from torch import Tensor


class DecodingCache(Protocol):
    """What a model keeps between decoding steps."""

    def reorder(self, index: Tensor) -> None:
        """Keep hypothesis rows ``index`` (N_new,) in that order (beams, expanding B sentences
        to B*W rows, dropping finished hypotheses)."""
        ...

    def select_sources(self, index: Tensor) -> None:
        """Keep source-sentence rows ``index`` (B_new,) (dropping finished sentences). A search
        that drops sentences calls ``reorder`` first (its index in the rows before the drop,
        keeping each sentence's hypotheses together), then this, as every search here does: a
        cache may map its rows to sentences by that order (``engine.static``)."""
        ...


CacheT = TypeVar("CacheT", bound=DecodingCache)


class DecodableModel(Protocol[CacheT]):
    """A sequence-to-sequence model as the searches see it."""

    @property
    def training(self) -> bool:
        """True in training mode (dropout on): searches refuse such a model."""
        ...

    def encode(self, src: Tensor, src_valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """src (B, S) token ids -> memory (B, S, ...) and src_valid (B, S) bool (True on real
        tokens; by default the non-PAD ones)."""
        ...

    def new_cache(self) -> CacheT:
        """An empty cache for ``decode``."""
        ...

    def decode(
        self, tgt: Tensor, memory: Tensor, src_valid: Tensor, cache: CacheT | None = None
    ) -> Tensor:
        """tgt (N, T) target ids (BOS first), memory and src_valid from ``encode`` (B rows) ->
        logits (N, T, V) over the next token at each position; N = B*G. With a cache, ``tgt``
        holds only the positions after those already decoded, and the cache grows."""
        ...


def reorder_moves_rows(cache: DecodingCache) -> bool:
    """Whether ``cache.reorder`` copies the rows it moves, so that a search gains by leaving
    hypotheses in their parents' rows: True unless the cache says otherwise with an attribute
    ``reorder_moves_rows`` of False (the engine's cache while it permutes a table of where each
    row's positions lie rather than the rows: ``EngineCache.lineage``)."""
    return bool(getattr(cache, "reorder_moves_rows", True))


__all__ = ["DecodableModel", "DecodingCache", "reorder_moves_rows"]
