"""What a queued request asks of its model (``Work``) and doing it (``do_work``): plain
translations, n-best lists with scores, alignments, prefixes, sampling, forced-decoding scores
and one sentence's attention, all on the batcher's worker thread.

The dynamic batcher (``transduce.serve.dynamic_batching``) concatenates the items of requests
with equal ``DecodeConfig`` and ``Work`` into one call here, so each kind batches only with its
own kind. A request's items are sentences (``str``) for a translation without prefixes, and
pairs ``(str, str)`` otherwise: (sentence, prefix), (source, target) to score, (source, target)
whose attention is read.

Plain Python over the translator's API; only ``attention`` reads a Transformer's weights
(``transduce.inference.attention_maps``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from transduce.config import DecodeConfig
from transduce.errors import UserError

__all__ = ["Answer", "Work", "do_work"]

Kind = Literal["translate", "score", "attention"]


@dataclass(frozen=True)
class Work:
    """What a request asks besides its decoding settings. ``translate``: with ``nbest`` 1 and
    nothing else, one string per sentence (``Translator.translate``); ``nbest`` over 1 alone,
    up to that many strings per sentence; with ``details``, ``alignments`` or ``prefixed``
    (items are (sentence, prefix) pairs) one ``Answer`` per sentence. ``score``: items are
    (source, target) pairs, one ``PairScore`` each (``Translator.score``). ``attention``: items
    are (source, target) pairs, one ``{"source", "target", "weights"}`` dict each."""

    kind: Kind = "translate"
    nbest: int = 1
    details: bool = False
    alignments: bool = False
    prefixed: bool = False

    @property
    def plain(self) -> bool:
        """Answered with strings, as ``translate`` / ``translate_nbest`` texts."""
        return self.kind == "translate" and not (self.details or self.alignments or self.prefixed)


@dataclass(frozen=True)
class Answer:
    """One sentence's translations, best first (``inference.translator.Translation``: text,
    score, log_prob), and the Pharaoh alignment of the best one (None when not asked for)."""

    hyps: list[Any]
    alignment: str | None = None


def do_work(translator: Any, items: Sequence[Any], decode: DecodeConfig, work: Work) -> list[Any]:
    """One result per item (see ``Work``), in order."""
    if work.kind == "score":
        return list(translator.score([s for s, _ in items], [t for _, t in items], decode))
    if work.kind == "attention":
        return [attention(translator, s, t) for s, t in items]
    if work.plain and work.nbest == 1:
        return list(translator.translate(items, decode))
    if work.plain:  # not in TranslatorLike: only n-best requests ask for it
        hyps = translator.translate_nbest(items, work.nbest, decode)
        return [[h.text for h in sentence_hyps] for sentence_hyps in hyps]
    sentences = [s for s, _ in items] if work.prefixed else list(items)
    prefixes = [p for _, p in items] if work.prefixed else None
    hyps = translator.translate_nbest(sentences, work.nbest, decode, prefixes=prefixes)
    if not work.alignments:
        return [Answer(h) for h in hyps]
    aligned = translator.align(sentences, [h[0].text for h in hyps])
    return [Answer(h, a) for h, a in zip(hyps, aligned, strict=True)]


def attention(translator: Any, source: str, target: str) -> dict[str, Any]:
    """The encoder-decoder attention of the last layer, averaged over its heads, of the model
    teacher-forced on (source, target): ``source`` pieces and EOS (S), ``target`` pieces and
    EOS (T), ``weights`` (T x S) rounded to 4 decimals. A UserError for a model that is not a
    Transformer, an empty source, or a side longer than the learned positions reach."""
    from transduce.inference.attention_maps import DRAWN_MAX_TOKENS, attention_maps, sides
    from transduce.inference.text_inputs import as_read

    vocab = translator.vocab
    m = translator.cfg.model
    # each side in its own vocabulary (a VocabPair's target pieces are not its source's)
    for name, text, side in zip(("text", "translation"), (source, target), sides(vocab)):
        n = len(side.encode(text.strip()))
        if n > DRAWN_MAX_TOKENS:  # the answer grows with their product: 2,000 x 2,000 was 28 MB
            raise UserError(
                f"'{name}' has {n} subword tokens; attention is given for at most "
                f"{DRAWN_MAX_TOKENS} a side (one sentence)"
            )
        if m.positional == "learned" and n + 1 > m.max_positions:  # each side: pieces + 1
            raise UserError(
                f"'{name}' has {n} subword tokens; this model's learned positions "
                f"(max_positions={m.max_positions}) take at most {m.max_positions - 1}"
            )
    maps = attention_maps(translator.model, vocab, as_read(source, translator.cfg.task), target)
    weights = maps.cross[-1].mean(0)  # (H, T, S) -> (T, S)
    return {
        "source": maps.source,
        "target": maps.outputs,
        "weights": [[round(w, 4) for w in row] for row in weights.tolist()],
    }
