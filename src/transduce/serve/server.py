"""An HTTP translation server with dynamic batching (FastAPI + uvicorn; ``pip install
'transduce[serve]'``), behind ``transduce serve``.

Endpoints:

* ``POST /translate`` with ``{"text": ["...", ...], "beam": 4, "alpha": 0.6}`` (``beam`` and
  ``alpha`` optional, defaulting to the checkpoint's ``decode`` section) returns
  ``{"translations": [...]}``, one detokenized translation per input sentence, in order (``""``
  for an empty one): exactly what ``Translator.translate`` returns for the same list. A server
  of several models translates with the first unless ``"source"`` and ``"target"`` name another
  one's languages (422 when none has them). The decoding toolbox's optional fields (``nbest``,
  ``scores``, ``alignments``, ``sampling``, ``prefix``), ``POST /score`` (forced decoding) and
  ``POST /attention`` (one sentence's encoder-decoder attention) are ``serve.native_api``'s;
  ``/openapi.json`` describes them (``serve.openapi``).
* ``GET /`` a page to try the model in a browser (``serve.page``).
* ``GET /health`` returns ``{"status": "ok", "model": {...}, "decode": {...}, "limits": {...},
  "batching": {...}, "stats": {...}}``; ``stats`` counts requests, sentences, batches and the
  most requests one batch held. With an API key, a request without it gets ``{"status": ...}``
  only: load balancers need no key, the details do. ``model`` and ``stats`` are the first
  model's; ``models`` lists each model's name, languages and stats.
* The LibreTranslate API under ``/libretranslate`` (``transduce.serve.libretranslate``), with
  LibreTranslate's error shape ``{"error": MESSAGE}``.

Dynamic batching (``transduce.serve.dynamic_batching``): concurrent requests wait up to
``batch_wait_ms`` for each other and are translated together, at most ``max_batch_sentences``
sentences a batch; each model has a batcher of its own.

Errors are JSON ``{"error": MESSAGE, "status": CODE}``: 400 for a body that is not UTF-8 or not
JSON (nested too deeply included), 401 without the API key when one is set, 408 for a body slower
than ``body_timeout_s``, 413 for a body over ``max_body_bytes`` (from Content-Length alone when
it declares over 8 times that) or more sentences / characters than the limits allow, 422 for
fields of the wrong type or out of range (unknown fields included) and for a sentence the model
cannot take (``UserError`` from the translator: longer than learned positions reach), 503 when
more sentences wait than ``max_queue_sentences`` or more body bytes are held than
``max_body_buffer`` or when the server shuts down before translating a request, 500 when
decoding fails. None of them stops the server, and a request
batched with a failing one is answered on its own. Over ``max_connections`` open connections,
uvicorn answers 503 (plain text); a connection that sends no complete headers within
``header_timeout_s`` is closed (``serve.guard``). A client that disconnects while its request
waits or is decoded withdraws it: it is not decoded, or its result is dropped.

Only ``transduce.inference.translator`` is needed to build the app; fastapi and uvicorn are
imported here, so import this module only when serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from transduce.data.vocab import vocab_sizes
from transduce.serve.dynamic_batching import BatchingConfig, DynamicBatcher, TranslatorLike
from transduce.serve.guard import (
    ApiKey,
    MergeSlashes,
    RequireApiKey,
    authorization_header,
    guarded_h11,
    open_files_for,
)
from transduce.serve.libretranslate import PREFIX as LIBRETRANSLATE_PREFIX
from transduce.serve.libretranslate import add_libretranslate
from transduce.serve.models import ServedModel, ServedModels
from transduce.serve.native_api import add_native_api
from transduce.serve.openapi import health_docs
from transduce.serve.page import add_page
from transduce.serve.requests import (
    ApiError,
    BodyBudget,
    ClientGone,
    ServerLimits,
    parse_translate_request,
    served_decode,
)

__all__ = [
    "ApiError",
    "ApiKey",
    "ServedModel",
    "ServerLimits",
    "ServerThread",
    "bind_socket",
    "create_app",
    "parse_translate_request",
]


def _error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)


# -- the app -----------------------------------------------------------------------------------


# the model keys /health shows that one architecture alone reads (the others: both)
_ARCHITECTURE_INFO = {
    "transformer": ("d_ff", "n_heads", "norm", "positional"),
    "rnn": ("rnn_attention", "input_feeding"),
}


def _model_info(translator: Any) -> dict[str, Any]:
    info: dict[str, Any] = {}
    model = getattr(translator, "model", None)
    if model is not None:
        params = {id(p): p.numel() for p in model.parameters()}
        info["parameters"] = sum(params.values())
    cfg = getattr(translator, "cfg", None)
    if cfg is not None:
        m = cfg.model
        info.update(
            architecture=m.architecture,  # the page draws attention of a Transformer only
            n_layers=m.n_layers,
            d_model=m.d_model,
            **{key: getattr(m, key) for key in _ARCHITECTURE_INFO.get(m.architecture, ())},
        )
    vocab = getattr(translator, "vocab", None)
    if vocab is not None:
        info.update(_vocab_info(vocab))
    device = getattr(translator, "device", None)
    if device is not None:
        info["device"] = str(device)
    return info


def _vocab_info(vocab: Any) -> dict[str, int]:
    """``vocab_size`` of a shared vocabulary, else each side's: the target's alone misled."""
    source, target = vocab_sizes(vocab)
    if target is None:
        return {"vocab_size": source}
    return {"source_vocab_size": source, "target_vocab_size": target}


def _decode_defaults(translator: Any, limits: ServerLimits) -> dict[str, Any]:
    """What a request that asks for nothing is decoded with (the model's beam capped by
    ``max_beam``, as ``served_decode`` caps it; a model that samples: its sampling settings)."""
    if getattr(translator, "cfg", None) is None:
        return {}
    d = served_decode(translator, limits)
    drawn = {"sampling": True, "temperature": d.temperature, "top_k": d.top_k, "top_p": d.top_p}
    return {
        "beam": d.beam,  # a model that samples searches with it where a request gives a beam
        "alpha": d.alpha,
        "max_len_offset": d.max_len_offset,
        "batch_tokens": d.batch_tokens,
        **(drawn if d.sampling else {}),  # (a seed of each request's own)
    }


def create_app(
    translator: TranslatorLike | Sequence[ServedModel],
    *,
    limits: ServerLimits = ServerLimits(),
    batching: BatchingConfig = BatchingConfig(),
    model_name: str | None = None,
    api_key: ApiKey | None = None,
) -> FastAPI:
    """The FastAPI app serving ``translator``, or several models (``ServedModel``s, each with
    its languages; the first is the native API's default). Each model's batching worker runs
    while the app does (stopped by the app's lifespan, and started by it on a thread of its own
    unless ``serve`` runs the first model's on the main thread). ``app.state.batcher`` is the
    first model's DynamicBatcher, ``app.state.models`` the ServedModels, ``app.state.limits``
    the limits (``uvicorn_server`` reads the connection ones). With ``api_key``, every path but
    ``/health`` and the page (``/``) needs ``Authorization: Bearer <key>``, and the
    LibreTranslate API its ``api_key`` field."""
    if isinstance(translator, Sequence):
        served = list(translator)
    else:
        served = [ServedModel(translator, name=model_name)]
    batchers = [
        DynamicBatcher(m.translator, batching, max_queue_sentences=limits.max_queue_sentences)
        for m in served
    ]
    models = ServedModels(served, batchers)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        for batcher in batchers:
            batcher.start()
        try:
            yield
        finally:
            loop = asyncio.get_running_loop()
            for batcher in batchers:
                await loop.run_in_executor(None, batcher.stop)

    app = FastAPI(title="transduce", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.batcher = batchers[0]
    app.state.models = models
    app.state.limits = limits
    _add_error_handlers(app)
    first = served[0]
    details = {
        "model": {"name": first.name, **_model_info(first.translator)},
        "decode": _decode_defaults(first.translator, limits),
        "limits": asdict(limits),
        "batching": asdict(batching),
    }
    _add_health(app, models, details, api_key)
    budget = BodyBudget(limits.max_body_buffer)
    add_native_api(app, models, limits, budget)
    add_page(app)
    add_libretranslate(app, models, limits, budget, api_key)
    if api_key is not None:
        app.add_middleware(
            RequireApiKey,
            key=api_key,
            open_paths=("/health", "/"),  # the page holds no secret; it asks for the key
            open_prefixes=(LIBRETRANSLATE_PREFIX + "/",),
        )
    app.add_middleware(MergeSlashes)  # added last: outermost
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc.status, exc.message, exc.headers)

    @app.exception_handler(ClientGone)
    async def _client_gone(request: Request, exc: ClientGone) -> JSONResponse:
        return _error_response(400, "the client disconnected")  # read by nobody; not logged

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        # the kind and an incident to the client; the traceback is in the log next to this
        # line (Starlette raises the error on to uvicorn, which logs it)
        incident = secrets.token_hex(4)
        logging.getLogger("uvicorn.error").error(
            "internal error (incident %s): %s", incident, type(exc).__name__
        )
        message = f"internal error: {type(exc).__name__} (incident {incident} in the server's log)"
        return _error_response(500, message)


def _add_health(
    app: FastAPI, models: ServedModels, details: dict[str, Any], api_key: ApiKey | None
) -> None:
    started = time.time()

    @app.get("/health", **health_docs())
    async def health(request: Request) -> JSONResponse:
        ok = all(batcher.alive for batcher in models.batchers)
        out: dict[str, Any] = {"status": "ok" if ok else "stopped"}
        if api_key is None or api_key.accepts(authorization_header(request.scope)):
            each = [
                {"name": m.name, "source": m.source, "target": m.target, "stats": b.stats()}
                for m, b in zip(models.models, models.batchers)
            ]
            out.update(
                details,
                stats=each[0]["stats"],
                models=each,
                uptime_s=round(time.time() - started, 3),
            )
        return JSONResponse(out, status_code=200 if ok else 503)


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
    """A uvicorn server for ``app`` with the connection limits of ``app.state.limits``: at most
    ``max_connections`` (more get 503), ``header_timeout_s`` to send headers (``guarded_h11``),
    an unfinished head over 16 KiB refused (h11's default, made explicit), 5 s idle between
    keep-alive requests."""
    import uvicorn

    limits = getattr(app.state, "limits", ServerLimits())
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=access_log,
        lifespan="on",
        timeout_graceful_shutdown=10,
        http=guarded_h11(limits.header_timeout_s),
        limit_concurrency=limits.max_connections,
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=16 * 1024,
    )
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
    (``serve.dynamic_batching``). With several models, the first model's worker is that one; the
    others' decode on threads of their own. SIGINT or SIGTERM asks uvicorn to shut down
    gracefully: it
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
    open_files_for(getattr(app.state, "limits", ServerLimits()).max_connections)

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
