"""A tree as a parsing model's target text (section 6.3): its linearisation, with each word slot
``XX`` kept, or holding the word's tag (``keep_tags``) or its first source piece
(``slot_pieces``), as the task's config says: what a parser is trained on and scored against."""

from __future__ import annotations

from collections.abc import Sequence

from transduce.config import ParsingTaskConfig
from transduce.data.linearise import fill_slots, linearise
from transduce.data.subword import SentencePieceVocab
from transduce.data.trees import Tree


def first_pieces(source: SentencePieceVocab, words: Sequence[str]) -> list[str]:
    """Each word's first source piece (the one that starts with "▁"), in order."""
    firsts = [p for p in source.pieces(" ".join(words)) if p.startswith("▁")]
    if len(firsts) != len(words):  # a word that normalises to nothing: word by word
        firsts = [(source.pieces(w) or ["▁"])[0] for w in words]
    return firsts


def parsing_targets(
    trees: Sequence[Tree],
    sentences: Sequence[Sequence[str]],
    task: ParsingTaskConfig,
    source: SentencePieceVocab,
) -> list[str]:
    """The linearised trees as target text, a word slot ``XX``, the tag (``keep_tags``) or the
    word's first source piece (``slot_pieces``)."""
    out = []
    for tree, words in zip(trees, sentences, strict=True):
        tokens = linearise(tree, tags=task.keep_tags)
        if task.slot_pieces:
            tokens = fill_slots(tokens, first_pieces(source, words))
        out.append(" ".join(tokens))
    return out


__all__ = ["first_pieces", "parsing_targets"]
