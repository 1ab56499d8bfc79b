"""The LibreTranslate API (https://libretranslate.com/docs), served under ``/libretranslate``, so
that apps and libraries that speak it (``libretranslatepy``, ...) work against ``transduce
serve`` unchanged: give them ``http://HOST:PORT/libretranslate/`` as their server's URL.

Why a prefix: the native ``POST /translate`` takes ``{"text": [...]}`` and answers
``{"translations": [...]}``; LibreTranslate's takes ``q`` and answers ``translatedText``. Telling
them apart by their fields would make a typo in either a request of the other kind; clients of
LibreTranslate take a base URL, so a prefix costs them nothing.

* ``POST /libretranslate/translate``: ``q`` (a string, or in JSON a list of strings), ``source``
  (a served source language, or ``auto`` when the target has a single one), ``target``,
  ``format`` (``text``, or ``html``: the text between the tags translated, the markup kept:
  ``serve/html_text.py``; at most ``max_html_chars`` characters a request, markup included,
  refused before they are parsed), ``alternatives`` (how many more translations to
  give, at most the beam less 1: the model's, capped at ``max_beam``), ``api_key``. The body is
  JSON or a form: ``application/x-www-form-urlencoded`` (what ``libretranslatepy`` sends) or
  ``multipart/form-data`` (what LibreTranslate's own web page sends; fields only, no files).
  Answers ``{"translatedText": ...}`` (a string, or a list for a
  list), with ``alternatives`` when asked for and ``detectedLanguage`` for ``auto``. A text of
  several lines is translated line by line (the models translate sentences) and joined back
  with ``\\n``.
* ``GET /libretranslate/languages``: ``[{"code", "name", "targets"}]``, every served language.
  Open without a key, as LibreTranslate's is.
* ``GET /libretranslate/frontend/settings``: what LibreTranslate's web page reads first (the
  character limit ``max_chars``, whether a key is needed, the first served pair as the
  default languages).
* ``GET /libretranslate/health``: ``{"status": "ok"}``, as LibreTranslate answers its container's
  health check. Open without a key.
* ``POST /libretranslate/detect``: no language is detected; with a single served source language,
  it is the answer (``[{"confidence": 100.0, "language": CODE}]``, the only candidate), else 400.

Errors are LibreTranslate's: ``{"error": MESSAGE}`` with 400 for a bad request (a missing field,
an unknown language or pair, a text over the limits, a missing API key), 403 for a wrong API key,
500 when decoding fails; the server's own transport errors keep their codes (408, 413, 503).
With ``--api-key-file``, ``api_key`` in the body (or the query string) is the key
(``Authorization: Bearer`` works too; a wrong one is 403); the body is read, within the server's
limits, before the key in it can be checked. Form fields may also come in the query string (the
query's first, as Flask's ``request.values`` gives them), and raw UTF-8 in a form is taken. Every
answer carries LibreTranslate's CORS headers (``Access-Control-Allow-Origin: *``), and ``OPTIONS``
preflights are answered, so browser apps on other origins can call it. A request's fields are
read by ``serve.lt_request``. Parsing a body (a form, an HTML text's markup) runs on a worker
thread, so that a large one does not hold up the server's other requests. The routes are left
out of ``/openapi.json``: LibreTranslate's own API description is theirs
(https://libretranslate.com/docs).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from transduce.errors import UserError
from transduce.serve import lt_request
from transduce.serve.guard import ApiKey
from transduce.serve.html_text import split_html
from transduce.serve.models import NoSuchPair, ServedModels
from transduce.serve.requests import (
    ApiError,
    BodyBudget,
    ServerLimits,
    chars_over,
    served_decode,
    translate_on,
)

__all__ = ["PREFIX", "add_libretranslate"]

PREFIX = "/libretranslate"

# names shown by /languages (clients show them in their menus); another code is its own name
_NAMES = {
    "ar": "Arabic",
    "cs": "Czech",
    "da": "Danish",
    "de": "German",
    "el": "Greek",
    "en": "English",
    "es": "Spanish",
    "et": "Estonian",
    "fi": "Finnish",
    "fr": "French",
    "hi": "Hindi",
    "hu": "Hungarian",
    "it": "Italian",
    "ja": "Japanese",
    "ko": "Korean",
    "lt": "Lithuanian",
    "lv": "Latvian",
    "nl": "Dutch",
    "pl": "Polish",
    "pt": "Portuguese",
    "ro": "Romanian",
    "ru": "Russian",
    "sv": "Swedish",
    "tr": "Turkish",
    "uk": "Ukrainian",
    "zh": "Chinese",
}

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


# as LibreTranslate's after_request: browser apps on other origins may call it (no
# credentials: the key travels in the request, never in a cookie)
CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "Authorization, Content-Type",
    "Access-Control-Allow-Methods": "GET, POST",
}


def _answer(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(content, status_code=status, headers={**CORS, **(headers or {})})


# LibreTranslate's endpoints this server does not offer, with what LibreTranslate says when they
# are disabled; and the method of each one it offers
_DISABLED = {
    "suggest": "Suggestions are disabled on this server.",
    "translate_file": "Files translation are disabled on this server.",
}
_METHODS = {"translate": "POST", "detect": "POST", "languages": "GET", "frontend/settings": "GET"}


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return _answer({"error": message}, status, headers)


def _lt_error(e: ApiError) -> JSONResponse:
    # input the model cannot take is the request's fault: LibreTranslate says 400 for it
    return _error(400 if e.status == 422 else e.status, e.message, e.headers)


def add_libretranslate(
    app: FastAPI,
    models: ServedModels,
    limits: ServerLimits,
    budget: BodyBudget,
    api_key: ApiKey | None,
) -> None:
    """Add the LibreTranslate endpoints under ``PREFIX`` (see the module docstring)."""

    @app.options(PREFIX + "/{path:path}", include_in_schema=False)
    async def preflight(path: str) -> Response:
        return Response(status_code=204, headers=CORS)

    @app.get(PREFIX + "/frontend/settings", include_in_schema=False)
    async def frontend_settings() -> JSONResponse:
        sources = models.sources()
        source = sources[0] if sources else ""
        targets = models.targets(source) if source else []
        target = targets[0] if targets else ""
        return _answer(
            {
                "charLimit": limits.max_chars,  # (max_request_chars is at least this)
                "frontendTimeout": 500,
                "apiKeys": api_key is not None,
                "keyRequired": api_key is not None,
                "suggestions": False,
                "filesTranslation": False,
                "supportedFilesFormat": [],
                "language": {
                    "source": {"code": source, "name": _NAMES.get(source.lower(), source)},
                    "target": {"code": target, "name": _NAMES.get(target.lower(), target)},
                },
            }
        )

    @app.get(PREFIX + "/health", include_in_schema=False)
    async def health() -> JSONResponse:  # what LibreTranslate's own health checks ask
        return _answer({"status": "ok"})

    @app.get(PREFIX + "/languages", include_in_schema=False)
    async def languages() -> JSONResponse:
        return _answer(
            [
                {
                    "code": code,
                    "name": _NAMES.get(code.lower(), code),
                    "targets": models.targets(code),
                }
                for code in models.languages()
            ]
        )

    @app.post(PREFIX + "/translate", include_in_schema=False)
    async def translate(request: Request) -> JSONResponse:
        try:
            fields = await lt_request.read_fields(request, limits, budget, api_key)
            return _answer(await _translate(request, fields, models, limits))
        except ApiError as e:
            return _lt_error(e)

    @app.post(PREFIX + "/detect", include_in_schema=False)
    async def detect(request: Request) -> JSONResponse:
        try:
            fields = await lt_request.read_fields(request, limits, budget, api_key)
            if not fields.get("q"):
                raise ApiError(400, "Invalid request: missing q parameter")
            sources = models.sources()
            if len(sources) != 1:
                served = ", ".join(sources) or "none (no languages given)"
                raise ApiError(
                    400,
                    "language detection is not supported: this server translates "
                    f"from {served}; name the source language",
                )
            return _answer([{"confidence": 100.0, "language": sources[0]}])
        except ApiError as e:
            return _lt_error(e)

    # last: what no route above takes, in LibreTranslate's error shape with its CORS headers
    @app.api_route(
        PREFIX + "/{path:path}",
        methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
        include_in_schema=False,
    )
    async def elsewhere(path: str) -> JSONResponse:
        if path in _DISABLED:  # as a LibreTranslate server with these off answers them
            return _error(403, _DISABLED[path])
        if path in _METHODS:
            return _error(405, f"Method Not Allowed: {PREFIX}/{path} takes {_METHODS[path]}")
        return _error(404, f"Not Found: {PREFIX}/{path}")


# -- translating -------------------------------------------------------------------------------


def _pick(models: ServedModels, source: str, target: str) -> tuple[int, str, dict | None]:
    """(the model's index, the source language, ``detectedLanguage`` for ``auto`` or None)."""
    if not models.labelled:
        raise ApiError(
            400,
            "this server's model was started without its languages: "
            "transduce serve --model SOURCE:TARGET=PATH",
        )
    detected = None
    if source.lower() == "auto":
        candidates = models.sources(target)
        if len(candidates) != 1:
            raise ApiError(
                400,
                f"cannot detect the source language: name it (the server "
                f"translates into {target} from {', '.join(candidates) or 'none'})",
            )
        source = candidates[0]
        detected = {"confidence": 100.0, "language": source}  # the only candidate
    sources = [s.lower() for s in models.sources()]
    known = [c.lower() for c in models.languages()]
    if source.lower() not in sources:
        raise ApiError(400, f"{source} is not supported")
    if target.lower() not in known:
        raise ApiError(400, f"{target} is not supported")
    try:
        return models.pick(source, target), source, detected
    except NoSuchPair:
        raise ApiError(
            400,
            f"{target} is not available as a target language from {source}; "
            f"served: {', '.join(f'{s}->{t}' for s, t in models.pairs())}",
        ) from None


async def _translate(
    request: Request, fields: dict[str, Any], models: ServedModels, limits: ServerLimits
) -> dict[str, Any]:
    texts, batch = lt_request.texts_of(fields.get("q"))
    source, target = (
        lt_request.text_field(fields, "source"),
        lt_request.text_field(fields, "target"),
    )
    text_format = fields.get("format") or "text"
    if text_format not in ("text", "html"):
        raise ApiError(400, f"{text_format} format is not supported (text or html)")
    if text_format == "html":
        _check_markup(texts, limits)
    n_alternatives = lt_request.alternatives_of(fields)
    index, source, detected = _pick(models, source, target)
    translator, batcher = models.models[index].translator, models.batchers[index]
    try:
        decode = served_decode(translator, limits)
    except UserError as e:
        raise ApiError(400, str(e)) from None
    if n_alternatives and n_alternatives + 1 > decode.beam:
        raise ApiError(
            400,
            f"Invalid request: alternatives parameter must be <= "
            f"{decode.beam - 1} (the beam less 1: the model's, at most --max-beam)",
        )
    joins: list[Callable[[Sequence[str]], str]]
    if text_format == "html":  # the text between the tags, each run a segment
        try:  # off the event loop: a megabyte of markup takes seconds to parse
            documents = await run_in_threadpool(lambda: [split_html(text) for text in texts])
        except ValueError as e:
            raise ApiError(400, f"Invalid request: q is {e}") from None
        lines = [list(d.segments) for d in documents]
        joins = [d.rebuild for d in documents]
    else:
        lines = [_LINE_BREAK.split(text) for text in texts]  # the models translate sentences
        joins = ["\n".join] * len(texts)
    flat = [line for text_lines in lines for line in text_lines]
    _check_limits(flat, limits)
    if n_alternatives:
        out = await translate_on(request, batcher, flat, decode, nbest=n_alternatives + 1)
    else:
        out = [[t] for t in await translate_on(request, batcher, flat, decode)]
    results, alternatives = _regroup(lines, out, joins)
    answer: dict[str, Any] = {"translatedText": results if batch else results[0]}
    if n_alternatives:
        answer["alternatives"] = alternatives if batch else alternatives[0]
    if detected is not None:
        answer["detectedLanguage"] = [detected] * len(texts) if batch else detected
    return answer


def _check_limits(lines: list[str], limits: ServerLimits) -> None:
    if len(lines) > limits.max_sentences:
        raise ApiError(
            400,
            f"Invalid request: request ({len(lines)} lines) exceeds the limit "
            f"({limits.max_sentences} lines)",
        )
    for line in lines:
        if len(line) > limits.max_chars:
            raise ApiError(
                400,
                f"Invalid request: request ({len(line)} characters in a line) "
                f"exceeds text limit ({limits.max_chars})",
            )
    _check_total(lines, limits)


def _check_total(texts: list[str], limits: ServerLimits) -> None:
    total = chars_over(texts, limits)
    if total is not None:
        raise ApiError(
            400,
            f"Invalid request: request ({total} characters) exceeds text limit "
            f"({limits.max_request_chars} a request)",
        )


def _check_markup(texts: list[str], limits: ServerLimits) -> None:
    """HTML texts within the limits before they are parsed: malformed markup takes the parser
    time quadratic in its length (seconds for 20,000 characters), markup and text alike."""
    _check_total(texts, limits)
    total = sum(map(len, texts))
    if total > limits.max_html_chars:
        raise ApiError(
            400,
            f"Invalid request: request ({total} characters of html) exceeds the html limit "
            f"({limits.max_html_chars} a request, markup included)",
        )


def _regroup(
    lines: list[list[str]],
    out: list[list[str]],
    joins: Sequence[Callable[[Sequence[str]], str]],
) -> tuple[list[str], list[list[str]]]:
    """Each text's translation (its lines' best, joined by its ``joins``: lines by line
    breaks, an HTML text's segments into its markup) and its alternatives: the k-th joins each
    line's k-th best (its last where it has fewer), without repeats or the translation."""
    results: list[str] = []
    alternatives: list[list[str]] = []
    start = 0
    for text_lines, join in zip(lines, joins, strict=True):
        hyps = out[start : start + len(text_lines)]
        start += len(text_lines)
        best = join([h[0] for h in hyps])
        alts: list[str] = []
        for k in range(1, max((len(h) for h in hyps), default=1)):
            alt = join([h[min(k, len(h) - 1)] for h in hyps])
            if alt != best and alt not in alts:
                alts.append(alt)
        results.append(best)
        alternatives.append(alts)
    return results, alternatives
