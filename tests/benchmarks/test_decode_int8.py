"""benchmarks/decode.py --int8: a --quick run on a tiny model end to end (every system, ours and
CTranslate2 in int8 included, decoding exactly 30 steps and passing the same-model check; the
int8 JSON keys) and the direction of the int8 ratios. No timing is asserted."""

from __future__ import annotations

import json
import os
import types

import pytest
from benchmark_testkit import TINY, load_benchmark

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it: nothing from a hub
pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")


def _module() -> types.ModuleType:
    """The benchmark script as a module (not named ``decode``: see ``load_benchmark``)."""
    return load_benchmark("decode", "decode_bench")


def test_quick_int8_run_prints_the_int8_ratios(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dec = _module()
    monkeypatch.setitem(dec.SIZES, "small", TINY)
    out = dec.main(["--quick", "--int8", "--threads", "1"])
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1]) == out
    systems = out["systems"]["small"]
    assert set(systems) == {"transduce", "transduce_int8", "hf", "ct2", "ct2_int8"}
    for key in ("small_beam4_int8_vs_ct2_int8", "small_b1_latency_int8_vs_ct2_int8"):
        assert isinstance(out[key], float) and out[key] > 0
    for key in ("small_beam4_int8_vs_fp32", "small_b1_latency_int8_vs_fp32"):
        assert isinstance(out[key], float) and out[key] > 0
    assert out["base_beam4_int8_vs_ct2_int8"] is None  # --quick: no BASE
    for name in ("transduce_int8", "ct2_int8"):
        # int8 computes our model, up to quantisation: close, not equal
        assert 0 < systems[name]["check_max_abs_diff"] <= dec.INT8_CHECK_TOL


def test_int8_ratios_are_ours_faster_above_one_and_latency_ours_over_theirs() -> None:
    dec = _module()

    def system(seconds: float) -> dict[str, float]:
        return {"beam4_sent_s": 32 / seconds, "greedy_sent_s": 32 / seconds, "b1_s": seconds}

    res = {
        "systems": {
            "transduce": system(2.0),
            "hf": system(2.0),
            "ct2": system(2.0),
            "transduce_int8": system(1.0),
            "ct2_int8": system(2.0),
        }
    }
    out = dec.ratios("small", res)
    assert out["small_beam4_int8_vs_ct2_int8"] == 2.0
    assert out["small_b1_latency_int8_vs_ct2_int8"] == 0.5
    assert out["small_beam4_int8_vs_fp32"] == 2.0 and out["small_b1_latency_int8_vs_fp32"] == 0.5
    del res["systems"]["transduce_int8"], res["systems"]["ct2_int8"]
    assert not any("int8" in k for k in dec.ratios("small", res))
