"""The subcommand that serves a trained model: ``serve`` (HTTP with dynamic batching).

``transduce serve --model CKPT [--host 127.0.0.1] [--port 8000]`` answers ``POST /translate``
with ``{"text": [...], "beam": 4, "alpha": 0.6}`` -> ``{"translations": [...]}`` and ``GET
/health`` (see ``transduce.serve.server``), the decoding toolbox (``nbest``, ``scores``,
``alignments``, ``sampling``, ``prefix`` on ``/translate``; ``POST /score``; ``POST /attention``:
``transduce.serve.native_api``) and a page to try the model at ``GET /``. Once the socket
listens it prints one line ``transduce: serving MODEL on http://HOST:PORT`` to stdout (with the
real port when ``--port 0``). ``--api-key-file`` makes every path but ``/health`` and the page
ask for a bearer token (the page has a field for it); serving beyond
loopback without one prints a warning.
``--model`` may be given several times, each as ``SOURCE:TARGET=PATH`` (``en:de=en-de.pt``): one
server for several language pairs, chosen by the LibreTranslate API's ``source`` / ``target``
(under ``/libretranslate``, see ``transduce.serve.libretranslate``) and by the native API's
optional ``source`` / ``target`` fields (default: the first model). A checkpoint does not record
its languages, so a lone ``--model PATH`` serves the native API, and the LibreTranslate API only
once its languages are given.
Needs ``pip install 'transduce[serve]'``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys

from transduce.cli.common import (
    GRAPHS,
    add_device,
    add_graphs,
    add_precision,
    refuse_parser,
    require,
)
from transduce.errors import UserError


def _positive(name: str, value: float, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        kind = "non-negative" if allow_zero else "positive"
        raise UserError(f"{name} must be {kind}; got {value}")


_LOOPBACK = ("127.0.0.1", "localhost", "::1")

# SOURCE:TARGET=PATH (language codes as ``transduce.serve.models.LANGUAGE_CODE``)
_MODEL_SPEC = re.compile(
    r"([A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})*):"
    r"([A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})*)=(.+)"
)


def _model_specs(values: list[str]) -> list[tuple[str | None, str | None, str]]:
    """``--model`` values -> (source, target, path); UserError for a second model without
    languages or a pair given twice."""
    specs: list[tuple[str | None, str | None, str]] = []
    for value in values:
        m = _MODEL_SPEC.fullmatch(value)
        specs.append((m[1], m[2], m[3]) if m else (None, None, value))
    if len(specs) > 1:
        bare = [path for source, _, path in specs if source is None]
        if bare:
            raise UserError(
                f"with several --model, give each its languages as "
                f"--model SOURCE:TARGET=PATH (en:de=en-de.pt); {bare[0]} has none"
            )
    pairs = [(s.lower(), t.lower()) for s, t, _ in specs if s is not None and t is not None]
    for pair in pairs:
        if pairs.count(pair) > 1:
            raise UserError(f"--model: two models translate {pair[0]} into {pair[1]}")
    return specs


def _cmd_serve(args: argparse.Namespace) -> int:
    require(("fastapi", "uvicorn"), "serve", "transduce serve")
    import torch

    from transduce.inference.translator import Translator
    from transduce.serve.dynamic_batching import MAX_BATCH_WAIT_MS, BatchingConfig
    from transduce.serve.server import ApiKey, ServedModel, ServerLimits, create_app, serve

    specs = _model_specs(args.model)
    _positive("--max-batch-sentences", args.max_batch_sentences)
    _positive("--batch-wait-ms", args.batch_wait_ms, allow_zero=True)
    if args.batch_wait_ms > MAX_BATCH_WAIT_MS:
        raise UserError(
            f"--batch-wait-ms must be at most {MAX_BATCH_WAIT_MS:g}; got {args.batch_wait_ms:g}"
        )
    numbers = (
        "max_sentences",
        "max_chars",
        "max_request_chars",
        "max_body_bytes",
        "max_beam",
        "max_queue",
        "max_connections",
        "max_body_buffer",
        "header_timeout",
        "body_timeout",
    )
    for name in numbers:
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    if args.max_body_buffer < args.max_body_bytes:
        raise UserError(
            f"--max-body-buffer ({args.max_body_buffer}) must be at least "
            f"--max-body-bytes ({args.max_body_bytes})"
        )
    if args.max_request_chars < args.max_chars:
        raise UserError(
            f"--max-request-chars ({args.max_request_chars}) must be at least "
            f"--max-chars ({args.max_chars}): a sentence at --max-chars could never be sent"
        )
    api_key = None if args.api_key_file is None else ApiKey.from_file(args.api_key_file)
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be between 0 and 65535; got {args.port}")
    if args.threads is not None:
        _positive("--threads", args.threads)
        most = 4 * (os.cpu_count() or 1)  # more only slows down (and thousands exhaust memory)
        if args.threads > most:
            raise UserError(
                f"--threads must be at most {most} (4 per CPU core); got {args.threads}"
            )
        torch.set_num_threads(args.threads)
    limits = ServerLimits(
        max_body_bytes=args.max_body_bytes,
        max_sentences=args.max_sentences,
        max_chars=args.max_chars,
        max_request_chars=args.max_request_chars,
        max_beam=args.max_beam,
        max_queue_sentences=args.max_queue,
        max_connections=args.max_connections,
        max_body_buffer=args.max_body_buffer,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
    )
    batching = BatchingConfig(
        max_batch_sentences=args.max_batch_sentences, batch_wait_ms=args.batch_wait_ms
    )
    models = []
    graphs = GRAPHS[args.graphs]
    for source, target, path in specs:
        translator = Translator.load(path, device=args.device, weights=args.weights, graphs=graphs)
        refuse_parser(translator.cfg.task.name, path, "serve")
        models.append(ServedModel(translator, source, target, name=path))
    app = create_app(models, limits=limits, batching=batching, api_key=api_key)
    if api_key is None and args.host not in _LOOPBACK:
        print(
            f"transduce: warning: serving on {args.host} without --api-key-file: anyone who "
            "can reach it can use it",
            file=sys.stderr,
        )

    def listening(host: str, port: int) -> None:
        shown = f"[{host}]" if ":" in host else host
        names = ", ".join(path if s is None else f"{path} ({s}->{t})" for s, t, path in specs)
        print(f"transduce: serving {names} on http://{shown}:{port}", flush=True)

    try:
        serve(app, args.host, args.port, log_level=args.log_level, on_listening=listening)
    except OSError as e:
        raise UserError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e})") from None
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over HTTP (POST /translate, GET /health) with dynamic batching",
        description="Serve trained models over HTTP: POST /translate with "
        '{"text": [...], "beam": 4, "alpha": 0.6} returns {"translations": [...]}; GET /health '
        "returns status, model and counters; POST /translate also takes nbest, scores, "
        "alignments, sampling and prefix, POST /score scores sentence pairs, POST /attention "
        "gives one pair's attention; GET / is a page to try the model in a browser; the "
        "LibreTranslate API answers under /libretranslate (/translate, /languages, /detect). "
        "Concurrent requests are batched together.",
    )
    p.add_argument(
        "--model",
        required=True,
        action="append",
        metavar="[SRC:TGT=]PATH",
        help="checkpoint file or run folder, with its languages (en:de=PATH) for the "
        "LibreTranslate API; repeat it to serve several language pairs (each then with its "
        "languages; the native API's default is the first)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 = any free port)")
    add_device(p)
    add_precision(p)
    add_graphs(p)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--max-batch-sentences",
        type=int,
        default=64,
        metavar="N",
        help="sentences per batch of requests (default: 64; 1 = one request at a time)",
    )
    p.add_argument(
        "--batch-wait-ms",
        type=float,
        default=5.0,
        metavar="M",
        help="how long a batch waits for more requests after its first (default: 5; 0 = only "
        "take what is already waiting)",
    )
    p.add_argument(
        "--max-sentences",
        type=int,
        default=256,
        metavar="N",
        help="sentences per request (default: 256)",
    )
    p.add_argument(
        "--max-chars",
        type=int,
        default=2000,
        metavar="N",
        help="characters per sentence (default: 2000)",
    )
    p.add_argument(
        "--max-request-chars",
        type=int,
        default=100_000,
        metavar="N",
        help="characters per request, all its sentences (default: 100000): bounds how long one "
        "request holds the decoder",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=1_000_000,
        metavar="N",
        help="request body size (default: 1000000)",
    )
    p.add_argument(
        "--max-beam",
        type=int,
        default=16,
        metavar="N",
        help="largest beam a request may ask for (default: 16)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=8192,
        metavar="N",
        help="sentences waiting before requests get 503 (default: 8192)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=2048,
        metavar="N",
        help="open connections before requests get 503 (default: 2048)",
    )
    p.add_argument(
        "--max-body-buffer",
        type=int,
        default=64_000_000,
        metavar="N",
        help="bytes of request bodies held at once, all connections together, before "
        "requests get 503 (default: 64000000)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds a connection has to send a request's headers, else it is "
        "closed (default: 10)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a request has to send its body, else 408 (default: 30)",
    )
    p.add_argument(
        "--api-key-file",
        default=None,
        metavar="PATH",
        help="a file holding one token: every path but /health and the page (/) then needs "
        "'Authorization: Bearer TOKEN', and the LibreTranslate API (but its "
        "/languages) the token as api_key (use it beyond localhost)",
    )
    p.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    p.set_defaults(func=_cmd_serve)
