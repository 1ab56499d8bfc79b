"""The models one server serves: each a translator for one language pair (``ServedModel``), with
its own dynamic batcher, and how a request's ``source`` / ``target`` picks one (``ServedModels``).

A checkpoint does not record its languages (the task config names files, not languages), so they
are given when serving (``transduce serve --model en:de=en-de.pt``). One model may go without
them: the native API needs none; the LibreTranslate API then has nothing to list, and says so.

Plain Python; ``transduce.serve.server`` and ``transduce.serve.libretranslate`` put HTTP in front.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from transduce.serve.dynamic_batching import DynamicBatcher, TranslatorLike

__all__ = ["LANGUAGE_CODE", "NoSuchPair", "ServedModel", "ServedModels"]

# what a language code may look like: ISO 639-1/-3 ("en", "fra"), with a region or script after
# "-" or "_" ("pt-BR", "zh_Hant")
LANGUAGE_CODE = re.compile(r"[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})*")


@dataclass(frozen=True)
class ServedModel:
    """A translator and the language pair it translates (both None: not given, the only model
    of its server then)."""

    translator: TranslatorLike
    source: str | None = None
    target: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if (self.source is None) != (self.target is None):
            raise ValueError("a model's languages are both given or both not")
        for code in (self.source, self.target):
            if code is not None and not LANGUAGE_CODE.fullmatch(code):
                raise ValueError(f"{code!r} is not a language code (such as en, de, pt-BR)")

    @property
    def pair(self) -> str:
        return "?" if self.source is None else f"{self.source}->{self.target}"


class NoSuchPair(Exception):
    """No served model translates the asked pair; the message says which pairs are served."""


def _once(codes: Sequence[str]) -> list[str]:
    """``codes`` without repeats, case aside (``en`` and ``EN`` are one language), as first
    spelt."""
    first: dict[str, str] = {}
    for code in codes:
        first.setdefault(code.lower(), code)
    return list(first.values())


class ServedModels:
    """The served models, the first one the default, each with its DynamicBatcher
    (``batchers[i]`` for ``models[i]``). Language codes are matched case-insensitively."""

    def __init__(self, models: Sequence[ServedModel], batchers: Sequence[DynamicBatcher]) -> None:
        if not models:
            raise ValueError("a server needs at least one model")
        if len(models) != len(batchers):
            raise ValueError("one batcher per model")
        if len(models) > 1 and any(m.source is None for m in models):
            raise ValueError("with several models, each needs its languages")
        seen: set[tuple[str, str]] = set()
        for m in models:
            if m.source is not None and m.target is not None:
                key = (m.source.lower(), m.target.lower())
                if key in seen:
                    raise ValueError(f"two models translate {m.pair}")
                seen.add(key)
        self.models = list(models)
        self.batchers = list(batchers)

    def __len__(self) -> int:
        return len(self.models)

    @property
    def labelled(self) -> bool:
        """Whether the models' languages are known (always, with more than one model)."""
        return self.models[0].source is not None

    def pairs(self) -> list[tuple[str, str]]:
        return [(m.source, m.target) for m in self.models if m.source and m.target]

    def languages(self) -> list[str]:
        """Every language a model translates from or into, in the order the models name them."""
        return _once([code for pair in self.pairs() for code in pair])

    def sources(self, target: str | None = None) -> list[str]:
        """The languages translated from (into ``target``, when given)."""
        pairs = self.pairs()
        return _once([s for s, t in pairs if target is None or t.lower() == target.lower()])

    def targets(self, source: str) -> list[str]:
        return [t for s, t in self.pairs() if s.lower() == source.lower()]

    def pick(self, source: str, target: str) -> int:
        """The index of the model translating ``source`` into ``target``; NoSuchPair if none."""
        for i, m in enumerate(self.models):
            if (m.source or "").lower() == source.lower() and (
                m.target or ""
            ).lower() == target.lower():
                return i
        served = ", ".join(f"{s}->{t}" for s, t in self.pairs()) or "none (no languages given)"
        raise NoSuchPair(f"no model translates {source} into {target}; served: {served}")
