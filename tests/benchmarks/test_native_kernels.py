"""benchmarks/native_kernels.py: a one-round run on a tiny model end to end (the operators, every
search with and without the native kernels giving the same outputs, the training operators and
step, the JSON). No timing is asserted."""

from __future__ import annotations

import json

import pytest
from benchmark_testkit import TINY, load_benchmark

from transduce.inference.engine import DecodingModel
from transduce.kernels import native, quantized


def test_a_one_round_run_compares_the_native_kernels_with_pytorchs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if not native.available():
        pytest.skip("the native kernels did not build here")
    bench = load_benchmark("native_kernels", "native_kernels_bench")
    monkeypatch.setitem(bench.decode.SIZES, "small", TINY)
    monkeypatch.setattr(
        "sys.argv", ["native_kernels.py", "--sizes", "small", "--rounds", "1", "--threads", "1"]
    )
    bench.main()
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"int8_rows 128x512", "log_softmax_topk4 128x37000"} <= set(out["operators"])
    searches = out["small"]
    jobs = ("beam4", "greedy", "b1", "b1 beam4", "beam4 lineage", "greedy lineage")
    amx = ("beam4 amx", "greedy amx") if quantized.amx_int8_available() else ()
    # against MKL where "auto" takes it, forced against "auto" elsewhere
    f32 = ("beam4 f32", "greedy f32") if native.f32_gemm_available() else ()
    # a batch's step in one call where "auto" puts every product on the panels
    batch = ("beam4 batch step", "greedy batch step")
    batch = batch if DecodingModel(bench.decode.build_ours(TINY)).batch_plan is not None else ()
    assert set(searches) == {f"small {p} {j}" for p in ("fp32", "int8") for j in jobs} | {
        f"small int8 {j}" for j in amx
    } | {f"small fp32 {j}" for j in f32 + batch + ("beam4 choice", "b1 beam4 choice")}
    assert bool(amx) == any(k.startswith("amx_int8") for k in out["operators"])
    assert native.f32_gemm_available() == any(k.startswith("f32_linear") for k in out["operators"])
    for key, r in searches.items():
        assert r["same_outputs"] is True, key
        assert r["native_ms"] > 0 and r["torch_ms"] > 0 and r["speedup"] > 0
    training = out["training"]
    assert set(training) == {
        "smoothed_ce 1536x37000 bf16",
        "dropout 64x24x512 bf16",
        "layer_norm fwd+bwd 1536x512 bf16",
        "total_norm BASE grads",
        "adam bf16-weights BASE",
        "small train step bf16-weights",
    }
    assert all(r["native_ms"] > 0 and r["torch_ms"] > 0 for r in training.values())
    assert native.available()  # switched back on after the searches


def test_where_auto_keeps_another_library_our_float32_product_is_forced_against_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # an AMD CPU with AVX-512 as "auto" sees it: oneDNN's products, ours forced beside them
    if not (native.available() and native.f32_gemm_available()):
        pytest.skip("the native float32 product is built for CPUs with AVX-512 only")
    bench = load_benchmark("native_kernels", "native_kernels_bench")
    monkeypatch.setitem(bench.decode.SIZES, "small", TINY)
    monkeypatch.setattr("transduce.kernels.matmul._cpu_vendor", lambda: "AuthenticAMD")
    argv = [
        *("native_kernels.py", "--sizes", "small", "--rounds", "1", "--threads", "1"),
        *("--parts", "searches"),
    ]
    monkeypatch.setattr("sys.argv", argv)
    bench.main()
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for job in ("beam4", "greedy"):
        r = out["small"][f"small fp32 {job} f32"]
        assert r["same_outputs"] is True and r["native_ms"] > 0 and r["torch_ms"] > 0
