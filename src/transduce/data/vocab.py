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

