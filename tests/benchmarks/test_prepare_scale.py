"""benchmarks/prepare_scale.py on a corpus small enough for a test: generate, prepare (learning
the vocabulary, then reusing it as the 5M-pair measurement does) and the loading figures."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from benchmark_testkit import load_benchmark

import transduce.config


def _bench() -> types.ModuleType:
    return load_benchmark("prepare_scale", keep=True)


def test_generate_prepare_reuse_and_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    corpus = tmp_path / "corpus"
    bench.generate(3000, corpus)
    src = (corpus / "train.src").read_text().splitlines()
    tgt = (corpus / "train.tgt").read_text().splitlines()
    assert len(src) == len(tgt) == 3000
    assert 10 < sum(len(line.split()) for line in src) / len(src) < 40  # WMT-like lengths
    config = (corpus / "config.yaml").read_text()  # a vocabulary a 3k-pair corpus can fill
    (corpus / "config.yaml").write_text(config.replace("vocab_size: 32000", "vocab_size: 400"))
    first = bench.bench_prepare(corpus, tmp_path / "prep", workers=1, vocab=None)
    assert (tmp_path / "prep_vocab").is_dir() and first["vocab_seconds"] > 0
    assert first["pairs"] == 3000  # the pairs read
    again = bench.bench_prepare(
        corpus, tmp_path / "again", workers=2, vocab=tmp_path / "prep_vocab"
    )
    assert again["pairs"] == first["pairs"] and not (tmp_path / "again_vocab").exists()
    assert again["pairs_per_s_per_worker"] == pytest.approx(again["pairs_per_s"] / 2, abs=1)
    base = transduce.config.preset_config("base")  # bench_load's model, at a test's size
    tiny = transduce.config.update(
        base, {"n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 16}
    )
    monkeypatch.setattr(transduce.config, "preset_config", lambda name: tiny)
    load = bench.bench_load(tmp_path / "prep", "cpu", steps=2, max_tokens=2000, simulate_ms=None)
    assert 2800 < load["pairs"] < 3000  # cleaning removed the empty and repeated lines
    assert load["batches"] > 13  # a warm-up and 4 blocks of 3
    assert load["start_to_first_batch_s"] >= 0
    for way in ("on_thread", "read_ahead"):
        assert 0 < load[f"data_share_{way}"] < 1 and load[f"ms_per_step_with_wait_{way}"] > 0
    slept = bench.bench_load(tmp_path / "prep", "cpu", steps=2, max_tokens=2000, simulate_ms=20.0)
    assert slept["step"] == "sleep 20.0 ms" and slept["ms_per_step_with_wait_read_ahead"] >= 20
