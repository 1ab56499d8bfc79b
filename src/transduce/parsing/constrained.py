"""Constrained decoding of linearised trees: a model wrapper that lets a search emit only what can
still become a well-formed tree with exactly the input's number of words (beyond the paper).

``ConstrainedTrees`` keeps the decoding contract, so greedy and beam search take it unchanged:
its cache holds, beside the model's, one ``TreeState`` per hypothesis row, reordered with the
rows; ``decode`` advances each row's state by the token it was fed and masks the logits of every
token ``TreeConstraint`` does not allow next. Budgets follow the searches' own: a sentence of n
source tokens may take ``n + max_len_offset`` tokens before its end, when the search forces EOS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from transduce.data.vocab import EOS
from transduce.inference.common import max_output_lengths
from transduce.inference.contract import DecodableModel
from transduce.parsing.tree_constraint import TreeConstraint, TreeState


class ConstrainedCache:
    """The model's cache and one tree state per hypothesis row (None: the row has ended, or its
    sentence's states start at the next decode)."""

    def __init__(self, inner: Any, starts: list[TreeState]) -> None:  # noqa: ANN401 - any cache
        self.inner = inner
        self.starts = starts  # per source sentence, for the first decode
        self.states: list[TreeState | None] | None = None

    def reorder(self, index: Tensor) -> None:
        self.inner.reorder(index)
        if self.states is not None:
            self.states = [self.states[i] for i in index.tolist()]

    def select_sources(self, index: Tensor) -> None:
        self.inner.select_sources(index)
        self.starts = [self.starts[i] for i in index.tolist()]


class ConstrainedTrees:
    """``model`` whose next-token logits are -inf wherever ``constraint`` forbids the token.

    ``n_words(ids)`` gives the number of words of a source sentence from its ids (EOS and
    padding removed); ``max_len_offset`` must be the search's.
    """

    def __init__(
        self,
        model: DecodableModel[Any],
        constraint: TreeConstraint,
        n_words: Callable[[list[int]], int],
        max_len_offset: int,
    ) -> None:
        self.model, self.constraint = model, constraint
        self.n_words, self.max_len_offset = n_words, max_len_offset
        self._starts: list[TreeState] = []

    @property
    def training(self) -> bool:
        return self.model.training

    def encode(self, src: Tensor, src_valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The model's, and each sentence's start state for the next ``new_cache``."""
        memory, valid = self.model.encode(src, src_valid)
        budgets = max_output_lengths(src, self.max_len_offset, None).tolist()
        rows = [[t for t in row if t > EOS] for row in src.tolist()]  # no PAD, BOS, EOS
        self._starts = [
            self.constraint.start(self.n_words(ids), budget)
            for ids, budget in zip(rows, budgets, strict=True)
        ]
        return memory, valid

    def new_cache(self) -> ConstrainedCache:
        return ConstrainedCache(self.model.new_cache(), self._starts)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_valid: Tensor, cache: ConstrainedCache | None = None
    ) -> Tensor:
        """The model's logits (N, T, V); with a cache (a search), those of disallowed next
        tokens -inf at the last position."""
        if cache is None:  # teacher forcing: unconstrained
            return self.model.decode(tgt, memory, src_valid)
        logits = self.model.decode(tgt, memory, src_valid, cache.inner)
        fed = tgt[:, -1].tolist()
        if cache.states is None:  # the first step: one row per sentence, BOS fed
            states: list[TreeState | None] = list(cache.starts)
        else:
            states = [self._advance(s, t) for s, t in zip(cache.states, fed, strict=True)]
        cache.states = states
        allowed = np.stack(
            [
                self.constraint.mask(s) if s is not None else np.ones(logits.size(-1), dtype=bool)
                for s in states
            ]
        )  # (N, V)
        mask = torch.from_numpy(allowed).to(logits.device)
        last = logits[:, -1].masked_fill(~mask, float("-inf"))  # (N, V)
        if logits.size(1) == 1:  # the searches' one position a step
            return last[:, None]
        return torch.cat([logits[:, :-1], last[:, None]], dim=1)

    def _advance(self, state: TreeState | None, token: int) -> TreeState | None:
        """The state after ``token``; None once the row has ended (its EOS) or for a token the
        constraint did not allow (a finished hypothesis's row the search no longer reads)."""
        if state is None:
            return None
        try:
            return self.constraint.advance(state, token)
        except ValueError:
            return None


__all__ = ["ConstrainedCache", "ConstrainedTrees"]
