"""An HTTP translation server with dynamic batching (FastAPI + uvicorn; ``pip install
'transduce[serve]'``), behind ``transduce serve``.

Endpoints:

* ``POST /translate`` with ``{"text": ["...", ...], "beam": 4, "alpha": 0.6}`` (``beam`` and
  ``alpha`` optional, defaulting to the checkpoint's ``decode`` section) returns
  ``{"translations": [...]}``, one detokenized translation per input sentence, in order (``""``
  for an empty one): exactly what ``Translator.translate`` returns for the same list.
* ``GET /health`` returns ``{"status": "ok", "model": {...}, "decode": {...}, "limits": {...},
  "batching": {...}, "stats": {...}}``; ``stats`` counts requests, sentences, batches and the
  most requests one batch held.

Dynamic batching (``transduce.inference.dynamic_batching``): concurrent requests wait up to
``batch_wait_ms`` for each other and are translated together, at most ``max_batch_sentences``
sentences a batch.

Errors are JSON ``{"error": MESSAGE, "status": CODE}``: 400 for a body that is not JSON, 413 for
a body over ``max_body_bytes`` or more sentences / characters than the limits allow, 422 for
fields of the wrong type or out of range (unknown fields included) and for a sentence the model
cannot take (``UserError`` from the translator: longer than learned positions reach), 503 when
more sentences wait than ``max_queue_sentences``, 500 when decoding fails. None of them stops
the server, and a request batched with a failing one is answered on its own.

Only ``transduce.inference.translator`` is needed to build the app; fastapi and uvicorn are
imported here, so import this module only when serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from transduce.errors import UserError
from transduce.inference.dynamic_batching import (
    BatchingConfig,
    DynamicBatcher,
    ServerBusy,
    TranslatorLike,
)

__all__ = [
    "ApiError",
    "ServerLimits",
    "ServerThread",
    "bind_socket",
    "create_app",
    "parse_translate_request",
]


@dataclass(frozen=True)
class ServerLimits:
    """Per-request limits; a request over one gets a 4xx error naming it."""

    max_body_bytes: int = 1_000_000
    max_sentences: int = 256  # sentences per request
    max_chars: int = 2_000  # characters per sentence
    max_beam: int = 16
    max_alpha: float = 10.0
    max_queue_sentences: int = 8_192  # sentences waiting before new requests get 503

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"{name} must be positive; got {value}")


class ApiError(Exception):
    """An error answered as JSON ``{"error": message, "status": status}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)


# -- request parsing ---------------------------------------------------------------------------

_FIELDS = ("text", "beam", "alpha")


_TYPE_NAMES = {type(None): "null", bool: "a boolean", int: "an integer", float: "a number",
               str: "a string", list: "a list", dict: "an object"}  # fmt: skip


def _type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def parse_translate_request(
    body: bytes, limits: ServerLimits
) -> tuple[list[str], int | None, float | None]:
    """The body of ``POST /translate`` -> (sentences, beam or None, alpha or None); raises
    ApiError (400, 413 or 422) with a message naming the problem."""
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not UTF-8 (byte {e.start})") from None
    except ValueError as e:  # JSONDecodeError and the constants NaN / Infinity
        raise ApiError(400, f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise ApiError(400, "the body is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(422, f"the body must be a JSON object, not {_type_name(data)}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ApiError(
            422, f"unknown field {unknown[0]!r}; the fields are {', '.join(_FIELDS)}"
        )
    if "text" not in data:
        raise ApiError(422, "missing field 'text' (a list of sentences)")
    text = data["text"]
    if not isinstance(text, list):
        raise ApiError(422, f"'text' must be a list of strings, not {_type_name(text)}")
    if len(text) > limits.max_sentences:
        raise ApiError(
            413, f"too many sentences: {len(text)} (at most {limits.max_sentences} per request)"
        )
    for i, s in enumerate(text):
        if not isinstance(s, str):
            raise ApiError(422, f"'text[{i}]' must be a string, not {_type_name(s)}")
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate such as "\ud800"
            raise ApiError(422, f"'text[{i}]' is not valid Unicode ({e.reason})") from None
        if len(s) > limits.max_chars:
            raise ApiError(
                413, f"'text[{i}]' is too long: {len(s)} characters (at most {limits.max_chars})"
            )
    beam = data.get("beam")
    if beam is not None:
        if isinstance(beam, bool) or not isinstance(beam, int):
            raise ApiError(422, f"'beam' must be an integer, not {_type_name(beam)}")
        if not 1 <= beam <= limits.max_beam:
            raise ApiError(422, f"'beam' must be between 1 and {limits.max_beam}; got {beam}")
    alpha = data.get("alpha")
    if alpha is not None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise ApiError(422, f"'alpha' must be a number, not {_type_name(alpha)}")
        if not 0.0 <= alpha <= limits.max_alpha:
            raise ApiError(
                422, f"'alpha' must be between 0 and {limits.max_alpha:g}; got {alpha}"
            )
        alpha = float(alpha)
    return text, beam, alpha


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, or ApiError 413 once it is known to exceed ``limit`` bytes.

    A body a few times over the limit is read to its end before answering, so the client gets
    the 413 rather than a connection reset while it is still sending."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise ApiError(400, f"invalid Content-Length {declared!r}") from None
        if n > 8 * limit:
            raise ApiError(413, f"the body is too large: {n} bytes (at most {limit})")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        elif size > 8 * limit:
            break
    if size > limit:
        raise ApiError(413, f"the body is too large: {size}+ bytes (at most {limit})")
    return b"".join(chunks)


# -- dynamic batching --------------------------------------------------------------------------


# -- the app -----------------------------------------------------------------------------------


def _model_info(translator: Any) -> dict[str, Any]:
    info: dict[str, Any] = {}
    model = getattr(translator, "model", None)
    if model is not None:
        params = {id(p): p.numel() for p in model.parameters()}
        info["parameters"] = sum(params.values())
    cfg = getattr(translator, "cfg", None)
    if cfg is not None:
        m = cfg.model
        info.update(n_layers=m.n_layers, d_model=m.d_model, d_ff=m.d_ff, n_heads=m.n_heads,
                    norm=m.norm, positional=m.positional)  # fmt: skip
    vocab = getattr(translator, "vocab", None)
    if vocab is not None:
        info["vocab_size"] = len(vocab)
    device = getattr(translator, "device", None)
    if device is not None:
        info["device"] = str(device)
    return info


def _decode_defaults(translator: Any) -> dict[str, Any]:
    cfg = getattr(translator, "cfg", None)
    if cfg is None:
        return {}
    d = cfg.decode
    return {"beam": d.beam, "alpha": d.alpha, "max_len_offset": d.max_len_offset,
            "batch_tokens": d.batch_tokens}  # fmt: skip


def create_app(
    translator: TranslatorLike,
    *,
    limits: ServerLimits = ServerLimits(),
    batching: BatchingConfig = BatchingConfig(),
    model_name: str | None = None,
) -> FastAPI:
    """The FastAPI app serving ``translator``; its batching worker runs while the app does
    (stopped by the app's lifespan, and started by it on a thread of its own unless ``serve``
    runs it on the main thread). ``app.state.batcher`` is the DynamicBatcher."""
    batcher = DynamicBatcher(translator, batching, max_queue_sentences=limits.max_queue_sentences)
    model_info = {"name": model_name, **_model_info(translator)}
    decode_defaults = _decode_defaults(translator)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        batcher.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, batcher.stop)

    app = FastAPI(title="transduce", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.batcher = batcher
    started = time.time()

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc.status, exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        return _error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = batcher.alive
        return JSONResponse(
            {
                "status": "ok" if ok else "stopped",
                "model": model_info,
                "decode": decode_defaults,
                "limits": asdict(limits),
                "batching": asdict(batching),
                "stats": batcher.stats(),
                "uptime_s": round(time.time() - started, 3),
            },
            status_code=200 if ok else 503,
        )

    @app.post("/translate")
    async def translate(request: Request) -> JSONResponse:
        body = await _read_body(request, limits.max_body_bytes)
        sentences, beam, alpha = parse_translate_request(body, limits)
        if not sentences:
            return JSONResponse({"translations": []})
        try:
            future = batcher.submit(sentences, beam, alpha)
        except ServerBusy as e:
            return _error_response(503, str(e), {"Retry-After": "1"})
        try:
            out = await future
        except UserError as e:  # input this model cannot take: the client's to change
            return _error_response(422, str(e))
        except Exception as e:  # noqa: BLE001 - a decoding failure is this request's 500
            return _error_response(500, f"translation failed: {type(e).__name__}: {e}")
        return JSONResponse({"translations": out})

    return app


# -- running it --------------------------------------------------------------------------------


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free port (read it back with
    ``sock.getsockname()[1]``). Raises OSError when the address cannot be used."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"cannot resolve {host!r}")
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_START_TIMEOUT_S = 120.0  # uvicorn's start-up (the app's lifespan) in ``serve``


def uvicorn_server(app: FastAPI, *, log_level: str = "info", access_log: bool = True) -> Any:
    import uvicorn

    config = uvicorn.Config(
        app, log_level=log_level, access_log=access_log, lifespan="on",
        timeout_graceful_shutdown=10,
    )  # fmt: skip
    return uvicorn.Server(config)


class ServerThread:
    """Runs an app with uvicorn in a background thread on (host, port), port 0 = a free port;
    for tests and embedding. Use as a context manager::

        with ServerThread(app) as srv:
            urllib.request.urlopen(srv.url + "/health")

    ``error`` is what ended uvicorn's thread by raising (None otherwise); ``on_exit`` is called
    on that thread when it ends, however it ends.
    """

    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log_level: str = "warning",
        access_log: bool = False,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        self.sock = bind_socket(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = uvicorn_server(app, log_level=log_level, access_log=access_log)
        self.error: BaseException | None = None
        self._on_exit = on_exit
        self._thread = threading.Thread(target=self._run, name="uvicorn", daemon=True)

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as e:  # noqa: BLE001 - kept for the thread that waits on this one
            self.error = e
        finally:
            if self._on_exit is not None:
                self._on_exit()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread stopped while starting") from self.error
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the server did not start within {timeout} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    app: FastAPI,
    host: str,
    port: int,
    *,
    log_level: str = "info",
    on_listening: Callable[[str, int], None] | None = None,
) -> None:
    """Serve ``app`` on (host, port) until SIGINT/SIGTERM; ``on_listening(host, port)`` is called
    once the socket listens (with the real port when ``port`` is 0). Call it on the main thread
    (``ServerThread`` serves from a background one).

    The app's batching worker decodes on the main thread, which loaded the model, and uvicorn runs
    on a thread of its own: decoding on a second thread was slower one request at a time
    (``inference.dynamic_batching``). SIGINT or SIGTERM asks uvicorn to shut down gracefully: it
    stops accepting and waits up to 10 s for the requests in progress (this thread keeps
    translating them); then the worker stops and the requests still queued fail. A second signal
    quits at once. An error that ends uvicorn's thread is raised here."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("serve() decodes on the main thread; call it there (or ServerThread)")
    batcher: DynamicBatcher = app.state.batcher
    batcher.keep_in_caller_thread()
    srv = ServerThread(
        app, host, port, log_level=log_level, access_log=True, on_exit=batcher.request_stop
    )

    def shut_down(signum: int, frame: object) -> None:
        if not srv.server.should_exit:  # only sets a flag: safe wherever the signal lands
            srv.server.should_exit = True
            return
        srv.server.force_exit = True  # the second signal
        raise KeyboardInterrupt

    handlers = {sig: signal.signal(sig, shut_down) for sig in _SIGNALS}
    try:
        if on_listening is not None:
            on_listening(srv.host, srv.port)
        srv.start(timeout=_START_TIMEOUT_S)
        batcher.run()  # until the app's shutdown stops it, or uvicorn's thread ends
    finally:
        srv.stop()
        for sig, handler in handlers.items():
            if handler is not None:  # None: a handler not set from Python, nothing to restore
                signal.signal(sig, handler)
    if srv.error is not None:
        raise srv.error


@contextlib.contextmanager
def running(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[ServerThread]:
    """``with running(app) as srv: ...``: ServerThread started and always stopped."""
    srv = ServerThread(app, host, port)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
