"""The decoding toolbox's fields of ``POST /translate`` (``nbest``, ``scores``, ``alignments``,
``sampling``, ``prefix``), the bodies of ``POST /score`` and ``POST /attention``, checked as the
other fields are (ApiError 422 naming the field, 413 over the limits), and the answers' JSON.

A request without any of them is answered as before: ``{"translations": [...]}``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from typing import Any

from transduce.config import MAX_TEMPERATURE, MIN_TEMPERATURE, DecodeConfig
from transduce.serve.requests import (
    ApiError,
    ServerLimits,
    check_alpha,
    check_integer,
    check_language,
    check_texts,
    load_json,
    type_name,
)
from transduce.serve.work import Answer, Work

__all__ = [
    "MAX_SEED",
    "MAX_TEMPERATURE",
    "MAX_TOP_K",
    "MIN_TEMPERATURE",
    "AttentionRequest",
    "ScoreRequest",
    "TranslateOptions",
    "answer_json",
    "parse_attention_request",
    "parse_options",
    "parse_score_request",
]

SAMPLING_FIELDS = ("seed", "temperature", "top_k", "top_p")
MAX_TOP_K = 1_000_000
MAX_SEED = 2**32 - 1  # exact as a JSON Schema bound (a double); torch takes up to 2**64 - 1


@dataclass(frozen=True)
class TranslateOptions:
    """The toolbox's fields of one ``POST /translate``: ``nbest`` (None: not asked; else that
    many translations per sentence, best first, with their scores), ``scores`` (the best
    translation's score and log-probability), ``alignments`` (its Pharaoh word alignment),
    ``sampling`` (DecodeConfig's sampling fields, None: search), ``prefix`` (per sentence, the
    text its translation starts with)."""

    nbest: int | None = None
    scores: bool = False
    alignments: bool = False
    sampling: dict[str, Any] | None = None
    prefix: list[str] | None = None

    def decode(self, decode: DecodeConfig) -> DecodeConfig:
        """``decode`` with the sampling asked for (a UserError if DecodeConfig refuses it);
        without a seed, one drawn at random (the answer gives it), so that two requests give
        two draws."""
        if self.sampling is None:
            return decode
        sampling = {"sampling_seed": secrets.randbelow(MAX_SEED + 1), **self.sampling}
        return replace(decode, sampling=True, **sampling)

    def work(self) -> Work:
        details = self.nbest is not None or self.scores
        return Work(
            nbest=self.nbest or 1,
            details=details,
            alignments=self.alignments,
            prefixed=self.prefix is not None,
        )

    def items(self, sentences: list[str]) -> list[Any]:
        """What the batcher is given: the sentences, or (sentence, prefix) pairs."""
        if self.prefix is None:
            return sentences
        return list(zip(sentences, self.prefix, strict=True))


def parse_options(raw: dict[str, Any], limits: ServerLimits, n_sentences: int) -> TranslateOptions:
    """The toolbox's fields of a ``/translate`` body (``TranslateRequest.options``)."""
    nbest = raw.get("nbest")
    if nbest is not None:
        nbest = check_integer("nbest", nbest, 1, limits.max_beam)
    scores, alignments = (_check_bool(raw, name) for name in ("scores", "alignments"))
    sampling = raw.get("sampling")
    if sampling is not None:
        sampling = _check_sampling(sampling)
    prefix = raw.get("prefix")
    if prefix is not None:
        prefix = check_texts(prefix, limits, "prefix")
        if len(prefix) != n_sentences:
            raise ApiError(
                422,
                f"'prefix' must have one string per sentence of 'text' ({n_sentences}); "
                f"got {len(prefix)}",
            )
    return TranslateOptions(nbest, scores, alignments, sampling, prefix)


def _check_bool(raw: dict[str, Any], name: str) -> bool:
    value = raw.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(422, f"'{name}' must be a boolean, not {type_name(value)}")
    return value


def _check_number(name: str, value: Any, low: float, high: float, *, open_low: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(422, f"'{name}' must be a number, not {type_name(value)}")
    if not ((low < value) if open_low else (low <= value)) or value > high:
        side = "(" if open_low else "["
        raise ApiError(422, f"'{name}' must be in {side}{low:g}, {high:g}]; got {value}")
    return float(value)


def _check_sampling(value: Any) -> dict[str, Any]:
    """``sampling``: an object of ``seed``, ``temperature``, ``top_k``, ``top_p`` (each
    optional) -> DecodeConfig's fields."""
    if not isinstance(value, dict):
        raise ApiError(422, f"'sampling' must be an object, not {type_name(value)}")
    unknown = sorted(set(value) - set(SAMPLING_FIELDS))
    if unknown:
        raise ApiError(
            422,
            f"unknown field 'sampling.{unknown[0]}'; its fields are {', '.join(SAMPLING_FIELDS)}",
        )
    out: dict[str, Any] = {}
    if value.get("seed") is not None:
        out["sampling_seed"] = check_integer("sampling.seed", value["seed"], 0, MAX_SEED)
    if value.get("temperature") is not None:
        out["temperature"] = _check_number(
            "sampling.temperature",
            value["temperature"],
            MIN_TEMPERATURE,
            MAX_TEMPERATURE,
            open_low=False,
        )
    if value.get("top_k") is not None:
        out["top_k"] = check_integer("sampling.top_k", value["top_k"], 0, MAX_TOP_K)
    if value.get("top_p") is not None:
        out["top_p"] = _check_number("sampling.top_p", value["top_p"], 0.0, 1.0, open_low=True)
    return out


def answer_json(texts: list[Any], options: TranslateOptions) -> dict[str, Any]:
    """The JSON answer of a ``/translate`` with ``options``: ``translations`` always, then
    ``nbest``, ``scores``, ``alignments`` where asked for. ``texts`` is what the batcher gave:
    strings, or ``Answer``s when the work had details, alignments or prefixes."""
    if texts and not isinstance(texts[0], Answer):
        return {"translations": texts}
    out: dict[str, Any] = {"translations": [a.hyps[0].text for a in texts]}
    if options.nbest is not None:
        out["nbest"] = [[_hyp(h) for h in a.hyps] for a in texts]
    if options.scores:
        out["scores"] = [{"score": a.hyps[0].score, "log_prob": a.hyps[0].log_prob} for a in texts]
    if options.alignments:
        out["alignments"] = [a.alignment for a in texts]
    return out


def _hyp(h: Any) -> dict[str, Any]:
    return {"translation": h.text, "score": h.score, "log_prob": h.log_prob}


# -- POST /score and POST /attention -----------------------------------------------------------


@dataclass(frozen=True)
class ScoreRequest:
    """A parsed ``POST /score``: (source, target) pairs, the length penalty's ``alpha`` for the
    ``normalized`` score (None: the model's), the language pair (None: the first model)."""

    pairs: list[tuple[str, str]]
    alpha: float | None = None
    source: str | None = None
    target: str | None = None


@dataclass(frozen=True)
class AttentionRequest:
    """A parsed ``POST /attention``: one sentence and a translation of it."""

    text: str
    translation: str
    source: str | None = None
    target: str | None = None


def _object(body: bytes, fields: tuple[str, ...], required: tuple[str, ...]) -> dict[str, Any]:
    data = load_json(body)
    if not isinstance(data, dict):
        raise ApiError(422, f"the body must be a JSON object, not {type_name(data)}")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ApiError(422, f"unknown field {unknown[0]!r}; the fields are {', '.join(fields)}")
    for name in required:
        if name not in data:
            raise ApiError(422, f"missing field {name!r}")
    source, target = (check_language(data, name) for name in ("source", "target"))
    if (source is None) != (target is None):
        raise ApiError(422, "'source' and 'target' are given together or not at all")
    return data


def parse_score_request(body: bytes, limits: ServerLimits) -> ScoreRequest:
    """``{"text": [...], "translation": [...], "alpha"?, "source"?, "target"?}``: each
    sentence with its translation, at most ``max_sentences`` pairs."""
    fields = ("text", "translation", "alpha", "source", "target")
    data = _object(body, fields, ("text", "translation"))
    text = check_texts(data["text"], limits)
    translation = check_texts(data["translation"], limits, "translation")
    if len(text) != len(translation):
        raise ApiError(
            422,
            f"'translation' must have one string per sentence of 'text' ({len(text)}); "
            f"got {len(translation)}",
        )
    alpha = check_alpha(data.get("alpha"), limits)
    pairs = list(zip(text, translation, strict=True))
    return ScoreRequest(pairs, alpha, data.get("source"), data.get("target"))


def parse_attention_request(body: bytes, limits: ServerLimits) -> AttentionRequest:
    """``{"text": "...", "translation": "...", "source"?, "target"?}``: one sentence (not
    empty) and the translation whose attention is read."""
    data = _object(body, ("text", "translation", "source", "target"), ("text", "translation"))
    for name in ("text", "translation"):
        _check_string(name, data[name], limits)
    if not data["text"].strip():
        raise ApiError(422, "'text' must not be empty")
    return AttentionRequest(
        data["text"], data["translation"], data.get("source"), data.get("target")
    )


def _check_string(name: str, value: Any, limits: ServerLimits) -> str:
    """One string field, checked as each sentence of ``text`` is (``check_texts``)."""
    if not isinstance(value, str):
        raise ApiError(422, f"'{name}' must be a string, not {type_name(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate such as "\ud800"
        raise ApiError(422, f"'{name}' is not valid Unicode ({e.reason})") from None
    if len(value) > limits.max_chars:
        raise ApiError(
            413, f"'{name}' is too long: {len(value)} characters (at most {limits.max_chars})"
        )
    return value
