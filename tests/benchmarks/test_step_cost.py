"""benchmarks/step_cost.py: a run on a tiny model end to end (ours and CTranslate2 at every
length, our products alone) and the arithmetic of the split into a fixed cost and a cost a step.
No timing is asserted."""

from __future__ import annotations

import json
import types

import pytest
from benchmark_testkit import TINY, load_benchmark

pytest.importorskip("ctranslate2")


def _module() -> types.ModuleType:
    """The benchmark script as a module (it imports decode.py from beside itself)."""
    return load_benchmark("step_cost", "step_cost_bench")


def test_a_tiny_run_prints_both_systems_and_the_ratios(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = _module()
    monkeypatch.setitem(bench.decode.SIZES, "small", TINY)
    out = bench.main(["--threads", "1", "--repeats", "1"])
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1]) == out
    ours, ct2 = out["systems"]["transduce"], out["systems"]["ct2"]
    assert ours["fixed_ms"] > 0 and ct2["fixed_ms"] > 0 and ours["products_us"] > 0
    assert ours["rest_us"] == pytest.approx(ours["step_us"] - ours["products_us"], abs=0.02)
    assert out["step_vs_ct2"] == pytest.approx(ours["step_us"] / ct2["step_us"], rel=0.01)


def test_the_split_takes_the_fixed_cost_at_two_tokens_and_the_step_from_30_to_60() -> None:
    bench = _module()
    # 2 tokens in 1 ms; 30 in 10 ms, 60 in 19 ms: 9 ms over 30 steps
    parts = bench.split({2: 0.001, 30: 0.010, 60: 0.019})
    assert parts["fixed_ms"] == pytest.approx(1.0)
    assert parts["step_us"] == pytest.approx(300.0)
