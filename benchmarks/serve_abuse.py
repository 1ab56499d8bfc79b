"""The client side of ``serve_load.py --abuse``: a running ``transduce serve`` under abusive load.

``run_abuse(url_host, port, proc, cfg)`` drives, from one asyncio loop on 127.0.0.1:

1. a quiet phase: ``good_clients`` well-behaved clients (one keep-alive connection each, one
   sentence a request) alone, for baseline latencies;
2. the abuse phase: the same clients and a /health prober beside ``connections`` abusive
   connections, each repeating one kind of abuse (``KINDS``) until the phase ends: idle
   connections, headers or a body trickled a byte at a time, invalid UTF-8, deeply nested JSON, a
   declared 100 MB body, requests dropped mid-decode;
3. a graceful shutdown: the fast kinds of abuse stop and their work drains, ``in_flight``
   requests are sent, SIGTERM goes to the server once they are all queued or decoding (the slow
   abusers still connected), and the answers are counted.

It samples the server's resident memory (``/proc/PID/status``) throughout. Everything is bounded:
each wait has ``io_timeout``, each phase a length, and the abusers stop at the shutdown. Shared
by the benchmark (which prints the figures: ``serve_load.report``) and
tests/serve/test_server_abuse.py (the CI-sized run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

SLOW_KINDS = ("idle", "slow_headers", "slow_body")  # each holds a connection for long
FAST_KINDS = ("bad_utf8", "deep_json", "huge_declared", "cancel")  # these pause between rounds
KINDS = SLOW_KINDS * 3 + FAST_KINDS  # the connections' kinds in turn: 3/4 of them slow


@dataclass
class AbuseConfig:
    sentences: list[str]  # what the well-behaved clients and the cancelled requests send
    connections: int = 1000  # abusive connections, kinds in turn
    seconds: float = 30.0  # the abuse phase
    quiet_seconds: float = 5.0  # well-behaved clients alone, before it
    good_clients: int = 4
    in_flight: int = 32  # requests in flight at SIGTERM
    in_flight_sentences: int = 4  # in each of them
    in_flight_beam: int | None = None  # for them (None: the model's)
    pause_s: float = 2.0  # between two rounds of a fast kind of abuse, per connection
    cancel_pause_s: float = 10.0  # the same for "cancel", whose requests cost decoding
    trickle_s: float = 0.5  # between two trickled bytes
    spread_s: float = 10.0  # the abusers' first rounds start at random within this
    io_timeout: float = 45.0  # over the server's body timeout (30 s by default)
    token: str | None = None  # the API key, sent by every client (abusers included)
    nesting: int = 100_000  # depth of the nested JSON
    kinds: tuple[str, ...] = KINDS  # the kinds of abuse, given to the connections in turn
    outcomes: Counter = field(default_factory=Counter)  # "kind: what happened" -> count


class Http:
    """A few raw HTTP/1.1 exchanges over one asyncio connection."""

    def __init__(self, host: str, port: int, cfg: AbuseConfig) -> None:
        self.host, self.port, self.cfg = host, port, cfg

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port), self.cfg.io_timeout
        )

    def head(self, method: str, path: str, length: int | None) -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        if self.cfg.token:
            lines.append(f"Authorization: Bearer {self.cfg.token}")
        if length is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {length}"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def response(self, reader: asyncio.StreamReader) -> tuple[int, bytes]:
        """(status, body) of the next response."""
        async with asyncio.timeout(self.cfg.io_timeout):
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = None
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await (reader.read() if length is None else reader.readexactly(length))
        return status, body

    async def post(
        self, payload: bytes, path: str = "/translate", sent: list[int] | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of one request on a connection of its own; ``sent[0]`` counts the
        requests written out so far."""
        reader, writer = await self.open()
        try:
            writer.write(self.head("POST", path, len(payload)) + payload)
            await writer.drain()
            if sent is not None:
                sent[0] += 1
            return await self.response(reader)
        finally:
            writer.close()


async def _closed_by_server(reader: asyncio.StreamReader, seconds: float) -> str:
    """'closed' once the server closes the connection, 'open' after ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return "open"
    except ConnectionError:
        pass
    return "closed"


async def _trickle(writer: asyncio.StreamWriter, data: bytes, every: float) -> None:
    for i in range(len(data)):
        writer.write(data[i : i + 1])
        await writer.drain()
        await asyncio.sleep(every)


async def _one_round(http: Http, kind: str, rng: random.Random) -> str:
    """One round of ``kind`` of abuse: what the server did ('408', 'closed', ...)."""
    cfg = http.cfg
    if kind in ("bad_utf8", "deep_json"):
        body = (
            b'{"text": ["caf\xe9 \xff\xfe"]}'
            if kind == "bad_utf8"
            else b"[" * cfg.nesting + b"]" * cfg.nesting
        )
        return str((await http.post(body))[0])
    reader, writer = await http.open()
    try:
        if kind == "idle":
            return await _closed_by_server(reader, cfg.io_timeout)
        if kind == "slow_headers":
            request = http.head("GET", "/health", None)
            sender = asyncio.ensure_future(_trickle(writer, request, cfg.trickle_s))
            try:
                return await _closed_by_server(reader, cfg.io_timeout)
            finally:
                sender.cancel()
        if kind == "slow_body":
            body = json.dumps({"text": cfg.sentences[:2]}).encode()
            writer.write(http.head("POST", "/translate", len(body)))
            sender = asyncio.ensure_future(_trickle(writer, body, cfg.trickle_s))
            try:
                return str((await http.response(reader))[0])
            finally:
                sender.cancel()
        if kind == "huge_declared":  # answered from the header: then the body goes nowhere
            writer.write(http.head("POST", "/translate", 100_000_000))
            status = str((await http.response(reader))[0])
            try:
                for _ in range(16):  # 1 MiB of the body
                    writer.write(b" " * 65536)
                    await writer.drain()
            except ConnectionError:
                return status + ", closed"
            return status + ", " + await _closed_by_server(reader, cfg.io_timeout)
        assert kind == "cancel"
        body = json.dumps({"text": rng.sample(cfg.sentences, 2)}).encode()
        writer.write(http.head("POST", "/translate", len(body)) + body)
        await writer.drain()
        await asyncio.sleep(rng.uniform(0.0, 0.2))  # queued or decoding by now
        return "dropped"
    finally:
        writer.close()


async def _abuser(http: Http, kind: str, seed: int, stop: asyncio.Event) -> None:
    """Rounds of ``kind`` until ``stop``, their outcomes counted in ``cfg.outcomes``."""
    rng = random.Random(seed)
    pause = http.cfg.cancel_pause_s if kind == "cancel" else http.cfg.pause_s
    await asyncio.sleep(rng.uniform(0, http.cfg.spread_s))  # not all at once, nor in step
    while not stop.is_set():
        try:
            outcome = await _one_round(http, kind, rng)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
            outcome = type(e).__name__
        if not stop.is_set():
            http.cfg.outcomes[f"{kind}: {outcome}"] += 1
        if kind in FAST_KINDS or not outcome.isalnum():  # an exception's name: no busy loop
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause * rng.uniform(0.5, 1.5)):
                    await stop.wait()


async def _good_client(
    http: Http, seed: int, until: float, lat: list[float], fails: list[str]
) -> None:
    """Requests one after another on a keep-alive connection until ``until``."""
    rng = random.Random(seed)
    reader = writer = None
    try:
        while time.monotonic() < until:
            body = json.dumps({"text": [rng.choice(http.cfg.sentences)]}).encode()
            t0 = time.perf_counter()
            try:
                if writer is None:
                    reader, writer = await http.open()
                writer.write(http.head("POST", "/translate", len(body)) + body)
                status, out = await http.response(reader)
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
                fails.append(type(e).__name__)
                if writer is not None:
                    writer.close()
                reader = writer = None
                await asyncio.sleep(0.1)
                continue
            if status == 200:
                lat.append(time.perf_counter() - t0)
            else:
                fails.append(f"{status} {out[:80]!r}")
    finally:
        if writer is not None:
            writer.close()


def percentiles(values: list[float]) -> dict[str, Any]:
    """n, p50, p95, p99 and max in milliseconds (nearest rank)."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def rank(q: float) -> float:
        k = max(0, min(len(ordered) - 1, int(q / 100 * len(ordered) + 0.5) - 1))
        return round(1000 * ordered[k], 1)

    return {
        "n": len(ordered),
        "p50_ms": rank(50),
        "p95_ms": rank(95),
        "p99_ms": rank(99),
        "max_ms": round(1000 * ordered[-1], 1),
    }


async def _good_phase(http: Http, seconds: float) -> dict[str, Any]:
    lat: list[float] = []
    fails: list[str] = []
    until = time.monotonic() + seconds
    clients = range(http.cfg.good_clients)
    await asyncio.gather(*(_good_client(http, seed, until, lat, fails) for seed in clients))
    return {**percentiles(lat), "failed": len(fails), "failures_sample": fails[:3]}


async def _health_prober(http: Http, stop: asyncio.Event, out: dict[str, Any]) -> None:
    lat: list[float] = []
    fails: list[str] = []
    while not stop.is_set():
        reader = writer = None
        t0 = time.perf_counter()
        try:
            reader, writer = await http.open()
            writer.write(http.head("GET", "/health", None))
            status, body = await http.response(reader)
            if status == 200:
                lat.append(time.perf_counter() - t0)
                pending = json.loads(body).get("stats", {}).get("pending_sentences", 0)
                out["max_pending_sentences"] = max(out.get("max_pending_sentences", 0), pending)
            else:
                fails.append(str(status))
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
            fails.append(type(e).__name__)
        finally:
            if writer is not None:
                writer.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.25):
                await stop.wait()
    out.update(percentiles(lat), failed=len(fails), failures_sample=fails[:3])


def rss_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of a process, in MiB (Linux)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = round(int(line.split()[1]) / 1024, 1)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _memory_sampler(pid: int, stop: asyncio.Event, out: dict[str, Any]) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError):
            out["rss_peak_mb"] = max(out.get("rss_peak_mb", 0.0), rss_mb(pid)["VmRSS"])
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.2):
                await stop.wait()


async def _stats(http: Http) -> dict[str, Any]:
    """The server's counters (``/health``; they need the token when the server has one)."""
    reader, writer = await http.open()
    try:
        writer.write(http.head("GET", "/health", None))
        return dict(json.loads((await http.response(reader))[1])["stats"])
    finally:
        writer.close()


async def _until(check: Any, seconds: float) -> None:
    """Poll the coroutine function ``check`` until it returns true, ``seconds`` at most."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while not await check():
                await asyncio.sleep(0.01)


async def _shutdown(
    http: Http, proc: subprocess.Popen, stops: dict[str, asyncio.Event], out: dict[str, Any]
) -> None:
    """SIGTERM with ``in_flight`` requests queued or decoding, the slow abusers still connected;
    counts the answers. First the fast abusers stop and their queued work drains, so that the
    requests counted are in the server's queue at the signal, not in a socket's buffer."""
    cfg = http.cfg
    stops["fast"].set()
    out["stats_before_shutdown"] = await _stats(http)

    async def drained() -> bool:
        return (await _stats(http))["pending_sentences"] == 0

    await _until(drained, cfg.io_timeout)
    n = cfg.in_flight_sentences
    extra = {} if cfg.in_flight_beam is None else {"beam": cfg.in_flight_beam}
    requests = [
        asyncio.ensure_future(
            http.post(json.dumps({"text": cfg.sentences[n * i : n * i + n], **extra}).encode())
        )
        for i in range(cfg.in_flight)
    ]

    async def all_received() -> bool:  # each one queued, decoding or answered
        answered = sum(r.done() for r in requests)
        return (await _stats(http))["pending_sentences"] + n * answered >= n * len(requests)

    await _until(all_received, cfg.io_timeout)
    out["memory"].update(rss_mb(proc.pid))
    t0 = time.perf_counter()
    stops["all"].set()
    proc.send_signal(signal.SIGTERM)
    before = sum(r.done() for r in requests)
    answers = await asyncio.gather(*requests, return_exceptions=True)
    answered_s = time.perf_counter() - t0
    statuses = Counter(a[0] if isinstance(a, tuple) else type(a).__name__ for a in answers)
    loop = asyncio.get_running_loop()
    code = await loop.run_in_executor(None, lambda: proc.wait(cfg.io_timeout))
    out["shutdown"] = {
        "in_flight": cfg.in_flight,
        "in_flight_at_signal": cfg.in_flight - before,
        "answered_200": statuses.pop(200, 0),
        "failed": dict(statuses),
        "exit_code": code,
        "seconds_to_answers": round(answered_s, 2),
        "seconds_to_exit": round(time.perf_counter() - t0, 2),
    }


async def run_abuse(
    host: str, port: int, proc: subprocess.Popen, cfg: AbuseConfig
) -> dict[str, Any]:
    """The three phases against the server ``proc`` on (host, port); the figures as a dict."""
    http = Http(host, port, cfg)
    out: dict[str, Any] = {"connections": cfg.connections, "memory": rss_mb(proc.pid)}
    out["memory"]["rss_before_mb"] = out["memory"].pop("VmRSS")
    out["good_quiet"] = await _good_phase(http, cfg.quiet_seconds)
    stop = asyncio.Event()
    health: dict[str, Any] = {}
    helpers = [
        asyncio.ensure_future(_health_prober(http, stop, health)),
        asyncio.ensure_future(_memory_sampler(proc.pid, stop, out["memory"])),
    ]
    stops = {"fast": asyncio.Event(), "all": asyncio.Event()}  # fast kinds stop first
    kinds = [cfg.kinds[i % len(cfg.kinds)] for i in range(cfg.connections)]
    abusers = [
        asyncio.ensure_future(
            _abuser(http, kind, i, stops["fast"] if kind in FAST_KINDS else stops["all"])
        )
        for i, kind in enumerate(kinds)
    ]
    try:
        cpu0, client0, t0 = cpu_seconds(proc.pid), time.process_time(), time.perf_counter()
        out["good_under_abuse"] = await _good_phase(http, cfg.seconds)
        wall = time.perf_counter() - t0
        out["cpu_under_abuse"] = {  # cores busy, on average
            "server": round((cpu_seconds(proc.pid) - cpu0) / wall, 2),
            "client": round((time.process_time() - client0) / wall, 2),
        }
        stop.set()
        await asyncio.gather(*helpers)
        out["health_under_abuse"] = health
        await _shutdown(http, proc, stops, out)
    finally:
        for event in stops.values():
            event.set()
        for task in abusers:
            task.cancel()
        await asyncio.gather(*abusers, *helpers, return_exceptions=True)
    out["kinds"] = dict(Counter(kinds))
    hidden = ("sentences", "outcomes", "token", "kinds")
    out["config"] = {k: v for k, v in asdict(cfg).items() if k not in hidden}
    out["abuse_outcomes"] = dict(sorted(cfg.outcomes.items()))
    return out
