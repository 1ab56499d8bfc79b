"""The OpenAPI description of the native JSON API (``/translate``, ``/score``, ``/attention``,
``/health``): request bodies and answers as JSON Schema, with the server's limits in them, so
that a client generated from ``/openapi.json`` (or a property-based tester such as schemathesis)
sends what the server takes. The handlers read raw bodies (their own checks and error
messages), so FastAPI cannot infer any of this; ``route_docs`` gives each route its part.
"""

from __future__ import annotations

from typing import Any

from transduce.serve.options import MAX_SEED, MAX_TEMPERATURE, MAX_TOP_K, MIN_TEMPERATURE
from transduce.serve.requests import ServerLimits

__all__ = ["health_docs", "route_docs"]

_ERROR = {
    "type": "object",
    "required": ["error", "status"],
    "properties": {"error": {"type": "string"}, "status": {"type": "integer"}},
}
_ERRORS = {
    "400": "the body is not UTF-8 or not JSON",
    "401": "the API key is missing or wrong (with --api-key-file)",
    "408": "the body took too long to arrive",
    "413": "the body, or its sentences or characters, over the limits",
    "415": "the body not sent as Content-Type: application/json",
    "422": "a field of the wrong type or out of range, named in the message",
    "500": "decoding failed",
    "503": "the server is busy; try again later",
}
_NUMBER = {"type": "number"}
_LANGUAGE = {"type": "string", "description": "a served language code; with the other one"}


def _texts(limits: ServerLimits, description: str) -> dict[str, Any]:
    return {
        "type": "array",
        "maxItems": limits.max_sentences,
        "items": {"type": "string", "maxLength": limits.max_chars},
        "description": description,
    }


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or null: the server takes an optional field's null as its absence."""
    return {**schema, "type": [schema["type"], "null"]}


def _body(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A JSON object body of ``properties``, those not ``required`` nullable, no others."""
    schema = {
        "type": "object",
        "properties": {
            name: prop if name in required else _nullable(prop) for name, prop in properties.items()
        },
        "required": required,
        "additionalProperties": False,
    }
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _answers(ok: dict[str, Any], errors: tuple[str, ...] = tuple(_ERRORS)) -> dict[str, Any]:
    out: dict[str, Any] = {
        "200": {"description": "OK", "content": {"application/json": {"schema": ok}}}
    }
    for code in errors:
        out[code] = {
            "description": _ERRORS[code],
            "content": {"application/json": {"schema": _ERROR}},
        }
    return out


def _translate(limits: ServerLimits) -> dict[str, Any]:
    sampling = {
        "type": "object",
        "additionalProperties": False,
        "description": "sample instead of searching; decoded alone, reproducible for a seed",
        "properties": {
            name: _nullable(prop)
            for name, prop in {
                "seed": {"type": "integer", "minimum": 0, "maximum": MAX_SEED},
                "temperature": {
                    "type": "number",
                    "minimum": MIN_TEMPERATURE,
                    "maximum": MAX_TEMPERATURE,
                },
                "top_k": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_K},
                "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            }.items()
        },
    }
    request = _body(
        {
            "text": _texts(limits, "the sentences to translate"),
            "beam": {"type": "integer", "minimum": 1, "maximum": limits.max_beam},
            "alpha": {"type": "number", "minimum": 0, "maximum": limits.max_alpha},
            "source": _LANGUAGE,
            "target": _LANGUAGE,
            "nbest": {
                "type": "integer",
                "minimum": 1,
                "maximum": limits.max_beam,
                "description": "this many translations per sentence (at most the beam)",
            },
            "scores": {"type": "boolean"},
            "alignments": {"type": "boolean"},
            "sampling": sampling,
            "prefix": _texts(limits, "per sentence, the text its translation starts with"),
        },
        ["text"],
    )
    hyp = {
        "type": "object",
        "required": ["translation", "score", "log_prob"],
        "properties": {"translation": {"type": "string"}, "score": _NUMBER, "log_prob": _NUMBER},
    }
    score = {
        "type": "object",
        "required": ["score", "log_prob"],
        "properties": {"score": _NUMBER, "log_prob": _NUMBER},
    }
    ok = {
        "type": "object",
        "required": ["translations"],
        "properties": {
            "translations": {"type": "array", "items": {"type": "string"}},
            "nbest": {"type": "array", "items": {"type": "array", "items": hyp}},
            "scores": {"type": "array", "items": score},
            "alignments": {"type": "array", "items": {"type": "string"}},
            "seed": {
                "type": "integer",
                "description": "where the answer was sampled: the seed of its draws (give it "
                "in 'sampling' to draw them again)",
            },
        },
    }
    return {"openapi_extra": {"requestBody": request}, "responses": _answers(ok)}


def _score(limits: ServerLimits) -> dict[str, Any]:
    request = _body(
        {
            "text": _texts(limits, "the sentences"),
            "translation": _texts(limits, "one translation per sentence"),
            "alpha": {"type": "number", "minimum": 0, "maximum": limits.max_alpha},
            "source": _LANGUAGE,
            "target": _LANGUAGE,
        },
        ["text", "translation"],
    )
    pair = {
        "type": "object",
        "required": ["log_prob", "tokens", "per_token", "normalized"],
        "properties": {
            "log_prob": _NUMBER,
            "tokens": {"type": "integer"},
            "per_token": _NUMBER,
            "normalized": _NUMBER,
        },
    }
    ok = {
        "type": "object",
        "required": ["scores"],
        "properties": {"scores": {"type": "array", "items": pair}},
    }
    return {"openapi_extra": {"requestBody": request}, "responses": _answers(ok)}


def _attention(limits: ServerLimits) -> dict[str, Any]:
    text = {"type": "string", "maxLength": limits.max_chars}
    request = _body(
        {"text": text, "translation": text, "source": _LANGUAGE, "target": _LANGUAGE},
        ["text", "translation"],
    )
    pieces = {"type": "array", "items": {"type": "string"}}
    ok = {
        "type": "object",
        "required": ["source", "target", "weights"],
        "properties": {
            "source": pieces,
            "target": pieces,
            "weights": {"type": "array", "items": {"type": "array", "items": _NUMBER}},
        },
    }
    return {"openapi_extra": {"requestBody": request}, "responses": _answers(ok)}


def health_docs() -> dict[str, Any]:
    """Keyword arguments for ``app.get("/health")``: 200 while every model's batcher runs, 503
    with ``"status": "stopped"`` once one has stopped; the model, decoding settings, limits
    and statistics besides for a caller with the API key (or when the server has none)."""
    status = {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string", "enum": ["ok", "stopped"]}},
    }
    return {
        "responses": {
            "200": {"description": "serving", "content": {"application/json": {"schema": status}}},
            "503": {
                "description": "a model's batcher has stopped: the server no longer translates",
                "content": {"application/json": {"schema": status}},
            },
        }
    }


def route_docs(path: str, limits: ServerLimits) -> dict[str, Any]:
    """Keyword arguments for ``app.post(path, ...)``: the body's schema and the answers'."""
    return {"/translate": _translate, "/score": _score, "/attention": _attention}[path](limits)
