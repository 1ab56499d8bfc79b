"""Vocabularies. Every vocabulary in transduce uses the same special ids, so models, decoders and
checkpoints never need to ask: PAD 0, BOS 1, EOS 2, UNK 3."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")


class Vocab(Protocol):
    """Text <-> ids. ``encode`` adds no BOS/EOS; ``decode`` drops special ids."""

    def __len__(self) -> int: ...
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def to_dict(self) -> dict[str, Any]: ...


class CharVocab:
    """One token per character of a fixed alphabet (the synthetic tasks)."""

    def __init__(self, symbols: Sequence[str]) -> None:
        if len(set(symbols)) != len(symbols) or any(len(s) != 1 for s in symbols):
            raise ValueError("symbols must be distinct single characters")
        self.symbols = list(symbols)
        self._index = {s: i + len(SPECIALS) for i, s in enumerate(self.symbols)}

    def __len__(self) -> int:
        return len(SPECIALS) + len(self.symbols)

    def encode(self, text: str) -> list[int]:
        return [self._index.get(ch, UNK) for ch in text]

    def decode(self, ids: Sequence[int]) -> str:
        n = len(SPECIALS)
        return "".join(self.symbols[i - n] for i in ids if i >= n)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "char", "symbols": "".join(self.symbols)}


class TokenVocab:
    """A closed set of whitespace-separated tokens, one id each (the bracket tokens of a
    linearised tree); a token outside the set encodes as UNK."""

    def __init__(self, tokens: Sequence[str]) -> None:
        if len(set(tokens)) != len(tokens) or any(not t or t.split() != [t] for t in tokens):
            raise ValueError("tokens must be distinct and free of whitespace")
        if set(tokens) & set(SPECIALS):
            raise ValueError(f"tokens must not include the specials {SPECIALS}")
        self.tokens = list(tokens)
        self._index = {t: i + len(SPECIALS) for i, t in enumerate(self.tokens)}

    @classmethod
    def learn(cls, texts: Sequence[str]) -> TokenVocab:
        """The tokens of ``texts``, most frequent first (ties in order of appearance)."""
        counts: dict[str, int] = {}
        for text in texts:
            for t in text.split():
                counts[t] = counts.get(t, 0) + 1
        return cls(sorted(counts, key=lambda t: -counts[t]))

    def __len__(self) -> int:
        return len(SPECIALS) + len(self.tokens)

    def encode(self, text: str) -> list[int]:
        return [self._index.get(t, UNK) for t in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        n = len(SPECIALS)
        return " ".join(self.tokens[i - n] for i in ids if i >= n)

    def id_to_piece(self, i: int) -> str:
        return SPECIALS[i] if i < len(SPECIALS) else self.tokens[i - len(SPECIALS)]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "tokens", "tokens": list(self.tokens)}


class VocabPair:
    """Separate source and target vocabularies as one ``Vocab``: ``encode`` is the source's,
    ``decode`` the target's; ``len`` is the target's (the output layer)."""

    def __init__(self, source: Vocab, target: Vocab) -> None:
        self.source, self.target = source, target

    def __len__(self) -> int:
        return len(self.target)

    def encode(self, text: str) -> list[int]:
        return self.source.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.target.decode(ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode`` of each text (the source's batched encoder where it has one)."""
        batch = getattr(self.source, "encode_batch", None)
        return batch(texts) if batch is not None else [self.source.encode(t) for t in texts]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "pair", "source": self.source.to_dict(), "target": self.target.to_dict()}


def sides(vocab: Vocab) -> tuple[Vocab, Vocab]:
    """(source vocabulary, target vocabulary) of a model's vocabulary: a ``VocabPair``'s two, or
    one shared vocabulary twice; where the shared one splits target text its own way (an
    OPUS-MT vocabulary: ``source.spm`` and ``target.spm`` over one list of pieces), its
    ``target_side()`` for the target."""
    if isinstance(vocab, VocabPair):
        return vocab.source, vocab.target
    target_side = getattr(vocab, "target_side", None)
    return vocab, (target_side() if target_side is not None else vocab)


def vocab_sizes(vocab: Vocab) -> tuple[int, int | None]:
    """(source size, target size or None for one shared vocabulary) of a model's vocabulary."""
    if isinstance(vocab, VocabPair):
        return len(vocab.source), len(vocab.target)
    return len(vocab), None
