"""The constraint for decoding linearised trees, checked by brute force on tiny cases."""

import itertools
import random

import numpy as np
import pytest

from transduce.data.linearise import delinearise
from transduce.parsing.tree_constraint import (
    TreeConstraint,
    advance,
    next_tokens,
    start_state,
)

EOS = "</s>"
VOCAB = ["<pad>", EOS, "(A", ")A", "(B", ")B", "XX", "(D"]  # (D has no close bracket
ALPHABET = [t for t in VOCAB if t not in ("<pad>", EOS)]
MAX_LEN = 6


def _constituent(seq: tuple[str, ...], i: int) -> tuple[int, int] | None:
    """Independent oracle: parse one constituent at ``seq[i]``; (end, words) or None."""
    if i >= len(seq) or not (len(seq[i]) > 1 and seq[i][0] == "("):
        return None
    label, i, words, children = seq[i][1:], i + 1, 0, 0
    while i < len(seq) and seq[i] != ")" + label:
        if seq[i] == "XX":
            i, words = i + 1, words + 1
        else:
            inner = _constituent(seq, i)
            if inner is None:
                return None
            i, words = inner[0], words + inner[1]
        children += 1
    if i >= len(seq) or children == 0:
        return None
    return i + 1, words


def _words_if_tree(seq: tuple[str, ...]) -> int | None:
    """The word count of ``seq`` if it is exactly one well-formed constituent, else None."""
    parsed = _constituent(seq, 0)
    return parsed[1] if parsed is not None and parsed[0] == len(seq) else None


@pytest.fixture(scope="module")
def trees() -> list[tuple[tuple[str, ...], int]]:
    """Every well-formed sequence over ALPHABET of at most MAX_LEN tokens, with its words."""
    out = []
    for length in range(MAX_LEN + 1):
        for seq in itertools.product(ALPHABET, repeat=length):
            words = _words_if_tree(seq)
            if words is not None:
                out.append((seq, words))
    return out


@pytest.mark.parametrize("n_words", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("max_tokens", range(MAX_LEN + 1))
def test_allowed_is_exactly_the_completable_tokens(trees, n_words, max_tokens):
    complete = {seq for seq, words in trees if words == n_words and len(seq) <= max_tokens}
    completable = {seq[:k] for seq in complete for k in range(len(seq) + 1)}
    constraint = TreeConstraint(VOCAB, eos=EOS)
    visited = 0
    # walk every prefix the constraint allows; each must be completable, and every completable
    # one must be reached (counted at the end)
    todo = [((), constraint.start(n_words, max_tokens))]
    while todo:
        prefix, state = todo.pop()
        visited += 1
        expected = {t for t in ALPHABET if prefix + (t,) in completable}
        if prefix in complete:
            expected.add(EOS)
        assert constraint.allowed(state) == expected, prefix
        assert state.complete == (prefix in complete)
        mask = constraint.mask(state)
        assert mask.dtype == np.bool_ and not mask.flags.writeable
        assert {VOCAB[i] for i in np.flatnonzero(mask)} == expected
        for token in ALPHABET:
            if token in expected:
                after = constraint.advance(state, token)
                assert advance(state, token) == after  # the vocabulary-free function agrees
                todo.append((prefix + (token,), after))
            else:
                with pytest.raises(ValueError, match="not allowed"):
                    constraint.advance(state, token)
                if token != "(D":  # without a vocabulary, (D is an open bracket like any
                    with pytest.raises(ValueError, match="not allowed"):
                        advance(state, token)
    assert visited == len(completable | {()})  # the start is visited even when nothing fits


def test_nothing_fits_when_the_budget_is_short():
    assert next_tokens(start_state(3, 4)).open is False  # needs (L XX XX XX )L: 5 tokens
    assert next_tokens(start_state(3, 5)).open is True
    assert next_tokens(start_state(0, 10)).open is False  # no tree over no words


def test_advance_by_id_and_a_close_matching_the_innermost():
    c = TreeConstraint(VOCAB, eos=EOS)
    s = c.advance(c.start(1, 10), VOCAB.index("(A"))
    s = c.advance(s, "(B")
    s = c.advance(s, "XX")
    assert c.allowed(s) == {")B"}  # no more words, so no new constituent either
    with pytest.raises(ValueError):
        c.advance(s, ")A")
    s = c.advance(c.advance(s, ")B"), ")A")
    assert s.complete and c.allowed(s) == {EOS}


def test_tags_as_word_tokens():
    vocab = ["(S", ")S", "DT", "NN", EOS]
    c = TreeConstraint(vocab, eos=EOS, word_tokens=("DT", "NN"))
    s = c.advance(c.start(2, 4), "(S")
    assert c.allowed(s) == {"DT", "NN"}
    s = c.advance(c.advance(s, "NN"), "DT")
    assert c.allowed(s) == {")S"}


@pytest.mark.parametrize("n_words", [1, 2, 5, 9])
def test_random_constrained_walks_delinearise_without_repairs(n_words):
    rng = random.Random(n_words)
    c = TreeConstraint(VOCAB, eos=EOS)
    words = [f"w{i}" for i in range(n_words)]
    for _ in range(50):
        budget = rng.randint(n_words + 2, 3 * n_words + 6)
        state, tokens = c.start(n_words, budget), []
        while True:
            allowed = sorted(c.allowed(state))
            assert allowed, tokens  # never stuck
            token = rng.choice(allowed)
            if token == EOS:
                break
            tokens.append(token)
            state = c.advance(state, token)
        assert len(tokens) <= budget
        tree, repairs = delinearise(tokens, words)
        assert repairs == 0 and tree.words() == words
