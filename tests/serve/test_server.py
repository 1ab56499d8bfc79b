"""The HTTP server (transduce.serve.server, ``transduce serve``): a real uvicorn server on a
free 127.0.0.1 port, talked to over HTTP with urllib.

The model is an untrained tiny one with a SentencePiece vocabulary (as in test_translator.py):
its translations are meaningless but deterministic, which is all that checking the server
against ``Translator.translate`` needs.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


from inference_testkit import save_toy_translation_model, toy_sentences  # noqa: I001
import torch  # noqa: E402

from transduce.errors import UserError  # noqa: E402
from transduce.serve.dynamic_batching import BatchingConfig, DynamicBatcher  # noqa: E402
from transduce.serve.server import (  # noqa: E402
    ServerLimits,
    ServerThread,
    create_app,
    serve,
)
from transduce.inference.translator import Translator  # noqa: E402

TIMEOUT = 60.0  # seconds, for every HTTP call


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    return save_toy_translation_model(
        tmp_path_factory.mktemp("model") / "model.pt",
        {"max_len_offset": 4, "beam": 3, "alpha": 0.6},
    )


@pytest.fixture(scope="module")
def translator(model_file) -> Translator:
    return Translator.load(model_file)


LIMITS = ServerLimits(max_sentences=20, max_chars=300, max_beam=8, max_body_bytes=100_000)


@pytest.fixture(scope="module")
def server(translator):
    # A wide wait window so that concurrent requests surely meet in one batch.
    app = create_app(
        translator, limits=LIMITS, batching=BatchingConfig(max_batch_sentences=64, batch_wait_ms=50)
    )
    with ServerThread(app) as srv:
        yield srv


def request(url: str, body: bytes | dict | None = None, method: str | None = None):
    """(status, decoded JSON body) of one HTTP call; 4xx/5xx are returned, not raised."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def translate(srv, payload) -> list[str]:
    status, out = request(srv.url + "/translate", payload)
    assert status == 200, out
    return out["translations"]


def test_binds_loopback_only(server) -> None:
    assert server.host == "127.0.0.1" and server.port > 0


def test_health(server, translator) -> None:
    status, out = request(server.url + "/health")
    assert status == 200 and out["status"] == "ok"
    assert out["model"]["vocab_size"] == len(translator.vocab) == 60
    assert out["model"]["d_model"] == 32 and out["model"]["device"] == "cpu"
    assert out["decode"]["beam"] == 3 and out["decode"]["alpha"] == 0.6
    assert out["limits"]["max_sentences"] == 20
    assert {"requests", "sentences", "batches", "max_batch_requests"} <= set(out["stats"])


def test_health_gives_each_vocabulary_and_the_fields_of_its_architecture(tmp_path) -> None:
    from inference_testkit import save_toy_pair_translator

    decode = {"max_len_offset": 4, "beam": 2}
    pair = Translator.load(save_toy_pair_translator(tmp_path / "pair.pt", decode))
    rnn_path = save_toy_translation_model(tmp_path / "rnn.pt", decode, {"architecture": "rnn"})
    rnn = Translator.load(rnn_path)
    models = {}
    for name, translator in (("pair", pair), ("rnn", rnn)):
        with ServerThread(create_app(translator)) as srv:
            status, out = request(srv.url + "/health")
            assert status == 200
            models[name] = out["model"]
    assert models["pair"]["source_vocab_size"] == 60 and models["pair"]["target_vocab_size"] == 45
    assert "vocab_size" not in models["pair"]  # which side's would it be?
    assert models["pair"]["n_heads"] == pair.cfg.model.n_heads
    assert models["rnn"]["architecture"] == "rnn" and models["rnn"]["vocab_size"] == 60
    assert models["rnn"]["input_feeding"] == rnn.cfg.model.input_feeding
    assert models["rnn"]["rnn_attention"] == rnn.cfg.model.rnn_attention
    assert not {"d_ff", "n_heads", "norm", "positional"} & set(models["rnn"])  # unused there


def test_translations_equal_translator(server, translator) -> None:
    sentences = toy_sentences(10, seed=1)
    lines = sentences[:3] + ["", "  "] + sentences[3:]
    assert translate(server, {"text": lines}) == translator.translate(lines)  # model defaults
    for beam, alpha in [(1, None), (2, 1.0), (4, 0.6)]:  # (greedy search refuses an alpha)
        asked = {"text": lines, "beam": beam, **({} if alpha is None else {"alpha": alpha})}
        got = translate(server, asked)
        assert got == translator.translate(lines, translator.decode_config(beam=beam, alpha=alpha))
    assert translate(server, {"text": [], "beam": 2}) == []
    assert translate(server, {"text": sentences[:2], "alpha": 1}) == translator.translate(
        sentences[:2], translator.decode_config(alpha=1.0)
    )
    assert len(set(translator.translate(sentences))) > 1  # the comparison means something


def test_concurrent_requests_are_batched(server, translator) -> None:
    n_clients = 8
    sentences = toy_sentences(3 * n_clients, seed=2)
    payloads = [{"text": sentences[3 * i : 3 * i + 3], "beam": 1 + i % 2} for i in range(n_clients)]
    expected = [
        translator.translate(p["text"], translator.decode_config(beam=p["beam"])) for p in payloads
    ]
    for _ in range(3):  # bounded: batching must show within a few rounds
        results: list = [None] * n_clients
        barrier = threading.Barrier(n_clients, timeout=TIMEOUT)

        def client(i: int) -> None:
            barrier.wait()  # noqa: B023 (the threads end within this round)
            results[i] = request(server.url + "/translate", payloads[i])  # noqa: B023

        threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert not any(t.is_alive() for t in threads)
        assert [r[0] for r in results] == [200] * n_clients
        assert [r[1]["translations"] for r in results] == expected
        stats = request(server.url + "/health")[1]["stats"]
        if stats["max_batch_requests"] > 1:
            break
    assert stats["max_batch_requests"] > 1
    assert stats["batches"] < stats["requests"]


BAD_REQUESTS = [
    (b"{not json", 400, "not valid JSON"),
    (b'{"text": ["a"], "alpha": NaN}', 400, "NaN"),
    (b"\xff\xfe", 400, "UTF-8"),
    (b"", 400, "not valid JSON"),
    (b'["the dog"]', 422, "JSON object"),
    (b'{"beam": 2}', 422, "missing field 'text'"),
    (b'{"text": "the dog"}', 422, "'text' must be a list of strings, not a string"),
    (b'{"text": ["the dog", 3]}', 422, "'text[1]' must be a string, not an integer"),
    (b'{"text": [null]}', 422, "'text[0]' must be a string, not null"),
    (b'{"text": ["ok", "\\ud800"]}', 422, "'text[1]' is not valid Unicode"),
    (b"[" * 50_000 + b"]" * 50_000, 400, "nested too deeply"),
    (b'{"text": ["a"], "beam": 0}', 422, "'beam' must be between 1 and 8"),
    (b'{"text": ["a"], "beam": 9}', 422, "'beam' must be between 1 and 8"),
    (b'{"text": ["a"], "beam": "4"}', 422, "'beam' must be an integer, not a string"),
    (b'{"text": ["a"], "beam": true}', 422, "'beam' must be an integer, not a boolean"),
    (b'{"text": ["a"], "beam": 2.5}', 422, "'beam' must be an integer"),
    (b'{"text": ["a"], "alpha": -1}', 422, "'alpha' must be between 0 and 10"),
    (b'{"text": ["a"], "alpha": "x"}', 422, "'alpha' must be a number"),
    (b'{"text": ["a"], "beams": 2}', 422, "unknown field 'beams'"),
    (json.dumps({"text": ["a"] * 21}).encode(), 413, "too many sentences: 21"),
    (json.dumps({"text": ["a", "b" * 301]}).encode(), 413, "'text[1]' is too long"),
    (json.dumps({"text": ["the dog " * 1000] * 20}).encode(), 413, "body is too large"),
]


@pytest.mark.parametrize(("body", "status", "message"), BAD_REQUESTS)
def test_bad_request_then_good_request(server, translator, body, status, message) -> None:
    got, out = request(server.url + "/translate", body)
    assert got == status, out
    assert out["status"] == status and message in out["error"]
    assert translate(server, {"text": ["the dog runs"]}) == translator.translate(["the dog runs"])


def test_huge_body_is_refused_from_its_length(server) -> None:
    # Content-Length over 8x the limit: answered at once, without reading (or waiting for) it
    conn = http.client.HTTPConnection(server.host, server.port, timeout=TIMEOUT)
    try:
        conn.putrequest("POST", "/translate")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(10**9))
        conn.endheaders()
        resp = conn.getresponse()
        assert resp.status == 413 and "too large" in json.loads(resp.read())["error"]
    finally:
        conn.close()
    assert request(server.url + "/health")[0] == 200


def test_unknown_routes_are_json(server) -> None:
    assert request(server.url + "/nope") == (404, {"error": "Not Found", "status": 404})
    status, out = request(server.url + "/translate", method="GET")
    assert status == 405 and out["status"] == 405


class FlakyTranslator:
    """Fails on any sentence containing 'boom'; can be paused to hold the worker busy."""

    def __init__(self, inner: Translator) -> None:
        self.inner = inner
        self.cfg = inner.cfg
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()

    def decode_config(self, *, beam=None, alpha=None):
        return self.inner.decode_config(beam=beam, alpha=alpha)

    def translate(self, sentences, decode=None):
        self.entered.set()
        assert self.release.wait(TIMEOUT)
        if any("boom" in s for s in sentences):
            raise RuntimeError("decoder exploded")
        if any("toolong" in s for s in sentences):
            raise UserError("sentence 1 has 2000 subword tokens")
        return self.inner.translate(sentences, decode)


def test_decoding_error_is_500_and_server_goes_on(translator) -> None:
    import logging

    flaky = FlakyTranslator(translator)
    app = create_app(flaky, batching=BatchingConfig(batch_wait_ms=50))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    with ServerThread(app) as srv:  # (uvicorn sets its loggers up as it starts)
        logging.getLogger("uvicorn.error").addHandler(handler)
        try:
            status, out = request(srv.url + "/translate", {"text": ["boom"]})
        finally:
            logging.getLogger("uvicorn.error").removeHandler(handler)
    # the client learns the kind and an incident to quote; the message goes to the log
    assert status == 500 and "decoder exploded" not in out["error"]
    assert out["error"].startswith("translation failed: RuntimeError (incident ")
    incident = out["error"].split("incident ")[1].split()[0]
    logged = [r for r in records if incident in r.getMessage()]
    assert logged and logged[0].exc_info and "decoder exploded" in str(logged[0].exc_info[1])
    with ServerThread(app) as srv:
        # a failing request batched with good ones fails alone
        results: dict[str, tuple] = {}
        payloads = {"bad": {"text": ["the boom"]}, "good": {"text": ["the dog", "a cat"]}}

        def send(key: str) -> None:
            results[key] = request(srv.url + "/translate", payloads[key])

        threads = [threading.Thread(target=send, args=(k,)) for k in payloads]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert results["bad"][0] == 500
        expected = translator.translate(["the dog", "a cat"])
        assert results["good"] == (200, {"translations": expected})
        assert translate(srv, {"text": ["the dog"]}) == translator.translate(["the dog"])
        stats = request(srv.url + "/health")[1]["stats"]
        assert stats["failed_requests"] == 2


def test_input_the_model_cannot_take_is_422(translator) -> None:
    app = create_app(FlakyTranslator(translator), batching=BatchingConfig(batch_wait_ms=50))
    with ServerThread(app) as srv:
        status, out = request(srv.url + "/translate", {"text": ["toolong"]})
        assert status == 422
        assert out == {"error": "sentence 1 has 2000 subword tokens", "status": 422}
        assert translate(srv, {"text": ["the dog"]}) == translator.translate(["the dog"])


def test_full_queue_is_503(translator) -> None:
    flaky = FlakyTranslator(translator)
    app = create_app(
        flaky, limits=ServerLimits(max_queue_sentences=3), batching=BatchingConfig(batch_wait_ms=0)
    )
    with ServerThread(app) as srv:
        flaky.release.clear()
        flaky.entered.clear()
        first: dict[str, tuple] = {}

        def send() -> None:
            first["r"] = request(srv.url + "/translate", {"text": ["a", "b"]})

        t = threading.Thread(target=send)
        t.start()
        try:
            assert flaky.entered.wait(TIMEOUT)  # the worker holds 2 sentences
            status, out = request(srv.url + "/translate", {"text": ["c", "d"]})
            assert status == 503 and "busy" in out["error"]
        finally:
            flaky.release.set()
            t.join(TIMEOUT)
        assert first["r"][0] == 200
        assert translate(srv, {"text": ["c", "d"]}) == translator.translate(["c", "d"])


def test_requests_queued_at_shutdown_get_a_503_not_a_500(translator) -> None:
    flaky = FlakyTranslator(translator)
    app = create_app(flaky, batching=BatchingConfig(max_batch_sentences=1, batch_wait_ms=0))
    batcher = app.state.batcher
    with ServerThread(app) as srv:
        flaky.release.clear()
        flaky.entered.clear()
        answers: dict[str, tuple] = {}

        def send(key: str) -> None:
            answers[key] = request(srv.url + "/translate", {"text": [key]})

        clients = [threading.Thread(target=send, args=(key,)) for key in ("held", "queued")]
        try:
            clients[0].start()
            assert flaky.entered.wait(TIMEOUT)  # the worker holds the first
            clients[1].start()
            deadline = time.monotonic() + TIMEOUT
            while batcher.stats()["pending_sentences"] < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            batcher.stop(timeout=0.05)  # as the app's shutdown, once uvicorn stops waiting
            clients[1].join(TIMEOUT)
            after = request(srv.url + "/translate", {"text": ["after"]})
        finally:
            flaky.release.set()
            for client in clients:
                client.join(TIMEOUT)
    shutting = "the server is shutting down: this request was not translated; try again later"
    assert answers["queued"] == (503, {"error": shutting, "status": 503})
    assert after == (503, {"error": shutting, "status": 503})  # none queued after the stop
    assert answers["held"] == (200, {"translations": translator.translate(["held"])})


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_sentences"):
        ServerLimits(max_sentences=0)
    with pytest.raises(ValueError, match="max_queue_sentences"):
        ServerLimits(max_queue_sentences=-1)


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not box:
        raise TimeoutError(f"no output from the server within {timeout} s")
    return box[0]


def test_cli_serve(model_file, translator) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "transduce",
        "serve",
        "--model",
        str(model_file),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--threads",
        "1",
        "--log-level",
        "warning",
        "--batch-wait-ms",
        "2",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = _read_line(proc, TIMEOUT)
        assert line.startswith("transduce: serving "), (line, proc.poll())
        url = line.split(" on ")[-1].strip()
        assert url.startswith("http://127.0.0.1:")
        deadline = time.monotonic() + TIMEOUT
        while True:  # the socket listens before the app has started: wait for /health
            try:
                status, health = request(url + "/health")
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "the server never became healthy"
            time.sleep(0.1)
        assert health["model"]["name"] == str(model_file)
        sentences = toy_sentences(4, seed=5)
        status, out = request(url + "/translate", {"text": sentences, "beam": 2})
        expected = translator.translate(sentences, translator.decode_config(beam=2))
        assert status == 200 and out["translations"] == expected
    finally:
        proc.terminate()
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(TIMEOUT)
    assert proc.returncode == 0  # SIGTERM: a graceful shutdown


def test_cli_serve_bad_options(model_file, capsys) -> None:
    from transduce.cli.main import main

    serve = ["--no-malloc-tuning", "serve", "--model"]
    assert main([*serve, str(model_file), "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err
    assert main([*serve, str(model_file), "--max-batch-sentences", "0"]) == 2
    assert "--max-batch-sentences" in capsys.readouterr().err
    assert main([*serve, "/nonexistent/model.pt", "--port", "0"]) == 2
    assert "not found" in capsys.readouterr().err
    assert main([*serve, str(model_file), "--batch-wait-ms", "nan"]) == 2
    assert "--batch-wait-ms" in capsys.readouterr().err
    assert main([*serve, str(model_file), "--batch-wait-ms", "1e13"]) == 2
    assert "--batch-wait-ms must be at most 60000" in capsys.readouterr().err
    threads = torch.get_num_threads()
    assert main([*serve, str(model_file), "--threads", str(4 * (os.cpu_count() or 1) + 1)]) == 2
    assert "--threads must be at most" in capsys.readouterr().err
    assert torch.get_num_threads() == threads


# serve() with a translator that takes SECONDS a call and answers with the name of the thread
# that decoded
_SERVE_SCRIPT = """
import sys, threading, time
from transduce.config import DecodeConfig
from transduce.serve.server import create_app, serve

class Slow:
    def decode_config(self, *, beam=None, alpha=None):
        return DecodeConfig()

    def translate(self, sentences, decode=None):
        time.sleep(float(sys.argv[1]))
        return [threading.current_thread().name for _ in sentences]

serve(create_app(Slow()), "127.0.0.1", 0, log_level="warning",
      on_listening=lambda host, port: print(f"listening {port}", flush=True))
"""


def test_serve_decodes_on_the_main_thread_and_answers_in_flight_requests_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE_SCRIPT, "1.0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{_read_line(proc, TIMEOUT).split()[-1]}"
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                if request(url + "/health")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "the server never became healthy"
            time.sleep(0.05)
        answers: list = []
        client = threading.Thread(
            target=lambda: answers.append(request(url + "/translate", {"text": ["a"]}))
        )
        client.start()
        time.sleep(0.3)  # the request is being decoded (1 s)
        proc.terminate()
        client.join(TIMEOUT)
        assert answers == [(200, {"translations": ["MainThread"]})]
        assert proc.wait(TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)


def test_serve_raises_at_once_when_the_app_cannot_start() -> None:
    from fastapi import FastAPI

    async def failing_lifespan(app):  # noqa: ANN001, ANN202
        raise RuntimeError("cannot start")
        yield

    app = FastAPI(lifespan=contextlib.asynccontextmanager(failing_lifespan))
    app.state.batcher = DynamicBatcher(translator=None)  # type: ignore[arg-type]
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="stopped while starting"):
        serve(app, "127.0.0.1", 0, log_level="critical")
    assert time.monotonic() - start < 10


def test_serve_refuses_a_thread_that_is_not_the_main_one(translator) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            serve(create_app(translator), "127.0.0.1", 0)
        except RuntimeError as e:
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(TIMEOUT)
    assert len(errors) == 1 and "main thread" in str(errors[0])


def test_a_request_over_max_request_chars_in_all_is_refused(translator) -> None:
    limits = replace(LIMITS, max_request_chars=500)
    from transduce.serve.server import ServedModel

    served = [ServedModel(translator, "en", "de", name="m.pt")]
    with ServerThread(create_app(served, limits=limits)) as srv:
        status, out = request(srv.url + "/translate", {"text": ["the dog runs " * 20] * 3})
        assert status == 413 and "780 characters in all (at most 500 a request)" in out["error"]
        body = {"q": "the dog runs " * 20 + "\n" + "a cat " * 50, "source": "en", "target": "de"}
        status, out = request(srv.url + "/libretranslate/translate", body)
        assert (
            status == 400 and "(560 characters) exceeds text limit (500 a request)" in out["error"]
        )
        assert translate(srv, {"text": ["the dog runs"]}) == translator.translate(["the dog runs"])


def test_an_error_outside_decoding_is_a_500_with_an_incident_and_no_message(translator) -> None:
    class Broken:  # a translator whose settings fail once serving: the catch-all answers
        cfg = translator.cfg
        calls = 0

        def decode_config(self, **settings: object) -> object:
            Broken.calls += 1
            if Broken.calls == 1:  # create_app's, for /health
                return translator.decode_config()
            raise KeyError("/secret/path/of/the/server")

        def translate(self, sentences: object, decode: object = None) -> object:
            raise AssertionError("not reached")

    with ServerThread(create_app(Broken())) as srv:  # type: ignore[arg-type]
        status, out = request(srv.url + "/translate", {"text": ["a"]})
    assert status == 500 and out["error"].startswith("internal error: KeyError (incident ")
    assert "secret" not in out["error"]
