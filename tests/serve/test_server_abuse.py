"""The server under abuse, CI-sized: ``benchmarks/serve_abuse.py`` (what ``serve_load.py
--abuse`` runs with 1,000 connections) against ``transduce serve`` in a subprocess, with 200
abusive connections, short timeouts and the toy model. Everything on 127.0.0.1, bounded in time.
"""

from __future__ import annotations

import asyncio
import json
from types import ModuleType

import pytest
from benchmark_testkit import load_benchmark

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from inference_testkit import save_toy_translation_model, toy_sentences  # noqa: E402

from transduce.serve.guard import raise_open_file_limit  # noqa: E402

CONNECTIONS = 200


def _load(name: str) -> ModuleType:
    return load_benchmark(name, keep=True)


EXPECTED = {  # kind -> what the server does to it
    "idle": "closed",
    "slow_headers": "closed",
    "slow_body": "408",
    "bad_utf8": "400",
    "deep_json": "400",
    "huge_declared": "413, closed",
    "cancel": "dropped",
}


def test_the_server_survives_200_abusive_connections(tmp_path) -> None:
    serve_abuse, serve_load = _load("serve_abuse"), _load("serve_load")
    needed = 2 * (CONNECTIONS + 64) + 256
    if raise_open_file_limit(needed) < needed:
        pytest.skip(f"the open-file limit's hard limit is under {needed}")
    model = save_toy_translation_model(tmp_path / "model.pt", {"max_len_offset": 4})
    (tmp_path / "key").write_text("abuse-test-token\n")
    extra = (
        "--max-queue",
        "512",
        "--header-timeout",
        "1",
        "--body-timeout",
        "2",
        "--api-key-file",
        str(tmp_path / "key"),
    )
    server = serve_load.Server(str(model), 1, 64, 5.0, 120, extra=extra, token="abuse-test-token")
    cfg = serve_abuse.AbuseConfig(
        sentences=toy_sentences(200, seed=3),
        connections=CONNECTIONS,
        seconds=6,
        quiet_seconds=2,
        good_clients=2,
        in_flight=8,
        in_flight_sentences=16,
        in_flight_beam=8,
        pause_s=1.0,
        cancel_pause_s=2.0,
        trickle_s=0.2,
        spread_s=1.0,
        io_timeout=20,
        token="abuse-test-token",
        nesting=20_000,
    )
    try:
        coro = serve_abuse.run_abuse(server.host, server.port, server.proc, cfg)
        out = asyncio.run(asyncio.wait_for(coro, 120))
    finally:
        server.stop()
    report = serve_load.report(out) + "\n" + json.dumps(out)
    print(report)  # with pytest -s
    outcomes = out["abuse_outcomes"]
    for kind, outcome in EXPECTED.items():
        assert outcomes.get(f"{kind}: {outcome}", 0) > 0, report
    unexpected = {
        k: v
        for k, v in outcomes.items()
        if k not in {f"{kind}: {outcome}" for kind, outcome in EXPECTED.items()}
    }
    assert not unexpected, report
    assert out["health_under_abuse"]["failed"] == 0 and out["health_under_abuse"]["n"] > 5, report
    assert out["good_under_abuse"]["failed"] == 0 and out["good_under_abuse"]["n"] > 0, report
    assert out["stats_before_shutdown"]["cancelled_requests"] > 0, report
    assert out["health_under_abuse"]["max_pending_sentences"] <= 512, report
    grew = out["memory"]["rss_peak_mb"] - out["memory"]["rss_before_mb"]
    assert grew < 200, report  # MiB; bodies are at most 64 MB held, the queue 512 sentences
    down = out["shutdown"]
    assert down["answered_200"] == cfg.in_flight and down["exit_code"] == 0, report
    assert down["in_flight_at_signal"] > 0, report  # else the test shows nothing
