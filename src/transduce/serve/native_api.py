"""The native JSON API's decoding endpoints, each going through its model's dynamic batcher:

* ``POST /translate``: ``{"text": [...], "beam"?, "alpha"?, "source"?, "target"?}`` and the
  toolbox's fields ``nbest``, ``scores``, ``alignments``, ``sampling``, ``prefix``
  (``serve.options``) -> ``{"translations": [...]}`` (and ``nbest`` / ``scores`` /
  ``alignments`` where asked for).
* ``POST /score``: ``{"text": [...], "translation": [...], "alpha"?}`` -> ``{"scores": [{"log_prob",
  "tokens", "per_token", "normalized"}, ...]}``, what ``transduce score`` gives (forced decoding).
* ``POST /attention``: ``{"text": "...", "translation": "..."}`` -> ``{"source": pieces + EOS,
  "target": pieces + EOS, "weights": T x S}``: the last layer's encoder-decoder attention,
  averaged over its heads (a Transformer's; 422 for the rnn).

``source`` and ``target`` pick a model of a server of several (422 when none has them). Each
takes a body sent as ``Content-Type: application/json`` only (415 otherwise:
``requests.require_json``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from transduce.config import DecodeConfig
from transduce.errors import UserError
from transduce.serve.models import NoSuchPair, ServedModels
from transduce.serve.openapi import route_docs
from transduce.serve.options import (
    answer_json,
    parse_attention_request,
    parse_options,
    parse_score_request,
)
from transduce.serve.requests import (
    ApiError,
    BodyBudget,
    ServerLimits,
    parse_translate_request,
    read_parsed,
    require_json,
    served_decode,
    translate_on,
)
from transduce.serve.work import Work

__all__ = ["add_native_api"]

T = TypeVar("T")


async def _read(
    request: Request,
    limits: ServerLimits,
    budget: BodyBudget,
    parse: Callable[[bytes, ServerLimits], T],
) -> T:
    """The JSON body parsed by ``parse``; the body's bytes end here, before any translation."""
    require_json(request)

    async def on_loop(body: bytes) -> T:  # on the event loop: a JSON body within max_body_bytes
        return parse(body, limits)

    return await read_parsed(request, limits, budget, on_loop)


def _pick(models: ServedModels, source: str | None, target: str | None) -> int:
    if source is None or target is None:
        return 0
    try:
        return models.pick(source, target)
    except NoSuchPair as e:
        raise ApiError(422, str(e)) from None


def _decode(translator: Any, limits: ServerLimits, **settings: Any) -> DecodeConfig:
    try:  # the model's settings with the request's: one DecodeConfig from here down
        decode = served_decode(translator, limits, **settings)
    except UserError as e:  # a beam larger than this model's vocabulary
        raise ApiError(422, str(e)) from None
    return decode


def _check_alpha(alpha: float | None, decode: DecodeConfig, nbest: int, scores: bool) -> None:
    """A 422 where ``alpha`` would change nothing (the CLI's ``--alpha`` refusal): it ranks a
    beam's hypotheses or n-best samples and weighs the scores returned, and greedy search or a
    single sample without ``scores`` has none of them."""
    if alpha is None or scores or nbest > 1:
        return
    if decode.sampling:
        raise ApiError(
            422,
            "'alpha' ranks n-best samples ('nbest' 2 or more) or weighs 'scores'; one "
            "sample without them has neither",
        )
    if decode.beam == 1:
        raise ApiError(
            422,
            "'alpha' ranks a beam's hypotheses or weighs 'scores'; greedy search (beam 1) "
            "without them has neither",
        )


def add_native_api(
    app: FastAPI, models: ServedModels, limits: ServerLimits, budget: BodyBudget
) -> None:
    """``POST /translate``, ``/score`` and ``/attention`` on ``app``."""

    @app.post("/translate", **route_docs("/translate", limits))
    async def translate(request: Request) -> JSONResponse:
        asked = await _read(request, limits, budget, parse_translate_request)
        options = parse_options(asked.options, limits, len(asked.sentences))
        index = _pick(models, asked.source, asked.target)
        if options.sampling is not None and asked.beam is not None:  # as the CLI refuses it
            raise ApiError(422, "'beam' goes with search, not 'sampling' (a sample is drawn)")
        translator = models.models[index].translator
        decode = _decode(translator, limits, beam=asked.beam, alpha=asked.alpha)
        try:
            decode = options.decode(decode)
        except UserError as e:  # DecodeConfig's own checks, past those of the fields
            raise ApiError(422, f"'sampling': {e}") from None
        if options.nbest is not None and options.nbest > decode.beam and not decode.sampling:
            raise ApiError(
                422, f"'nbest' ({options.nbest}) must not exceed the beam ({decode.beam})"
            )
        _check_alpha(asked.alpha, decode, options.nbest or 1, options.scores)
        seed = {"seed": decode.sampling_seed} if decode.sampling else {}  # to draw it again
        if not asked.sentences:  # every field checked all the same
            return JSONResponse({**answer_json([], options), **seed})
        items = options.items(asked.sentences)
        work = options.work()
        out = await translate_on(request, models.batchers[index], items, decode, work=work)
        return JSONResponse({**answer_json(out, options), **seed})

    @app.post("/score", **route_docs("/score", limits))
    async def score(request: Request) -> JSONResponse:
        asked = await _read(request, limits, budget, parse_score_request)
        index = _pick(models, asked.source, asked.target)
        if not asked.pairs:
            return JSONResponse({"scores": []})
        decode = _decode(models.models[index].translator, limits, alpha=asked.alpha)
        work = Work(kind="score")
        out = await translate_on(request, models.batchers[index], asked.pairs, decode, work=work)
        return JSONResponse({"scores": [asdict(pair) for pair in out]})

    @app.post("/attention", **route_docs("/attention", limits))
    async def attention(request: Request) -> JSONResponse:
        asked = await _read(request, limits, budget, parse_attention_request)
        index = _pick(models, asked.source, asked.target)
        decode = _decode(models.models[index].translator, limits)
        work = Work(kind="attention")
        items = [(asked.text, asked.translation)]
        (out,) = await translate_on(request, models.batchers[index], items, decode, work=work)
        return JSONResponse(out)
