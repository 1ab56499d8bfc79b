"""benchmarks/translate_gpu.py, dry-run on the CPU (CI has no GPU): a toy model translating a
small file with both Translators (on a CPU both run the engine), the rounds alternating, the
outputs compared and scored. No timing is asserted."""

from __future__ import annotations

import json

import pytest
from benchmark_testkit import load_benchmark
from inference_testkit import save_toy_translation_model, toy_sentences

pytest.importorskip("sacrebleu")


def test_cpu_dry_run(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    model = save_toy_translation_model(tmp_path / "m.pt", {"beam": 2, "max_len_offset": 3})
    lines = toy_sentences(7)
    (tmp_path / "src.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(reversed(lines)) + "\n")
    args = ["--model", str(model), "--src", str(tmp_path / "src.txt"), "--device", "cpu"]
    out = load_benchmark("translate_gpu").main([*args, "--ref", str(tmp_path / "ref.txt")])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out
    assert out["graphs_used"] is False  # no CUDA: the engine as it is
    assert out["captures_per_round"] is None and out["capture_seconds_per_round"] is None
    assert out["sentences"] == 7 and out["same_outputs"] == 7
    assert [len(t) for t in out["seconds"].values()] == [2, 2]  # two rounds each
    assert out["bleu"]["graphs"] == out["bleu"]["engine"]
