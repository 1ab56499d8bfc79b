"""The server's protections one at a time (transduce.serve.guard, serve.requests):
slow headers and bodies, a declared 100 MB body, deep JSON at the body limit, clients that
disconnect while their request waits or is decoded, the connection and body-memory limits,
uploads cut at shutdown, and the API key. Real uvicorn servers on 127.0.0.1, raw sockets.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from inference_testkit import save_toy_translation_model  # noqa: E402

from transduce.inference.translator import Translator  # noqa: E402
from transduce.serve.dynamic_batching import BatchingConfig  # noqa: E402
from transduce.serve.guard import raise_open_file_limit  # noqa: E402
from transduce.serve.server import ApiKey, ServerLimits, ServerThread, create_app  # noqa: E402

TIMEOUT = 30.0


@pytest.fixture(scope="module")
def translator(tmp_path_factory) -> Translator:
    path = tmp_path_factory.mktemp("model") / "model.pt"
    return Translator.load(save_toy_translation_model(path, {"max_len_offset": 4, "beam": 2}))


class Gated:
    """A translator that records its calls and, while ``gate`` is clear, holds the worker."""

    def __init__(self, inner: Translator) -> None:
        self.inner = inner
        self.calls: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def decode_config(self, *, beam=None, alpha=None):
        return self.inner.decode_config(beam=beam, alpha=alpha)

    def translate(self, sentences, decode=None):
        self.calls.append(list(sentences))
        self.entered.set()
        assert self.gate.wait(TIMEOUT)
        return self.inner.translate(sentences, decode)


# -- raw HTTP ----------------------------------------------------------------------------------


def connect(srv: ServerThread, timeout: float = TIMEOUT) -> socket.socket:
    return socket.create_connection((srv.host, srv.port), timeout=timeout)


def head(method: str, path: str, length: int | None = None, token: str | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    if length is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {length}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one response."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = int(headers.get("content-length", -1))  # none: the body ends with the connection
    while len(body) < length or length < 0:
        chunk = sock.recv(65536)
        if not chunk and length < 0:
            break
        assert chunk
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` within ``seconds`` (whatever it sends first)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


def call(
    srv: ServerThread,
    method: str,
    path: str,
    payload: bytes | None = None,
    token: str | None = None,
) -> tuple[int, dict[str, str], dict]:
    with connect(srv) as sock:
        sock.sendall(
            head(method, path, None if payload is None else len(payload), token) + (payload or b"")
        )
        status, headers, body = read_response(sock)
    return status, headers, json.loads(body)


def stats(srv: ServerThread) -> dict:
    return call(srv, "GET", "/health")[2]["stats"]


def wait_until(check, seconds: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


TRANSLATE_DOG = json.dumps({"text": ["the dog"]}).encode()


def translate_dog(srv: ServerThread) -> tuple[int, dict[str, str], dict]:
    return call(srv, "POST", "/translate", TRANSLATE_DOG)


# -- slow clients ------------------------------------------------------------------------------


def test_idle_and_slow_headers_are_closed_after_the_header_timeout(translator) -> None:
    app = create_app(translator, limits=ServerLimits(header_timeout_s=0.5))
    with ServerThread(app) as srv, connect(srv) as idle, connect(srv) as slow:
        start = time.monotonic()
        request = head("GET", "/health")
        for i in range(len(request) - 2):  # never the final CRLF
            if closed_within(slow, 0.1):
                break
            slow.sendall(request[i : i + 1])
        assert time.monotonic() - start < 5, "trickled headers kept the connection"
        assert closed_within(idle, 5), "an idle connection stayed open"
        assert call(srv, "GET", "/health")[0] == 200


def test_a_trickled_body_gets_408_and_holds_no_decoding(translator) -> None:
    app = create_app(translator, limits=ServerLimits(body_timeout_s=1.0))
    with ServerThread(app) as srv, connect(srv) as slow:
        slow.sendall(head("POST", "/translate", len(TRANSLATE_DOG)))
        start = time.monotonic()
        for i in range(len(TRANSLATE_DOG) - 1):  # a byte every 0.1 s: 2.5 s for the body
            try:
                slow.sendall(TRANSLATE_DOG[i : i + 1])
            except ConnectionError:  # answered and closed
                break
            if i == 3:  # meanwhile others are answered and nothing waits to be decoded
                assert call(srv, "POST", "/translate", TRANSLATE_DOG)[0] == 200
                assert stats(srv)["pending_sentences"] == 0
            time.sleep(0.1)
            if time.monotonic() - start > 1.5:
                break
        slow.settimeout(5)
        status, headers, body = read_response(slow)
        assert status == 408 and "took over 1 s" in json.loads(body)["error"]
        assert headers["connection"] == "close" and closed_within(slow, 5)
        assert 0.9 < time.monotonic() - start < 4


# -- bodies ------------------------------------------------------------------------------------


def test_a_declared_100_mb_body_is_refused_from_its_header(translator) -> None:
    app = create_app(translator, limits=ServerLimits(body_timeout_s=5))  # default body limit
    with ServerThread(app) as srv, connect(srv) as sock:
        start = time.monotonic()
        sock.sendall(head("POST", "/translate", 100_000_000) + b" " * 65536)
        status, headers, body = read_response(sock)
        assert time.monotonic() - start < 2  # not after the body timeout
        assert status == 413 and "100000000 bytes (at most 1000000)" in json.loads(body)["error"]
        assert headers["connection"] == "close" and closed_within(sock, 5)


def test_json_nested_to_the_body_limit_is_400(translator) -> None:
    depth = ServerLimits().max_body_bytes // 2  # 500,000 deep on uvicorn's thread
    with ServerThread(create_app(translator)) as srv:
        status, _, out = call(srv, "POST", "/translate", b"[" * depth + b"]" * depth)
        assert (status, out["error"]) == (400, "the body is not valid JSON: nested too deeply")
        assert call(srv, "POST", "/translate", TRANSLATE_DOG)[0] == 200


def test_bodies_held_at_once_are_limited(translator) -> None:
    limits = ServerLimits(max_body_bytes=100_000, max_body_buffer=150_000, body_timeout_s=20)
    padded = TRANSLATE_DOG + b" " * 89_000  # valid JSON, 89 KB
    with ServerThread(create_app(translator, limits=limits)) as srv:
        holder = connect(srv)
        holder.sendall(head("POST", "/translate", 100_000) + b" " * 90_000)  # held, unfinished

        def refused() -> bool:
            return call(srv, "POST", "/translate", padded)[0] == 503

        assert wait_until(refused, 10), "a second 89 KB body was read beside the held 90 KB"
        status, headers, out = call(srv, "POST", "/translate", padded)
        assert status == 503 and "busy reading" in out["error"] and headers["retry-after"] == "1"
        holder.close()  # its bytes are given back
        assert wait_until(lambda: call(srv, "POST", "/translate", padded)[0] == 200, 10)


def test_requests_waiting_for_translation_hold_no_body(translator) -> None:
    # max_body_buffer bounds the bodies held: a request that waits in the queue keeps its
    # sentences, not its body (six 0.9 MB bodies held 5.4 MB past a 1 MB buffer)
    gated = Gated(translator)
    limits = ServerLimits(max_body_bytes=1_000_000, max_body_buffer=1_000_000)
    padded = TRANSLATE_DOG + b" " * 900_000
    batching = BatchingConfig(max_batch_sentences=1, batch_wait_ms=0)
    answers: list = []
    clients: list[threading.Thread] = []
    with ServerThread(create_app(gated, limits=limits, batching=batching)) as srv:
        gated.gate.clear()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for n in range(1, 7):  # one at a time: each body is read alone
                clients.append(
                    threading.Thread(
                        target=lambda: answers.append(call(srv, "POST", "/translate", padded))
                    )
                )
                clients[-1].start()
                assert wait_until(lambda n=n: stats(srv)["pending_sentences"] == n)
            held = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
            gated.gate.set()
            for client in clients:
                client.join(TIMEOUT)
    assert held < 2_000_000, f"{held} bytes held while 6 requests wait"
    assert [answer[0] for answer in answers] == [200] * 6


def test_a_body_being_parsed_still_counts_in_the_body_buffer(
    translator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the LibreTranslate API parses a body on a worker thread: its bytes stay counted meanwhile
    import transduce.serve.lt_request as lt_request

    parsing, release = threading.Event(), threading.Event()
    real = lt_request._parse_fields

    def held_parse(body: bytes, content_type: str):
        if not parsing.is_set():  # the first body alone is held in its parse
            parsing.set()
            assert release.wait(TIMEOUT)
        return real(body, content_type)

    monkeypatch.setattr(lt_request, "_parse_fields", held_parse)
    limits = ServerLimits(max_body_bytes=100_000, max_body_buffer=150_000)
    padded = json.dumps({"q": "the dog"}).encode() + b" " * 89_000
    path = "/libretranslate/translate"
    with ServerThread(create_app(translator, limits=limits)) as srv:
        first: list = []
        holder = threading.Thread(target=lambda: first.append(call(srv, "POST", path, padded)))
        holder.start()
        try:
            assert parsing.wait(TIMEOUT)
            status, _, out = call(srv, "POST", path, padded)
        finally:
            release.set()
            holder.join(TIMEOUT)
        assert status == 503 and "busy reading" in out["error"]
        assert first[0][0] == 400  # read and parsed (this model was served without languages)
        assert call(srv, "POST", path, padded)[0] == 400  # the bytes were given back


# -- connections -------------------------------------------------------------------------------


def test_connections_over_the_limit_get_503(translator) -> None:
    limits = ServerLimits(max_connections=4, header_timeout_s=30)
    with ServerThread(create_app(translator, limits=limits)) as srv:
        idle = [connect(srv) for _ in range(2)]
        time.sleep(0.2)
        assert call(srv, "GET", "/health")[0] == 200  # 3 connections of 4
        idle += [connect(srv) for _ in range(2)]
        time.sleep(0.2)
        with connect(srv) as sock:
            sock.sendall(head("GET", "/health"))
            assert read_response(sock)[0] == 503
        for sock in idle:
            sock.close()
        assert wait_until(lambda: call(srv, "GET", "/health")[0] == 200, 10)


def test_huge_headers_are_refused(translator) -> None:
    # h11 refuses an unfinished head over 16 KiB (asyncio reads 256 KiB at a time, so a head
    # that arrives whole may be larger: bounded either way)
    with ServerThread(create_app(translator)) as srv, connect(srv) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 65536)  # and no end
        assert read_response(sock)[0] == 400 and closed_within(sock, 5)
        assert call(srv, "GET", "/health")[0] == 200


def test_open_file_limit_is_raised_as_far_as_allowed() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    got = raise_open_file_limit(soft + 1)
    assert got == soft + 1 or (hard != resource.RLIM_INFINITY and got == hard == soft)
    assert raise_open_file_limit(1) == got  # never lowered


# -- clients that go away ----------------------------------------------------------------------


def test_a_client_gone_while_queued_is_withdrawn(translator) -> None:
    gated = Gated(translator)
    limits = ServerLimits(max_queue_sentences=3)
    app = create_app(gated, limits=limits, batching=BatchingConfig(batch_wait_ms=0))
    with ServerThread(app) as srv:
        gated.gate.clear()
        first: list = []
        two = json.dumps({"text": ["a", "b"]}).encode()
        holder = threading.Thread(target=lambda: first.append(call(srv, "POST", "/translate", two)))
        holder.start()
        try:
            assert gated.entered.wait(TIMEOUT)  # the worker holds 2 sentences
            gone = connect(srv)
            body = json.dumps({"text": ["gone away"]}).encode()
            gone.sendall(head("POST", "/translate", len(body)) + body)
            assert wait_until(lambda: stats(srv)["pending_sentences"] == 3)
            gone.close()
            assert wait_until(lambda: stats(srv)["pending_sentences"] == 2, 10), "not withdrawn"
            later: list = []
            t = threading.Thread(target=lambda: later.append(translate_dog(srv)))
            t.start()  # its place in the queue is free: queued, not 503
            assert wait_until(lambda: stats(srv)["pending_sentences"] == 3)
        finally:
            gated.gate.set()
            holder.join(TIMEOUT)
        t.join(TIMEOUT)
        assert first[0][0] == 200 and later[0][0] == 200
        assert ["gone away"] not in gated.calls and all("gone away" not in c for c in gated.calls)
        assert stats(srv)["cancelled_requests"] == 1


def test_a_client_gone_mid_decode_leaves_its_batch_answered(translator) -> None:
    gated = Gated(translator)
    app = create_app(gated, batching=BatchingConfig(batch_wait_ms=300))
    with ServerThread(app) as srv:
        gated.gate.clear()
        kept: list = []
        body = json.dumps({"text": ["a cat"]}).encode()
        t = threading.Thread(target=lambda: kept.append(call(srv, "POST", "/translate", body)))
        t.start()
        gone = connect(srv)
        body_gone = json.dumps({"text": ["the dog runs"]}).encode()
        gone.sendall(head("POST", "/translate", len(body_gone)) + body_gone)
        try:
            assert gated.entered.wait(TIMEOUT)
            assert sorted(gated.calls[0]) == ["a cat", "the dog runs"]  # one batch, being decoded
            gone.close()
            assert wait_until(lambda: stats(srv)["cancelled_requests"] == 1, 10)
        finally:
            gated.gate.set()
        t.join(TIMEOUT)
        assert kept == [(200, kept[0][1], {"translations": translator.translate(["a cat"])})]
        assert stats(srv)["failed_requests"] == 0 and stats(srv)["pending_sentences"] == 0


def test_shutdown_answers_requests_and_drops_uploads_in_progress(translator) -> None:
    gated = Gated(translator)
    srv = ServerThread(create_app(gated, batching=BatchingConfig(batch_wait_ms=0))).start()
    try:
        gated.gate.clear()
        answer: list = []
        t = threading.Thread(target=lambda: answer.append(translate_dog(srv)))
        t.start()
        assert gated.entered.wait(TIMEOUT)
        upload = connect(srv)
        upload.sendall(head("POST", "/translate", 1000) + b'{"text": ')  # and no more
        time.sleep(0.2)
        threading.Timer(0.5, gated.gate.set).start()
        start = time.monotonic()
        srv.stop()
        assert time.monotonic() - start < 5, "shutdown waited for the upload"
        t.join(TIMEOUT)
        assert answer[0][0] == 200 and closed_within(upload, 5)
    finally:
        gated.gate.set()
        srv.stop()


# -- the API key -------------------------------------------------------------------------------

TOKEN = "k3y-0f-the-test"


def test_the_api_key_guards_every_path_but_health(translator) -> None:
    with ServerThread(create_app(translator, api_key=ApiKey(TOKEN))) as srv:
        for token in (None, "wrong", TOKEN + "x", TOKEN[:-1]):
            status, headers, out = call(srv, "POST", "/translate", TRANSLATE_DOG, token)
            assert status == 401 and out["status"] == 401 and "API key" in out["error"]
            assert headers["www-authenticate"].startswith("Bearer")
            assert headers["connection"] == "close"
        assert call(srv, "GET", "/nope")[0] == 401  # the routes are not shown either
        assert call(srv, "POST", "/translate", TRANSLATE_DOG, TOKEN)[0] == 200
        with connect(srv) as sock:  # the scheme is case-insensitive; Basic is not Bearer
            for scheme, want in (("bearer", 200), ("BEARER", 200), ("Basic", 401)):
                auth = f"Authorization: {scheme} {TOKEN}\r\nHost:".encode()
                request = head("POST", "/translate", len(TRANSLATE_DOG)).replace(b"Host:", auth)
                sock.sendall(request + TRANSLATE_DOG)
                assert read_response(sock)[0] == want
        status, _, out = call(srv, "GET", "/health")
        assert (status, out) == (200, {"status": "ok"})
        full = call(srv, "GET", "/health", token=TOKEN)[2]
        assert full["status"] == "ok" and "stats" in full and "model" in full


def test_api_key_files(tmp_path: Path) -> None:
    from transduce.errors import UserError

    (tmp_path / "key").write_text(f"  {TOKEN}\n\n")
    assert ApiKey.from_file(tmp_path / "key").accepts(f"Bearer {TOKEN}".encode())
    for text, message in (
        ("", "is empty"),
        (" \n", "is empty"),
        ("two words", "without spaces"),
        ("caf\u00e9", "printable ASCII"),
    ):
        (tmp_path / "bad").write_text(text)
        with pytest.raises(UserError, match=message):
            ApiKey.from_file(tmp_path / "bad")
    with pytest.raises(UserError, match="cannot read the API key file .*missing"):
        ApiKey.from_file(tmp_path / "missing")


def test_cli_serve_api_key_and_timeout_options(tmp_path: Path, capsys) -> None:
    from transduce.cli.main import main

    model = save_toy_translation_model(tmp_path / "model.pt", {"max_len_offset": 4})
    serve = ["--no-malloc-tuning", "serve", "--model", str(model), "--port", "0"]
    (tmp_path / "empty").write_text("\n")
    assert main([*serve, "--api-key-file", str(tmp_path / "empty")]) == 2
    assert "API key file" in capsys.readouterr().err
    assert main([*serve, "--api-key-file", str(tmp_path / "missing")]) == 2
    assert "cannot read the API key file" in capsys.readouterr().err
    assert main([*serve, "--body-timeout", "0"]) == 2
    assert "--body-timeout" in capsys.readouterr().err
    assert main([*serve, "--max-body-bytes", "2000", "--max-body-buffer", "1000"]) == 2
    assert "--max-body-buffer" in capsys.readouterr().err


def test_cli_serve_warns_beyond_loopback_without_a_key(tmp_path: Path, capsys, monkeypatch) -> None:
    import transduce.serve.server as server_module
    from transduce.cli.main import main

    apps: list = []
    monkeypatch.setattr(server_module, "serve", lambda app, host, port, **kw: apps.append(app))
    model = save_toy_translation_model(tmp_path / "model.pt", {"max_len_offset": 4})
    (tmp_path / "key").write_text(TOKEN)
    serve = [
        "--no-malloc-tuning",
        "serve",
        "--model",
        str(model),
        "--port",
        "0",
        "--header-timeout",
        "3",
        "--body-timeout",
        "4",
        "--max-connections",
        "5",
    ]
    assert main([*serve, "--host", "192.0.2.1"]) == 0  # serve() is replaced: nothing listens
    assert "without --api-key-file" in capsys.readouterr().err
    assert main([*serve, "--host", "192.0.2.1", "--api-key-file", str(tmp_path / "key")]) == 0
    assert main([*serve, "--host", "127.0.0.1"]) == 0
    assert "warning" not in capsys.readouterr().err
    limits = apps[0].state.limits
    assert (limits.header_timeout_s, limits.body_timeout_s, limits.max_connections) == (3, 4, 5)
    assert any(m.cls.__name__ == "RequireApiKey" for m in apps[1].user_middleware)
    assert not any(m.cls.__name__ == "RequireApiKey" for m in apps[2].user_middleware)
