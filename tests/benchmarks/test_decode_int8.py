"""benchmarks/decode.py --int8: a --quick run on a tiny model end to end (every system, ours and
CTranslate2 in int8 included, decoding exactly 30 steps and passing the same-model check; the
int8 JSON keys) and the direction of the int8 ratios. No timing is asserted."""

from __future__ import annotations

import json
import os
import types

import pytest
from benchmark_testkit import TINY, load_benchmark

from transduce.kernels.quantized import cpu_int8_flags

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
    out = dec.main(["--quick", "--int8", "--threads", "1", "--settle", "0"])
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1]) == out
    systems = out["systems"]["small"]
    assert set(systems) == {"transduce", "transduce_int8", "hf", "ct2", "ct2_int8"}
    for key in ("small_beam4_int8_vs_ct2_int8", "small_b1_latency_int8_vs_ct2_int8"):
        assert isinstance(out[key], float) and out[key] > 0
    for key in ("small_beam4_int8_vs_fp32", "small_b1_latency_int8_vs_fp32"):
        assert isinstance(out[key], float) and out[key] > 0
    assert out["base_beam4_int8_vs_ct2_int8"] is None  # --quick: no BASE
    # int8 computes our model, up to quantisation: close, not equal (CTranslate2's int8 further
    # off on a CPU without int8 dot products)
    assert 0 < systems["transduce_int8"]["check_max_abs_diff"] <= dec.INT8_CHECK_TOL
    assert 0 < systems["ct2_int8"]["check_max_abs_diff"] <= dec.ct2_int8_tol()
    assert out["cpu_int8_dot"] == list(cpu_int8_flags())
    # every system timed in the same rounds (--quick: 1 of each batch job, 3 of latency)
    for name, r in systems.items():
        assert (len(r["beam4_times"]), len(r["b1_times"])) == (1, 3), name


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


def test_ct2_int8_is_held_to_the_int8_tolerance_only_where_the_cpu_has_int8_dot_products(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dec = _module()
    monkeypatch.setattr(dec_quantized(), "cpu_flags", lambda: frozenset({"avx2", "avx512_vnni"}))
    assert dec.ct2_int8_tol() == dec.INT8_CHECK_TOL
    monkeypatch.setattr(dec_quantized(), "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert dec.ct2_int8_tol() == dec.INT8_CHECK_TOL_NO_DOT > dec.INT8_CHECK_TOL


def dec_quantized() -> types.ModuleType:
    import transduce.kernels.quantized as quantized

    return quantized


def test_ctranslate2_is_forced_only_to_the_isas_this_cpu_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dec = _module()
    zen3 = frozenset({"avx", "avx2", "fma", "sse4_2"})
    monkeypatch.setattr(dec_quantized(), "cpu_flags", lambda: zen3)
    assert dec.cpu_isas() == ("AVX2", "AVX", "GENERIC")
    avx512 = zen3 | {"avx512f", "avx512bw", "avx512vl"}
    monkeypatch.setattr(dec_quantized(), "cpu_flags", lambda: avx512)
    assert dec.cpu_isas() == dec.ISAS
    monkeypatch.setattr(dec_quantized(), "cpu_flags", lambda: zen3 | {"avx512f"})  # no bw, vl
    assert dec.cpu_isas()[0] == "AVX2"
    monkeypatch.setattr(dec_quantized(), "cpu_flags", frozenset)  # no /proc/cpuinfo: try all
    assert dec.cpu_isas() == dec.ISAS


def test_a_ctranslate2_backend_off_our_model_is_left_out_and_none_within_is_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import torch

    dec = _module()
    ref = torch.tensor([-1.0, -2.0])
    runs = {"mkl": {"check_log_probs": [-1.0, -2.9]}, "dnnl": {"check_log_probs": [-1.1, -2.0]}}
    kept = dec.same_model(runs, ref, 0.5, "ct2 int8 on AVX2")
    assert list(kept) == ["dnnl"] and kept["dnnl"]["check_max_abs_diff"] == pytest.approx(0.1)
    assert "only dnnl within 0.5" in capsys.readouterr().err
    runs = {"mkl": {"check_log_probs": [-1.0, -2.9]}}
    with pytest.raises(RuntimeError, match=r"does not compute our model .*mkl 0\.9"):
        dec.same_model(runs, ref, 0.5, "ct2 int8 on AVX2")


def test_sizes_times_only_the_sizes_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dec = _module()
    monkeypatch.setitem(dec.SIZES, "base", TINY)
    argv = ["--sizes", "base", "--repeats", "2", "--latency-repeats", "2"]
    out = dec.main([*argv, "--threads", "1", "--settle", "0"])
    capsys.readouterr()
    assert set(out["systems"]) == {"base"}
    assert out["small_beam4_vs_ct2"] is None and out["small_beam4_vs_hf"] is None
    assert isinstance(out["base_beam4_vs_ct2"], float) and out["base_beam4_vs_ct2"] > 0
    for name, r in out["systems"]["base"].items():
        assert len(r["beam4_times"]) == 2, name
