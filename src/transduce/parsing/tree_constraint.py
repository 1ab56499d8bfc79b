"""Constrained decoding of linearised trees (beyond the paper, which decodes unconstrained).

A decoder that emits the tokens of ``transduce.data.linearise`` can be kept to output that
``delinearise`` reads without any repair: exactly one constituent, brackets balanced and each
close bracket matching the innermost open one, no empty constituent, exactly ``n`` word slots,
at most ``max_tokens`` tokens before the end-of-sentence token.

``TreeState`` is the immutable state after a prefix; ``next_tokens(state)`` says which kinds of
token may come next so that the prefix can still be completed within the budget, and
``advance(state, token)`` moves on. ``TreeConstraint`` binds these to a vocabulary: ``mask``
gives a boolean array over it (cached per distinct answer, so a decoding step costs a dict
look-up), ``allowed`` the set of token strings.

Why the budget test is exact: from a state with ``d`` open constituents and ``r`` words still
to place, the shortest completion is the ``r`` slots followed by the ``d`` close brackets
(``r + d`` tokens), and it exists only when ``r >= 1`` if the innermost open constituent is
still empty (each constituent needs a word under it) and ``r == 0`` once the root is closed.
Before anything is emitted the shortest tree is ``(L`` + ``n`` slots + ``)L``: ``n + 2`` tokens.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from transduce.data.linearise import WORD_SLOT, is_close, is_open

__all__ = ["NextTokens", "TreeConstraint", "TreeState", "advance", "next_tokens", "start_state"]


@dataclass(frozen=True, slots=True)
class TreeState:
    """Where a decoder is in a linearised tree.

    ``n_words``: the sentence's words; ``max_tokens``: the most tokens allowed before the
    end-of-sentence token; ``emitted``: tokens so far; ``placed``: word slots so far;
    ``open_labels``: labels of the open constituents, outermost first; ``filled``: whether the
    innermost open constituent has a child yet; ``started``: whether the root was opened.
    """

    n_words: int
    max_tokens: int
    emitted: int = 0
    placed: int = 0
    open_labels: tuple[str, ...] = ()
    filled: bool = False
    started: bool = False

    @property
    def complete(self) -> bool:
        """Whether the tokens so far are a whole well-formed tree (the end may come now)."""
        return self.started and not self.open_labels and self.placed == self.n_words


@dataclass(frozen=True, slots=True)
class NextTokens:
    """What may come next: any open bracket (``open``), the close bracket of this label
    (``close``, None for none), a word slot (``word``), the end of sentence (``end``)."""

    open: bool
    close: str | None
    word: bool
    end: bool


def start_state(n_words: int, max_tokens: int) -> TreeState:
    """The state before the first token, for a sentence of ``n_words`` words and a budget of
    ``max_tokens`` tokens before the end. Nothing is allowed when no tree fits
    (``n_words < 1`` or ``max_tokens < n_words + 2``)."""
    return TreeState(n_words=n_words, max_tokens=max_tokens)


def next_tokens(state: TreeState) -> NextTokens:
    """The kinds of token that keep ``state`` completable within its budget."""
    left = state.max_tokens - state.emitted  # tokens that may still come before the end
    remaining = state.n_words - state.placed
    depth = len(state.open_labels)
    if not state.started:
        # the root: (L, then at least one slot per word, then )L
        return NextTokens(remaining >= 1 and remaining + 2 <= left, None, False, False)
    if depth == 0:
        return NextTokens(False, None, False, state.complete)
    # opening: one more bracket to close and a word needed under it
    can_open = remaining >= 1 and 1 + remaining + depth + 1 <= left
    # a word: the innermost constituent is filled; r-1 slots and d closes remain
    can_word = remaining >= 1 and 1 + (remaining - 1) + depth <= left
    # closing: only a filled constituent; closing the root only with every word placed
    can_close = state.filled and (depth > 1 or remaining == 0) and 1 + remaining + depth - 1 <= left
    close = state.open_labels[-1] if can_close else None
    return NextTokens(can_open, close, can_word, False)


def advance(
    state: TreeState, token: str, *, word_tokens: Collection[str] = (WORD_SLOT,)
) -> TreeState:
    """The state after ``token`` (an open bracket ``(L``, a close bracket ``)L``, or one of
    ``word_tokens``). ``ValueError`` when ``token`` is not allowed in ``state`` (this includes
    the end of sentence, which ends decoding rather than advancing)."""
    nxt = next_tokens(state)
    allowed = (
        (is_open(token) and nxt.open)
        or (is_close(token) and nxt.close == token[1:])
        or (token in word_tokens and nxt.word)
    )
    if not allowed:
        raise ValueError(f"token {token!r} is not allowed here ({nxt})")
    return _step(state, token, word_tokens)


def _step(state: TreeState, token: str, word_tokens: Collection[str]) -> TreeState:
    """The state after an allowed ``token`` (not checked)."""
    n, budget, emitted = state.n_words, state.max_tokens, state.emitted + 1
    if token in word_tokens:
        return TreeState(n, budget, emitted, state.placed + 1, state.open_labels, True, True)
    if is_open(token):
        labels = state.open_labels + (token[1:],)
        return TreeState(n, budget, emitted, state.placed, labels, False, True)
    return TreeState(n, budget, emitted, state.placed, state.open_labels[:-1], True, True)


class TreeConstraint:
    """``next_tokens`` over a fixed target vocabulary.

    ``vocab[i]`` is the string of token id ``i``; ``eos`` the end-of-sentence string;
    ``word_tokens`` the word slots (``XX``, or the tag set when tags are kept). Tokens that are
    none of these and not brackets (padding, BOS, unknown) are never allowed. An open bracket
    whose close bracket is not in the vocabulary is never allowed either (it could not close).
    """

    def __init__(
        self, vocab: Sequence[str], *, eos: str, word_tokens: Collection[str] = (WORD_SLOT,)
    ) -> None:
        self.vocab = tuple(vocab)
        self.eos = eos
        self.word_tokens = frozenset(word_tokens)
        self._ids = {tok: i for i, tok in enumerate(self.vocab)}
        closes = {tok[1:] for tok in self.vocab if is_close(tok)}
        self._open_ids = [i for i, t in enumerate(self.vocab) if is_open(t) and t[1:] in closes]
        self._close_id = {t[1:]: i for i, t in enumerate(self.vocab) if is_close(t)}
        self._word_ids = [i for i, t in enumerate(self.vocab) if t in self.word_tokens]
        self._eos_id = self._ids.get(eos)
        self._masks: dict[NextTokens, np.ndarray] = {}  # per instance: few distinct answers

    def start(self, n_words: int, max_tokens: int) -> TreeState:
        """``start_state(n_words, max_tokens)``."""
        return start_state(n_words, max_tokens)

    def advance(self, state: TreeState, token: str | int) -> TreeState:
        """The state after ``token`` (a string or a vocabulary id); ``ValueError`` if ``mask``
        does not allow it (the end of sentence included: it ends decoding)."""
        index = token if isinstance(token, int) else self._ids.get(token)
        if index is None or not self.mask(state)[index]:
            raise ValueError(f"token {token!r} is not allowed here ({next_tokens(state)})")
        return _step(state, self.vocab[index], self.word_tokens)

    def mask(self, state: TreeState) -> np.ndarray:
        """A read-only boolean array over the vocabulary: True where the token may come next."""
        nxt = next_tokens(state)
        cached = self._masks.get(nxt)
        if cached is None:
            cached = np.zeros(len(self.vocab), dtype=bool)
            if nxt.open:
                cached[self._open_ids] = True
            if nxt.close is not None and nxt.close in self._close_id:
                cached[self._close_id[nxt.close]] = True
            if nxt.word:
                cached[self._word_ids] = True
            if nxt.end and self._eos_id is not None:
                cached[self._eos_id] = True
            cached.flags.writeable = False
            self._masks[nxt] = cached
        return cached

    def allowed(self, state: TreeState) -> set[str]:
        """The token strings that may come next."""
        return {self.vocab[i] for i in np.flatnonzero(self.mask(state))}
