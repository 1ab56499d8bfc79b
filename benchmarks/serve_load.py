"""Load test of ``transduce serve``: dynamic batching against one request at a time.

    python benchmarks/serve_load.py --model runs/m30k/model.pt [--clients 16 --requests 20]
    python benchmarks/serve_load.py --quick        # a random demo model, a few requests
    python benchmarks/serve_load.py --abuse [--connections 1000 --abuse-seconds 60]

Starts the server twice on 127.0.0.1 (a free port, its own process, ``--threads`` torch
threads): once with dynamic batching (``--max-batch-sentences``, ``--batch-wait-ms``) and once
with batching off (``--max-batch-sentences 1 --batch-wait-ms 0``). Each time, ``--clients``
threads (one keep-alive connection each) send ``--requests`` requests of ``--sentences``
sentences one after another, as fast as answers come back, after a short warm-up. Sentences come
from ``--input`` (one per line) or are generated from a small word list. Prints, per server,
requests/s, sentences/s, p50/p95/p99 latency, failed requests and the mean requests per batch
(from ``/health``), and ends with one JSON line (``throughput_gain`` = batched requests/s over
unbatched; ``p50_ratio`` / ``p95_ratio`` = batched latency over unbatched).

Bounded: every request has a timeout, each run stops sending after ``--max-seconds``, and the
server processes are always stopped.

``--abuse`` instead serves once (batching on, the default queue limit, an API key) and puts it
under abusive load (``benchmarks/serve_abuse.py``): ``--connections`` abusive connections beside
``--clients`` well-behaved ones, then a SIGTERM with ``--in-flight`` requests in flight. It
raises this process's open-file limit (the server inherits it) and prints latencies of the
well-behaved clients alone and beside the abuse, /health under abuse, the server's memory, what
each kind of abuse got, and the requests answered at shutdown, then one JSON line.

Without ``--model`` a random model (d_model 256, 3 layers, a SentencePiece vocabulary learned on
the generated sentences, outputs capped at source + 10 tokens) is written to a temporary folder:
its translations are noise, but it costs what a real model of that size costs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

WORDS = (
    "the a an dog cat man woman child runs sits stands walks on in under near red blue green "
    "big small old young park street house garden ball bike car and with while looks at "
    "plays holds eats reads water tree"
).split()


def generated_sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16))) for _ in range(n)]


def demo_checkpoint(folder: Path, quick: bool) -> Path:
    """A random model with a SentencePiece vocabulary, saved as a checkpoint."""
    import torch

    from transduce import checkpoint
    from transduce.config import from_dict
    from transduce.data.subword import train_sentencepiece
    from transduce.model.transformer import make_model

    vocab = train_sentencepiece(generated_sentences(2000, seed=1), 200, hard_vocab_limit=False)
    model_cfg = (
        {"n_layers": 1, "d_model": 64, "d_ff": 128, "n_heads": 2, "d_k": 32, "d_v": 32}
        if quick
        else {"n_layers": 3, "d_model": 256, "d_ff": 1024, "n_heads": 4, "d_k": 64, "d_v": 64}
    )
    cfg = from_dict({"model": model_cfg, "decode": {"max_len_offset": 10}})
    torch.manual_seed(0)
    model = make_model(cfg.model, src_vocab_size=len(vocab))
    path = folder / "demo.pt"
    checkpoint.save(
        {"config": cfg.to_dict(), "vocab": vocab.to_dict(), "model": model.state_dict()}, path
    )
    return path


class Server:
    """``transduce serve`` in a subprocess on 127.0.0.1, a free port."""

    def __init__(
        self,
        model: str,
        threads: int,
        max_batch: int,
        wait_ms: float,
        timeout: float,
        extra: tuple[str, ...] = (),
        token: str | None = None,
    ) -> None:
        self.log = tempfile.TemporaryFile("w+")
        self.token = token
        cmd = [
            sys.executable,
            "-m",
            "transduce",
            "serve",
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--threads",
            str(threads),
            "--log-level",
            "warning",
            "--max-batch-sentences",
            str(max_batch),
            "--batch-wait-ms",
            str(wait_ms),
            "--max-queue",
            "1000000",
            *extra,
        ]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env
        )
        try:
            line = self._first_line(timeout)
            if not line.startswith("transduce: serving "):
                raise RuntimeError(f"the server did not start: {line!r}\n{self.stderr()}")
            hostport = line.rsplit("http://", 1)[1].strip()
            self.host, port = hostport.rsplit(":", 1)
            self.port = int(port)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    if self.get("/health")["status"] == "ok":
                        break
                except (OSError, http.client.HTTPException, ValueError):
                    pass
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"the server never became healthy\n{self.stderr()}")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

    def _first_line(self, timeout: float) -> str:
        box: list[str] = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not box:
            raise RuntimeError(f"no answer from the server within {timeout} s\n{self.stderr()}")
        return box[0]

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read()[-2000:]

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path: str) -> dict:
        conn = self.connection(10)
        try:
            auth = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            conn.request("GET", path, headers=auth)
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.log.close()


def post(conn: http.client.HTTPConnection, payload: dict) -> tuple[int, dict]:
    body = json.dumps(payload).encode()
    conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def load_run(server: Server, args: argparse.Namespace, pool: list[str]) -> dict[str, Any]:
    payload_extra = {} if args.beam is None else {"beam": args.beam}
    conn = server.connection(args.request_timeout)
    try:  # warm-up
        for i in range(3):
            post(conn, {"text": pool[i : i + args.sentences], **payload_extra})
    finally:
        conn.close()
    before = server.get("/health")["stats"]
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    start_barrier = threading.Barrier(args.clients + 1, timeout=args.request_timeout)
    stop_at: list[float] = []

    def client(c: int) -> None:
        rng = random.Random(c)
        conn = server.connection(args.request_timeout)
        start_barrier.wait()
        try:
            for _ in range(args.requests):
                if time.monotonic() > stop_at[0]:
                    break
                k = rng.randrange(len(pool) - args.sentences)
                t0 = time.perf_counter()
                try:
                    status, out = post(
                        conn, {"text": pool[k : k + args.sentences], **payload_extra}
                    )
                except (OSError, http.client.HTTPException) as e:
                    with lock:
                        failures.append(f"{type(e).__name__}: {e}")
                    conn.close()
                    conn = server.connection(args.request_timeout)
                    continue
                elapsed = time.perf_counter() - t0
                with lock:
                    if status == 200 and len(out["translations"]) == args.sentences:
                        latencies.append(elapsed)
                    else:
                        failures.append(f"{status}: {out}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(args.clients)]
    for t in threads:
        t.start()
    stop_at.append(time.monotonic() + args.max_seconds)
    start_barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(args.max_seconds + args.request_timeout + 10)
    seconds = time.perf_counter() - t0
    after = server.get("/health")["stats"]
    batches = after["batches"] - before["batches"]
    requests_in_batches = after["requests"] - before["requests"]
    n = len(latencies)
    return {
        "requests": n,
        "failed": len(failures),
        "failures_sample": failures[:3],
        "seconds": seconds,
        "requests_per_s": n / seconds,
        "sentences_per_s": n * args.sentences / seconds,
        "p50_ms": 1000 * percentile(latencies, 50) if n else None,
        "p95_ms": 1000 * percentile(latencies, 95) if n else None,
        "p99_ms": 1000 * percentile(latencies, 99) if n else None,
        "mean_ms": 1000 * statistics.fmean(latencies) if n else None,
        "batches": batches,
        "requests_per_batch": requests_in_batches / batches if batches else None,
        "max_batch_requests": after["max_batch_requests"],
    }


def _round(v: Any) -> Any:
    return float(f"{v:.4g}") if isinstance(v, float) else v


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint (default: a random demo model)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=20, help="requests per client")
    parser.add_argument("--sentences", type=int, default=1, help="sentences per request")
    parser.add_argument("--beam", type=int, default=None, help="default: the model's")
    parser.add_argument("--input", default=None, help="sentences to send, one per line")
    parser.add_argument("--threads", type=int, default=2, help="server torch threads")
    parser.add_argument("--max-batch-sentences", type=int, default=64)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--max-seconds", type=float, default=300, help="per run")
    parser.add_argument("--request-timeout", type=float, default=300)
    parser.add_argument("--start-timeout", type=float, default=120)
    parser.add_argument("--quick", action="store_true", help="4 clients x 5 requests, tiny model")
    parser.add_argument("--abuse", action="store_true", help="the server under abusive load")
    parser.add_argument("--connections", type=int, default=1000, help="abusive connections")
    parser.add_argument("--abuse-seconds", type=float, default=60)
    parser.add_argument("--quiet-seconds", type=float, default=10)
    parser.add_argument("--in-flight", type=int, default=32, help="requests in flight at SIGTERM")
    parser.add_argument(
        "--abuse-pause",
        type=float,
        default=2.0,
        help="seconds between two rounds of the fast kinds of abuse, per connection",
    )
    parser.add_argument("--max-queue", type=int, default=8192, help="the server's, under --abuse")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.requests = min(args.clients, 4), min(args.requests, 5)

    if args.input:
        pool = [s.strip() for s in Path(args.input).read_text(encoding="utf-8").splitlines()]
        pool = [s for s in pool if s]
    else:
        pool = generated_sentences(2000, seed=7)
    if len(pool) <= args.sentences + 3:
        raise SystemExit("not enough sentences in --input")

    if args.abuse:
        abuse_main(args, pool)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(demo_checkpoint(Path(tmp), args.quick))
        runs: dict[str, dict] = {}
        for name, max_batch, wait in [
            ("batched", args.max_batch_sentences, args.batch_wait_ms),
            ("unbatched", 1, 0.0),
        ]:
            print(f"[{name}] starting the server ...", file=sys.stderr, flush=True)
            server = Server(model, args.threads, max_batch, wait, args.start_timeout)
            try:
                runs[name] = load_run(server, args, pool)
            finally:
                server.stop()

    print(
        f"\n{args.clients} clients x {args.requests} requests x {args.sentences} sentence(s), "
        f"server on {args.threads} threads, model {args.model or 'random demo'}"
    )
    print(
        f"{'server':10} {'req/s':>8} {'sent/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
        f"{'req/batch':>10} {'failed':>7}"
    )
    for name, r in runs.items():

        def f(v: Any, spec: str = "8.1f") -> str:
            return format(v, spec) if v is not None else "       -"

        print(
            f"{name:10} {f(r['requests_per_s'])} {f(r['sentences_per_s'])} {f(r['p50_ms'])} "
            f"{f(r['p95_ms'])} {f(r['p99_ms'])} {f(r['requests_per_batch'], '10.2f')} "
            f"{r['failed']:7d}"
        )
    b, u = runs["batched"], runs["unbatched"]
    summary = {
        "benchmark": "serve_load",
        "model": args.model or "random-demo",
        "clients": args.clients,
        "requests_per_client": args.requests,
        "sentences_per_request": args.sentences,
        "beam": args.beam,
        "threads": args.threads,
        "batching": {
            "max_batch_sentences": args.max_batch_sentences,
            "batch_wait_ms": args.batch_wait_ms,
        },
        "throughput_gain": b["requests_per_s"] / u["requests_per_s"]
        if u["requests_per_s"]
        else None,
        "p50_ratio": b["p50_ms"] / u["p50_ms"] if b["p50_ms"] and u["p50_ms"] else None,
        "p95_ratio": b["p95_ms"] / u["p95_ms"] if b["p95_ms"] and u["p95_ms"] else None,
        "batched": {k: _round(v) for k, v in b.items()},
        "unbatched": {k: _round(v) for k, v in u.items()},
    }
    print(json.dumps({k: _round(v) for k, v in summary.items()}))


def report(out: dict[str, Any]) -> str:
    """The figures of ``run_abuse`` as a few lines of text."""

    def lat(r: dict[str, Any]) -> str:
        if not r.get("n"):
            return f"no answers, {r.get('failed')} failed"
        return (
            f"{r['n']} answered, p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms, "
            f"p99 {r['p99_ms']} ms, max {r['max_ms']} ms, {r['failed']} failed"
        )

    mem, down = out["memory"], out["shutdown"]
    lines = [
        f"{out['connections']} abusive connections",
        f"well-behaved, alone:        {lat(out['good_quiet'])}",
        f"well-behaved, under abuse:  {lat(out['good_under_abuse'])}",
        f"/health under abuse:        {lat(out['health_under_abuse'])}",
        (
            f"cores busy under abuse: server {out['cpu_under_abuse']['server']}, "
            f"this client {out['cpu_under_abuse']['client']}"
        ),
        (
            f"server memory: {mem['rss_before_mb']} MiB before, {mem.get('rss_peak_mb')} MiB peak "
            f"under abuse, VmHWM {mem.get('VmHWM')} MiB; most sentences queued "
            f"{out['health_under_abuse'].get('max_pending_sentences')}"
        ),
        (
            f"shutdown: {down['answered_200']}/{down['in_flight']} requests answered "
            f"({down['in_flight_at_signal']} unanswered at SIGTERM), "
            f"failed {down['failed']}, in {down['seconds_to_answers']} s; exit code "
            f"{down['exit_code']} after {down['seconds_to_exit']} s"
        ),
        "abuse outcomes: " + ", ".join(f"{k} x{v}" for k, v in out["abuse_outcomes"].items()),
    ]
    return "\n".join(lines)


def abuse_main(args: argparse.Namespace, pool: list[str]) -> None:
    """``--abuse``: one server under ``serve_abuse.run_abuse``; prints its figures."""
    import asyncio
    import secrets

    from serve_abuse import AbuseConfig, run_abuse

    from transduce.serve.guard import raise_open_file_limit

    needed = 2 * (args.connections + args.clients + args.in_flight) + 256  # both ends of each
    soft = raise_open_file_limit(needed)
    if soft < needed:
        raise SystemExit(
            f"the open-file limit is {soft} (the hard limit) and --connections "
            f"{args.connections} needs {needed}: raise it or pass fewer"
        )
    token = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(demo_checkpoint(Path(tmp), args.quick))
        key_file = Path(tmp) / "api-key"
        key_file.write_text(token + "\n")
        extra = ("--max-queue", str(args.max_queue), "--api-key-file", str(key_file))
        print("[abuse] starting the server ...", file=sys.stderr, flush=True)
        server = Server(
            model,
            args.threads,
            args.max_batch_sentences,
            args.batch_wait_ms,
            args.start_timeout,
            extra=extra,
            token=token,
        )
        cfg = AbuseConfig(
            sentences=pool,
            connections=args.connections,
            seconds=args.abuse_seconds,
            quiet_seconds=args.quiet_seconds,
            good_clients=args.clients,
            in_flight=args.in_flight,
            token=token,
            pause_s=args.abuse_pause,
        )
        bound = args.quiet_seconds + args.abuse_seconds + 4 * cfg.io_timeout
        try:
            out = asyncio.run(
                asyncio.wait_for(run_abuse(server.host, server.port, server.proc, cfg), bound)
            )
        finally:
            server.stop()
    out.update(
        model=args.model or "random-demo",
        threads=args.threads,
        max_queue=args.max_queue,
        abuse_pause_s=args.abuse_pause,
    )
    print(report(out))
    print(json.dumps({"benchmark": "serve_abuse", **out}))


if __name__ == "__main__":
    main()
