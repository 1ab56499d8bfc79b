"""Sentences of text on their way into a model: checked (a list of strings; lengths the model
can place) and cut into batches of similar lengths (``Translator``'s and ``score``'s)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transduce.errors import SentenceError
from transduce.inference.common import MAX_SENTENCE_TOKENS


def length_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Indices of ``lengths`` in batches of at most ``batch_tokens`` padded tokens
    (n_sentences * longest), longest sentences first; a sentence longer than the budget gets a
    batch of its own. Stable: equal lengths keep input order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        # Sorted longest first, so the batch's first sentence sets its padded length.
        longest = max(longest, lengths[i])
        if current and (len(current) + 1) * longest > batch_tokens:
            batches.append(current)
            current, longest = [], lengths[i]
        current.append(i)
    if current:
        batches.append(current)
    return batches


def text_list(values: Sequence[str], what: str, plural: str | None = None) -> list[str]:
    """``values`` as a list of strings; a TypeError for one string (or bytes) where a list is
    wanted, and for an item that is not a string, naming it (``what`` 3 is None, ...); a
    SentenceError for one holding a lone surrogate (no tokenizer reads it)."""
    if isinstance(values, str | bytes):
        many = plural or f"{what}s"
        raise TypeError(f"a list of {many} is wanted, not one {type(values).__name__}")
    out = list(values)
    for i, value in enumerate(out, start=1):
        if not isinstance(value, str):
            raise TypeError(f"{what} {i} is {type(value).__name__}, not a str")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate: no text a tokenizer can read
            why = f" holds {value[e.start]!r}, which is not a character (UTF-8 cannot write it)"
            raise SentenceError(i, why, what) from None
    return out


def check_lengths(
    ids: Sequence[Sequence[int]],
    todo: Sequence[int],
    limit: int | None,
    max_len_offset: int | None,
    noun: str = "sentence",
) -> None:
    """A SentenceError naming the first of the sentences ``todo`` (their token ids ``ids``)
    longer than a model's learned positions, ``limit`` of them, can place. With
    n source tokens the encoder takes n + 1 positions (EOS) and the decoder n + 1 +
    max_len_offset + 1: BOS, then the longest output, whose last step forces EOS (see
    ``inference.common``). ``max_len_offset`` None: the tokens are scored, not decoded (n + 1
    positions on either side: EOS after a source, BOS before a target). The sinusoidal table
    has no such limit (it grows), nor has the rnn: there a sentence of over
    ``MAX_SENTENCE_TOKENS`` is refused. ``noun``: what the error calls one (``SentenceError``)."""
    if limit is None:
        for j, x in enumerate(ids):
            if len(x) > MAX_SENTENCE_TOKENS:
                raise SentenceError(
                    todo[j] + 1,
                    f" has {len(x)} subword tokens; at most {MAX_SENTENCE_TOKENS} are "
                    "decoded (a whole text on one line? split it into sentences)",
                    noun,
                )
        return
    # tokens, EOS (or BOS) not counted
    longest = limit - 1 if max_len_offset is None else limit - 2 - max_len_offset
    for j, x in enumerate(ids):
        if len(x) > longest:
            room = f" with max_len_offset={max_len_offset}" if max_len_offset else ""
            raise SentenceError(  # (scoring decodes no further: no offset to name)
                todo[j] + 1,
                f" has {len(x)} subword tokens; this model's learned positions "
                f"(max_positions={limit}) take at most {max(longest, 0)}{room}",
                noun,
            )


def as_read(source: str, task: Any) -> str:
    """A source text as the model was trained to read it: reversed for a synthetic task trained
    with ``task.reverse_input`` (its training sources were reversed strings), else as it is."""
    return source[::-1] if getattr(task, "reverse_input", False) else source


__all__ = ["as_read", "check_lengths", "length_batches", "text_list"]
