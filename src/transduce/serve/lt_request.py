"""Reading a LibreTranslate request (``transduce.serve.libretranslate``): its fields from a JSON
body, a URL-encoded form or a multipart form (the query string's first, as Flask's
``request.values`` gives them), parsed off the event loop; its API key checked as
LibreTranslate checks it; ``q``, ``source``, ``target`` and ``alternatives`` read from them. Every
refusal is an ``ApiError`` with LibreTranslate's status and message."""

from __future__ import annotations

import urllib.parse
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException

from transduce.serve.guard import ApiKey, authorization_header
from transduce.serve.requests import (
    ApiError,
    BodyBudget,
    ServerLimits,
    is_json_type,
    load_json,
    mime_type,
    read_parsed,
)

__all__ = ["FIELDS", "alternatives_of", "read_fields", "text_field", "texts_of"]

FIELDS = ("q", "source", "target", "format", "alternatives", "api_key")  # what the API reads


async def read_fields(
    request: Request, limits: ServerLimits, budget: BodyBudget, api_key: ApiKey | None
) -> dict[str, Any]:
    """The request's fields (a JSON object or a form) that LibreTranslate reads (``FIELDS``:
    the others' values are not kept while the request waits), its API key checked."""
    content_type = request.headers.get("content-type", "")

    async def parse(body: bytes) -> dict[str, Any]:
        if mime_type(content_type) == "multipart/form-data":
            return await _multipart_fields(request, body)
        # off the event loop: a megabyte of form or JSON takes a while to parse
        return await run_in_threadpool(_parse_fields, body, content_type)

    fields = await read_parsed(request, limits, budget, parse)
    if not is_json_type(content_type):
        # Flask's request.values, as LibreTranslate reads a form: the query string first
        query = _form_pairs(request.scope.get("query_string", b""), "query string")
        fields = {**fields, **query}
    fields = {name: fields[name] for name in FIELDS if name in fields}
    if api_key is not None:
        _check_key(api_key, fields.get("api_key"), authorization_header(request.scope))
    return fields


def _parse_fields(body: bytes, content_type: str) -> dict[str, Any]:
    """A JSON body (``application/json`` or ``*+json``) as it is; any other but multipart as a
    URL-encoded form, the first value of each field kept (as LibreTranslate's Flask
    ``request.values`` does)."""
    if is_json_type(content_type):
        data = load_json(body)
        if not isinstance(data, dict):
            raise ApiError(400, "Invalid JSON format: the body must be a JSON object")
        return data
    return _form_pairs(body, "form")


async def _multipart_fields(request: Request, body: bytes) -> dict[str, Any]:
    """A ``multipart/form-data`` ``body`` (already read within the limits) as fields, the first
    value of each kept; a file part is a 400 (no endpoint here takes files)."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, receive).form(max_files=0, max_fields=1_000)
    except AssertionError:  # Starlette's word for python-multipart being absent
        raise ApiError(
            400,
            "multipart/form-data needs python-multipart on the server (pip install "
            "'transduce[serve]'); send JSON or application/x-www-form-urlencoded",
        ) from None
    except (MultiPartException, StarletteHTTPException, ValueError) as e:
        # (Starlette turns its MultiPartException into a 400 HTTPException inside an app)
        detail = getattr(e, "message", None) or getattr(e, "detail", None) or str(e)
        raise ApiError(400, f"the multipart form cannot be read: {detail}") from None
    fields: dict[str, Any] = {}
    for name, value in form.multi_items():
        if not isinstance(value, str):  # cannot happen with max_files=0; kept as a guard
            raise ApiError(400, f"Invalid request: {name} is a file; no endpoint here takes files")
        fields.setdefault(name, value)
    return fields


def _form_pairs(data: bytes, what: str) -> dict[str, Any]:
    """URL-encoded ``data`` as fields, the first value of each kept; raw UTF-8 is taken as
    well as percent-escapes (as Werkzeug's form parser does: curl's ``-d`` sends it raw)."""
    try:
        pairs = urllib.parse.parse_qsl(
            data.decode("utf-8"), keep_blank_values=True, encoding="utf-8", errors="strict"
        )
    except (UnicodeDecodeError, ValueError) as e:
        raise ApiError(400, f"the {what} is not valid URL-encoded UTF-8: {e}") from None
    fields: dict[str, Any] = {}
    for name, value in pairs:
        fields.setdefault(name, value)
    return fields


def _check_key(key: ApiKey, given: Any, authorization: bytes | None) -> None:
    """LibreTranslate's answers: no key is 400, a wrong one 403."""
    if given is None or given == "":
        if key.accepts(authorization):
            return
        if authorization is not None:  # a key was sent, in the header: a wrong one
            raise ApiError(403, "Invalid API key")
        raise ApiError(400, "this server needs an API key: send api_key (ask its operator)")
    if not isinstance(given, str) or not key.matches(given):
        raise ApiError(403, "Invalid API key")


def text_field(fields: dict[str, Any], name: str) -> str:
    value = fields.get(name)
    if value is None or value == "":
        raise ApiError(400, f"Invalid request: missing {name} parameter")
    if not isinstance(value, str):
        raise ApiError(400, f"Invalid request: {name} must be a string")
    return value


def texts_of(q: Any) -> tuple[list[str], bool]:
    """(the texts of ``q``, whether ``q`` was a list); ApiError 400 unless strings."""
    if q is None or q == "" or q == []:
        raise ApiError(400, "Invalid request: missing q parameter")
    batch = isinstance(q, list)
    texts = q if batch else [q]
    for text in texts:
        if not isinstance(text, str):
            raise ApiError(400, "Invalid request: q must be a string or a list of strings")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate such as "\ud800" in JSON
            raise ApiError(400, f"Invalid request: q is not valid Unicode ({e.reason})") from None
    return texts, batch


def alternatives_of(fields: dict[str, Any]) -> int:
    value = fields.get("alternatives", 0)
    if isinstance(value, float) and value.is_integer():  # JSON's 2.0: int() takes it there too
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ApiError(400, "Invalid request: alternatives parameter is not a number")
    try:
        return max(0, int(value))
    except ValueError:
        raise ApiError(400, "Invalid request: alternatives parameter is not a number") from None
