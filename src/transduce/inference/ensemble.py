"""An ensemble of models as one model of the decoding contract: every search decodes it.

``Ensemble(members)`` gives, at each step, the mean of the members' next-token probabilities
(as log-probabilities: ``log(mean_m exp(log_softmax(logits_m)))``), the ensembling of the
paper's Table 2 and of fairseq and Marian. Its ``decode`` returns these log-probabilities in
place of logits: they are already normalised, so the searches' ``log_softmax`` leaves them as
they are. The members may be any models of the contract (a Transformer's engine and a recurrent
model together) over the same vocabulary (the caller checks that; the sizes are checked here).

The contract passes one memory tensor around (searches index its rows): the members' memories
are flattened per sentence and put side by side, ``(B, X_1 + X_2 + ...)``, and cut apart again
as views in ``decode``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from transduce.inference.contract import DecodableModel, DecodingCache, reorder_moves_rows


class EnsembleCache:
    """One cache per member, reordered together."""

    def __init__(self, caches: list[DecodingCache]) -> None:
        self.caches = caches

    @property
    def reorder_moves_rows(self) -> bool:
        """Whether some member's cache copies rows (``contract.reorder_moves_rows``)."""
        return any(reorder_moves_rows(c) for c in self.caches)

    def reorder(self, index: Tensor) -> None:
        for cache in self.caches:
            cache.reorder(index)

    def select_sources(self, index: Tensor) -> None:
        for cache in self.caches:
            cache.select_sources(index)


class Ensemble:
    """The mean of ``members``' next-token distributions, as a model of the decoding contract."""

    def __init__(self, members: Sequence[DecodableModel[Any]]) -> None:
        if len(members) < 1:
            raise ValueError("an ensemble needs at least one model")
        self.members = list(members)
        # each member's memory features (its shape after (B, S)) and dtype, set by ``encode``
        # (the same for every batch: (B, S, D) for a Transformer and a recurrent model)
        self._layout: list[tuple[torch.Size, torch.dtype]] = []

    @property
    def training(self) -> bool:
        return any(m.training for m in self.members)

    def encode(self, src: Tensor, src_valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, X) (the members' memories (B, S, ...) flattened side by side,
        as float32), src_valid (B, S) (the first member's)."""
        encoded = [
            m.encode(src) if src_valid is None else m.encode(src, src_valid) for m in self.members
        ]
        self._layout = [(memory.shape[2:], memory.dtype) for memory, _ in encoded]
        flat = [memory.reshape(memory.size(0), -1).float() for memory, _ in encoded]  # (B, X_m)
        return torch.cat(flat, dim=1), encoded[0][1]

    def new_cache(self) -> EnsembleCache:
        return EnsembleCache([m.new_cache() for m in self.members])

    def decode(
        self, tgt: Tensor, memory: Tensor, src_valid: Tensor, cache: EnsembleCache | None = None
    ) -> Tensor:
        """tgt (N, T) -> log of the members' mean probabilities (N, T, V), float32."""
        lprobs = []
        start, length = 0, src_valid.size(1)
        for i, (member, (shape, dtype)) in enumerate(zip(self.members, self._layout, strict=True)):
            width = length * math.prod(shape)
            # (B, X) -> this member's (B, S, ...), a view
            own = memory.narrow(1, start, width).view(memory.size(0), length, *shape).to(dtype)
            start += width
            logits = member.decode(tgt, own, src_valid, None if cache is None else cache.caches[i])
            lprobs.append(torch.log_softmax(logits.float(), dim=-1))
        if len({lp.size(-1) for lp in lprobs}) != 1:
            sizes = [lp.size(-1) for lp in lprobs]
            raise ValueError(f"the ensemble's models have vocabularies of sizes {sizes}")
        # log(mean_m p_m) = logsumexp_m(log p_m) - log M
        return torch.logsumexp(torch.stack(lprobs), dim=0) - math.log(len(lprobs))


__all__ = ["Ensemble", "EnsembleCache"]
