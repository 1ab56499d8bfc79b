"""Prefix-constrained decoding: each output starts with a given target prefix, the rest is
searched (interactive and terminology-constrained translation). A wrapper of the decoding
contract, so greedy search, beam search and sampling all take it unchanged.

``PrefixConstrained(model, prefixes)`` decodes one batch whose sentence i must start with
``prefixes[i]``. While a row is inside its prefix, its next-token distribution keeps the
model's probability p of the forced token and gives every other token none, except that the
rest, 1 - p, goes to PAD, which the searches never generate (``next_token_log_probs`` sets it to
-inf after ``log_softmax``, without renormalising). So the forced token's log-probability is the
model's own: a hypothesis's ``log_prob`` is that of the whole output, prefix included, as
``transduce score`` gives it, and beam search ranks the continuations by their full scores.
After the longest prefix the model's logits pass through untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from transduce.data.vocab import PAD
from transduce.inference.contract import DecodableModel, DecodingCache, reorder_moves_rows


class PrefixCache:
    """The model's cache, with the prefixes of the sentences still in the batch and the number
    of steps decoded."""

    def __init__(self, inner: DecodingCache, forced: Tensor) -> None:
        self.inner = inner
        self.forced = forced  # (B, L) token to force at each step, -1 after the prefix
        self.steps = 0

    @property
    def reorder_moves_rows(self) -> bool:
        """The inner cache's (``contract.reorder_moves_rows``)."""
        return reorder_moves_rows(self.inner)

    def reorder(self, index: Tensor) -> None:
        self.inner.reorder(index)  # rows stay with their sentence: the prefixes do not move

    def select_sources(self, index: Tensor) -> None:
        self.inner.select_sources(index)
        self.forced = self.forced.index_select(0, index)


class PrefixConstrained:
    """``model`` with sentence i of the next batch forced to start with ``prefixes[i]`` (token
    ids, no BOS/EOS). Made for one batch (``encode`` checks its size)."""

    def __init__(self, model: DecodableModel[Any], prefixes: Sequence[Sequence[int]]) -> None:
        self.model = model
        longest = max((len(p) for p in prefixes), default=0)
        self.forced = torch.full((len(prefixes), longest), -1, dtype=torch.long)  # (B, L)
        for i, p in enumerate(prefixes):
            self.forced[i, : len(p)] = torch.tensor(p, dtype=torch.long)

    @property
    def training(self) -> bool:
        return self.model.training

    def encode(self, src: Tensor, src_valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if src.size(0) != self.forced.size(0):
            raise ValueError(f"{src.size(0)} sentences but {self.forced.size(0)} prefixes")
        self.forced = self.forced.to(src.device)
        return self.model.encode(src) if src_valid is None else self.model.encode(src, src_valid)

    def new_cache(self) -> PrefixCache:
        return PrefixCache(self.model.new_cache(), self.forced)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_valid: Tensor, cache: PrefixCache | None = None
    ) -> Tensor:
        """As the model's ``decode``, one step at a time (tgt (N, 1)) with a cache; logits
        (N, 1, V), float32 while some row is inside its prefix."""
        if cache is None:
            raise ValueError("prefix-constrained decoding goes step by step, with a cache")
        logits = self.model.decode(tgt, memory, src_valid, cache.inner)
        step = cache.steps
        cache.steps += tgt.size(1)
        if step >= cache.forced.size(1):  # every prefix is behind: nothing to do
            return logits
        # (B,) -> (N,): the G rows of each sentence share its prefix
        forced = cache.forced[:, step].repeat_interleave(tgt.size(0) // memory.size(0))
        rows = (forced >= 0).nonzero().squeeze(1)
        if rows.numel() == 0:
            return logits
        logits = logits.to(torch.float32, copy=True)  # the model's own are left as they were
        last = torch.log_softmax(logits[rows, -1], dim=-1)  # (n, V)
        tok = forced[rows][:, None]  # (n, 1)
        keep = last.gather(1, tok)  # (n, 1) the model's log-probability of the forced token
        rest = torch.log1p(-keep.exp().clamp(max=1.0))  # (n, 1) log(1 - p): to PAD
        new = torch.full_like(last, float("-inf")).scatter_(1, tok, keep)
        new[:, PAD] = rest[:, 0]
        logits[rows, -1] = new
        return logits


__all__ = ["PrefixCache", "PrefixConstrained"]
