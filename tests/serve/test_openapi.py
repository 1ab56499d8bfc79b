"""The native API's OpenAPI description (``/openapi.json``, transduce.serve.openapi) against the
live server: schemathesis generates requests from it, valid and invalid, sends them to a real
server on loopback, and checks that none gets a 5xx, that every status code and answer is the
one described. Bounded: a fixed number of examples per operation and a time limit."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from inference_testkit import save_toy_translation_model  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from transduce.inference.translator import Translator  # noqa: E402
from transduce.serve.server import ServerLimits, ServerThread, create_app  # noqa: E402

EXAMPLES = 50  # per operation and mode
TIME_LIMIT_S = 120.0  # all of it; examples past it are not sent
# small limits: generated sentences stay short, so that decoding them is quick
LIMITS = ServerLimits(max_sentences=4, max_chars=40, max_beam=4, max_body_bytes=20_000)
PATHS = ("/translate", "/score", "/attention", "/health")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def rejected(ctx, response, case):  # noqa: ANN001, ANN201 - schemathesis's check signature
    """Invalid data is refused: schemathesis's check, with 413 (over a limit that the schema
    states as maxItems / maxLength) among the refusals."""
    if response.status_code == 413:
        return None
    return negative_data_rejection(ctx, response, case)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    path = save_toy_translation_model(
        tmp_path_factory.mktemp("model") / "model.pt", {"max_len_offset": 4, "beam": 2}
    )
    with ServerThread(create_app(Translator.load(path), limits=LIMITS)) as srv:
        yield srv


def _operations(srv) -> list:
    schema = schemathesis.openapi.from_url(srv.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    chosen = [op for op in operations if op.path in PATHS]
    assert sorted(op.path for op in chosen) == sorted(PATHS)
    return chosen


def test_the_schema_describes_the_new_fields(live) -> None:
    import json
    import urllib.request

    with urllib.request.urlopen(live.url + "/openapi.json", timeout=30) as resp:
        schema = json.loads(resp.read())
    body = schema["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]
    fields = set(body["schema"]["properties"])
    assert {
        "text",
        "beam",
        "alpha",
        "nbest",
        "scores",
        "alignments",
        "sampling",
        "prefix",
    } <= fields
    assert body["schema"]["properties"]["text"]["maxItems"] == LIMITS.max_sentences
    assert {"/score", "/attention"} <= set(schema["paths"])
    assert "/" not in schema["paths"]  # the page is no API


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_live_server_keeps_to_its_schema(live, mode) -> None:
    deadline = time.monotonic() + TIME_LIMIT_S / 2
    checks = CHECKS + ([rejected] if mode == GenerationMode.NEGATIVE else [])
    strategy = st.one_of([op.as_strategy(generation_mode=mode) for op in _operations(live)])
    sent = []

    @settings(
        max_examples=EXAMPLES * len(PATHS),
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def check(case) -> None:
        if time.monotonic() > deadline:
            return
        response = case.call(base_url=live.url, timeout=30)
        case.validate_response(response, checks=checks)
        sent.append(response.status_code)

    check()
    assert len(sent) >= 20, sent  # the time limit left most examples their requests
    if mode == GenerationMode.POSITIVE:
        assert 200 in sent  # valid requests were translated, not only refused


def test_the_schema_states_every_answer_of_health_and_the_json_content_type(live) -> None:
    """/health answers 503 once a batcher stops, and a body not sent as JSON is a 415: both
    stated, with their bodies, so that a client generated from the schema expects them."""
    import json
    import urllib.request

    with urllib.request.urlopen(live.url + "/openapi.json", timeout=30) as resp:
        schema = json.loads(resp.read())
    health = schema["paths"]["/health"]["get"]["responses"]
    assert {"200", "503"} <= set(health)
    status = health["503"]["content"]["application/json"]["schema"]["properties"]["status"]
    assert status["enum"] == ["ok", "stopped"]
    for path in ("/translate", "/score", "/attention"):
        assert "415" in schema["paths"][path]["post"]["responses"]
