"""What the translation server accepts of a request: its limits (``ServerLimits``), reading the
body under a deadline, a size limit and a shared memory budget (``read_body``), parsing ``POST
/translate`` (``parse_translate_request``), translating on a model's batcher while noticing that
a client went away (``translate_on``). ``transduce.serve.server`` puts them together.

Every refusal is an ``ApiError``, answered as JSON ``{"error": MESSAGE, "status": CODE}`` (by the
LibreTranslate API as ``{"error": MESSAGE}``). A
refusal answered before the body was read closes the connection (``Connection: close``): the
client may still be sending, and draining a 100 MB body, or a body trickled a byte a second, to
keep the connection open would be the work the refusal means to avoid.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect, Request

from transduce.config import DecodeConfig
from transduce.errors import UserError
from transduce.serve.dynamic_batching import DynamicBatcher, ServerBusy, ShuttingDown
from transduce.serve.work import Work

__all__ = [
    "ApiError",
    "BodyBudget",
    "ClientGone",
    "OPTION_FIELDS",
    "ServerLimits",
    "TranslateRequest",
    "answer_unless_gone",
    "check_alpha",
    "check_beam",
    "check_integer",
    "check_language",
    "chars_over",
    "check_texts",
    "is_json_type",
    "mime_type",
    "load_json",
    "parse_translate_request",
    "read_body",
    "read_parsed",
    "require_json",
    "served_decode",
    "translate_on",
    "type_name",
    "wait_for_disconnect",
]

CLOSE = {"Connection": "close"}  # headers of a refusal answered before the body was read
T = TypeVar("T")
SHUTTING_DOWN = "the server is shutting down: this request was not translated; try again later"


@dataclass(frozen=True)
class ServerLimits:
    """Per-request and per-server limits; a request over one gets a 4xx/5xx error naming it.

    The server's memory is bounded by the model, ``max_body_buffer`` (request bodies being read,
    all connections together), ``max_queue_sentences`` sentences of at most ``max_chars``
    characters, and ``max_connections`` connections, each buffering little: an unfinished head
    over 16 KiB is refused (h11), and asyncio reads 256 KiB at a time. ``header_timeout_s`` and
    ``body_timeout_s`` bound how long a slow client holds a connection."""

    max_body_bytes: int = 1_000_000
    max_sentences: int = 256  # sentences per request
    max_chars: int = 2_000  # characters per sentence
    # characters per request, all its sentences: what one request may make the decoder do
    # (256 sentences of 2,000 characters held it for minutes, every other request waiting)
    max_request_chars: int = 100_000
    # characters of the LibreTranslate API's ``format: html`` texts per request, checked before
    # parsing: Python's HTML parser takes time quadratic in malformed markup (0.5 s at 5,000)
    max_html_chars: int = 5_000
    max_beam: int = 16
    max_alpha: float = 10.0
    max_queue_sentences: int = 8_192  # sentences waiting before new requests get 503
    max_body_buffer: int = 64_000_000  # bytes of bodies held at once before new ones get 503
    max_connections: int = 2_048  # open connections before new requests get 503
    header_timeout_s: float = 10.0  # from connecting (or the last answer) to a request's headers
    body_timeout_s: float = 30.0  # from the headers to the body's last byte, else 408

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be positive; got {value}")
        if self.max_body_buffer < self.max_body_bytes:
            raise ValueError(
                f"max_body_buffer ({self.max_body_buffer}) must be at least max_body_bytes "
                f"({self.max_body_bytes}), or a body at the limit could never be read"
            )
        if self.max_request_chars < self.max_chars:
            raise ValueError(
                f"max_request_chars ({self.max_request_chars}) must be at least max_chars "
                f"({self.max_chars}), or a sentence at the limit could never be sent"
            )


def served_decode(translator: Any, limits: ServerLimits, **settings: Any) -> DecodeConfig:
    """The model's decoding settings with a request's (``translator.decode_config``), the
    model's beam capped at ``limits.max_beam`` where the request gives none (every API decodes
    within the server's limit); a UserError as the translator raises it. A model whose config
    samples searches where the request gives a beam, and else samples with a seed of its own."""
    model = getattr(translator, "cfg", None)
    default = None if model is None or model.decode.sampling else model.decode.beam
    if settings.get("beam") is None and default is not None and default > limits.max_beam:
        settings["beam"] = limits.max_beam  # (not for a model that samples: a beam searches)
    decode: DecodeConfig = translator.decode_config(**settings)  # a beam asked: a search
    if decode.sampling:  # a model whose config samples, no beam asked:
        # each request a draw of its own (the seed is answered where the API can say it)
        return replace(decode, sampling_seed=secrets.randbelow(2**32))
    return decode


class ApiError(Exception):
    """An error answered as JSON ``{"error": message, "status": status}``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def mime_type(content_type: str) -> str:
    """A Content-Type header's media type, lower-cased, its parameters (``charset``) left out."""
    return content_type.split(";")[0].strip().lower()


def is_json_type(content_type: str) -> bool:
    """Whether a Content-Type header names JSON (``application/json``, ``application/*+json``,
    parameters such as ``charset`` aside)."""
    mime = mime_type(content_type)
    return mime == "application/json" or (
        mime.startswith("application/") and mime.endswith("+json")
    )


def require_json(request: Request) -> None:
    """ApiError 415 unless the request declares a JSON body. A web page may POST text/plain,
    a form or a typeless body to any address without asking it first (a CORS "simple
    request"); a JSON body needs the server's consent, which the native API never gives, so no
    page the server's users visit can make the native API decode."""
    content_type = request.headers.get("content-type")
    if content_type is None or not is_json_type(content_type):
        got = "none" if content_type is None else repr(content_type)
        raise ApiError(
            415, f"the body must be sent as Content-Type: application/json (got {got})", CLOSE
        )


class ClientGone(Exception):
    """The client disconnected: nobody reads an answer."""


# -- the body ----------------------------------------------------------------------------------


class BodyBudget:
    """Bytes of request bodies held at once, over all connections, at most ``limit``: a thousand
    clients each sending a body just under ``max_body_bytes`` must not take a gigabyte. Used on
    the event loop's thread only (no lock)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> None:
        """Count ``n`` more bytes held, or raise ApiError 503 when over the limit."""
        if self.used + n > self.limit:
            raise ApiError(
                503,
                f"the server is busy reading other requests ({self.used} bytes held); "
                "try again later",
                {"Retry-After": "1", **CLOSE},
            )
        self.used += n

    def give_back(self, n: int) -> None:
        self.used -= n


async def read_parsed(
    request: Request,
    limits: ServerLimits,
    budget: BodyBudget,
    parse: Callable[[bytes], Awaitable[T]],
) -> T:
    """``parse`` of the request body (read as ``read_body`` reads it), the body's bytes counted
    in ``budget`` until ``parse`` returns: a request keeps what parsing gave while it waits for
    its translation, never its body, so ``max_body_buffer`` bounds the bodies held."""
    body = await read_body(request, limits, budget)
    try:
        return await parse(body)
    finally:
        budget.give_back(len(body))


async def read_body(request: Request, limits: ServerLimits, budget: BodyBudget) -> bytes:
    """The request body, its bytes taken from ``budget`` (the caller gives them back once it
    has parsed it: ``read_parsed``), or ApiError: 413 once it is known to exceed
    ``max_body_bytes`` (from Content-Length alone when that declares over 8 times the limit),
    408 when it takes over ``body_timeout_s``, 503 when ``budget`` is spent; ClientGone if the
    client disconnects.

    A body a few times over the limit is read to its end before answering, so the client gets
    the 413 rather than a connection reset while it is still sending."""
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise ApiError(400, f"invalid Content-Length {declared!r}", CLOSE) from None
        if n > 8 * limit:
            raise ApiError(413, f"the body is too large: {n} bytes (at most {limit})", CLOSE)
    chunks: list[bytes] = []  # the bytes kept, all counted in ``budget``
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            size = await _read_chunks(request, limit, budget, chunks)
        if size > limit:
            raise ApiError(413, f"the body is too large: {size}+ bytes (at most {limit})", CLOSE)
    except TimeoutError:
        budget.give_back(sum(map(len, chunks)))
        raise ApiError(
            408, f"the body took over {limits.body_timeout_s:g} s to arrive", CLOSE
        ) from None
    except ClientDisconnect:
        budget.give_back(sum(map(len, chunks)))
        raise ClientGone from None
    except BaseException:  # a 413, a 503 from the budget, a cancellation: nothing is parsed
        budget.give_back(sum(map(len, chunks)))
        raise
    return b"".join(chunks)


async def _read_chunks(
    request: Request, limit: int, budget: BodyBudget, chunks: list[bytes]
) -> int:
    """Bytes seen; the first ``limit`` are appended to ``chunks`` (taken from ``budget``), the
    rest, up to 8 times the limit, read and dropped."""
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            budget.take(len(chunk))
            chunks.append(chunk)
        elif size > 8 * limit:
            break
    return size


async def wait_for_disconnect(request: Request) -> None:
    """Return once the client disconnects; call it after the body has been read."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def answer_unless_gone(request: Request, future: asyncio.Future) -> Any:
    """The result of ``future``, or ClientGone once the client disconnects first; then (or if
    this handler is cancelled) the future is cancelled, which withdraws the request."""
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        await asyncio.wait((future, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not future.done():
            future.cancel()
    if future.cancelled():
        raise ClientGone
    return future.result()


async def translate_on(
    request: Request,
    batcher: DynamicBatcher,
    sentences: list[Any],
    decode: DecodeConfig,
    nbest: int = 1,
    work: Work | None = None,
) -> list[Any]:
    """``sentences`` translated by ``batcher`` with ``decode`` (with ``nbest`` over 1, a list of
    up to that many translations for each, best first; with ``work``, what it asks:
    ``serve.work``), or ApiError: 503 when the queue is full (with Retry-After) or the server
    is shutting down, 422 for input the model cannot take (``UserError`` from the translator:
    longer than its learned positions reach), 500 when decoding fails; ClientGone when the
    client disconnects first."""
    try:
        future = batcher.submit(sentences, decode, nbest, work=work)
    except ServerBusy as e:
        raise ApiError(503, str(e), {"Retry-After": "1"}) from None
    except ShuttingDown:
        raise ApiError(503, SHUTTING_DOWN) from None
    try:
        out: list[Any] = await answer_unless_gone(request, future)
    except ShuttingDown:  # queued still when the worker stopped: no failure of decoding
        raise ApiError(503, SHUTTING_DOWN) from None
    except UserError as e:  # input this model cannot take: the client's to change
        raise ApiError(422, str(e)) from None
    except ClientGone:
        raise
    except Exception as e:  # noqa: BLE001 - a decoding failure is this request's 500
        # the traceback to the server's log; to the client its kind alone (a message may hold
        # paths, shapes or memory figures of the server)
        incident = secrets.token_hex(4)
        logging.getLogger("uvicorn.error").error(
            "translation failed (incident %s)", incident, exc_info=e
        )
        raise ApiError(
            500, f"translation failed: {type(e).__name__} (incident {incident} in the server's log)"
        ) from None
    return out


# -- POST /translate ---------------------------------------------------------------------------

# the decoding toolbox's fields, kept as given here and checked by ``serve.options``
OPTION_FIELDS = ("nbest", "scores", "alignments", "sampling", "prefix")
_FIELDS = ("text", "beam", "alpha", "source", "target", *OPTION_FIELDS)


@dataclass(frozen=True)
class TranslateRequest:
    """A parsed ``POST /translate``: the sentences, the decoding settings asked for (None: the
    model's) and the language pair asked for (None: the server's first model); ``options``
    the toolbox's fields that were given (``OPTION_FIELDS``), unchecked: ``serve.options``."""

    sentences: list[str]
    beam: int | None = None
    alpha: float | None = None
    source: str | None = None
    target: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


_TYPE_NAMES = {
    type(None): "null",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
}


def type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json(body: bytes) -> Any:
    """The JSON value of ``body``, or ApiError 400 (not UTF-8, not JSON, nested too deeply)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not UTF-8 (byte {e.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:  # JSONDecodeError and the constants NaN / Infinity
        raise ApiError(400, f"the body is not valid JSON: {e}") from None
    except RecursionError:  # [[[[...]]]] deeper than the interpreter's recursion limit
        raise ApiError(400, "the body is not valid JSON: nested too deeply") from None


def parse_translate_request(body: bytes, limits: ServerLimits) -> TranslateRequest:
    """The body of ``POST /translate``; raises ApiError (400, 413 or 422) with a message naming
    the problem. ``source`` and ``target`` go together (a server of several models picks by
    them)."""
    data = load_json(body)
    if not isinstance(data, dict):
        raise ApiError(422, f"the body must be a JSON object, not {type_name(data)}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ApiError(422, f"unknown field {unknown[0]!r}; the fields are {', '.join(_FIELDS)}")
    if "text" not in data:
        raise ApiError(422, "missing field 'text' (a list of sentences)")
    text = check_texts(data["text"], limits)
    source, target = (check_language(data, name) for name in ("source", "target"))
    if (source is None) != (target is None):
        raise ApiError(422, "'source' and 'target' are given together or not at all")
    beam, alpha = check_beam(data.get("beam"), limits), check_alpha(data.get("alpha"), limits)
    options = {name: data[name] for name in OPTION_FIELDS if name in data}
    return TranslateRequest(text, beam, alpha, source, target, options)


def check_language(data: dict[str, Any], name: str) -> str | None:
    code = data.get(name)
    if code is not None and not isinstance(code, str):
        raise ApiError(422, f"'{name}' must be a language code, not {type_name(code)}")
    return code


def check_texts(text: Any, limits: ServerLimits, name: str = "text") -> list[str]:
    """``text`` if it is a list of at most ``max_sentences`` strings of at most ``max_chars``
    characters, else ApiError (422 or 413) naming the field ``name``."""
    if not isinstance(text, list):
        raise ApiError(422, f"'{name}' must be a list of strings, not {type_name(text)}")
    if len(text) > limits.max_sentences:
        raise ApiError(
            413, f"too many sentences: {len(text)} (at most {limits.max_sentences} per request)"
        )
    for i, s in enumerate(text):
        if not isinstance(s, str):
            raise ApiError(422, f"'{name}[{i}]' must be a string, not {type_name(s)}")
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate such as "\ud800"
            raise ApiError(422, f"'{name}[{i}]' is not valid Unicode ({e.reason})") from None
        if len(s) > limits.max_chars:
            raise ApiError(
                413, f"'{name}[{i}]' is too long: {len(s)} characters (at most {limits.max_chars})"
            )
    total = chars_over(text, limits)
    if total is not None:
        raise ApiError(
            413,
            f"'{name}' is too long: {total} characters in all (at most "
            f"{limits.max_request_chars} a request)",
        )
    return text


def chars_over(texts: list[str], limits: ServerLimits) -> int | None:
    """The characters of ``texts`` in all where they are over ``max_request_chars`` (each
    API says so in its own words), else None."""
    total = sum(map(len, texts))
    return total if total > limits.max_request_chars else None


def check_integer(name: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int in [low, high], else ApiError 422 naming ``name``. A number with no
    fraction, such as 4.0, is the integer 4: JSON has one kind of number, and JSON Schema's
    "integer" (what /openapi.json says) admits it."""
    if isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, bool) or not isinstance(value, int):
        what = f"{value:g}" if isinstance(value, float) else type_name(value)
        raise ApiError(422, f"'{name}' must be an integer, not {what}")
    else:
        number = value
    if not low <= number <= high:
        shown = f"{value:g}" if isinstance(value, float) else f"{value}"
        if len(shown) > 40:  # a 400-digit integer is no message
            shown = f"{shown[:20]}... ({len(shown)} digits)"
        raise ApiError(422, f"'{name}' must be between {low} and {high}; got {shown}")
    return number


def check_beam(beam: Any, limits: ServerLimits) -> int | None:
    return None if beam is None else check_integer("beam", beam, 1, limits.max_beam)


def check_alpha(alpha: Any, limits: ServerLimits) -> float | None:
    if alpha is None:
        return None
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ApiError(422, f"'alpha' must be a number, not {type_name(alpha)}")
    if not 0.0 <= alpha <= limits.max_alpha:
        raise ApiError(422, f"'alpha' must be between 0 and {limits.max_alpha:g}; got {alpha}")
    return float(alpha)
