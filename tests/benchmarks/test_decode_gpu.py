"""benchmarks/decode_gpu.py, dry-run on the CPU (CI has no GPU): the --quick run end to end in
float32, where transduce's engine and Hugging Face generate must choose the same greedy tokens
(agreement 1.0: a wrong weight or id map parts them), and the engine's static steps the engine's
tokens, the ratio keys, and the agreement measure
on a hand case. No timing is asserted."""

from __future__ import annotations

import json
import os
import types

import pytest
from benchmark_testkit import load_benchmark

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it: nothing from a hub
pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")


def _module() -> types.ModuleType:
    return load_benchmark("decode_gpu")


def test_agreement_counts_equal_positions_after_mapping_ids() -> None:
    dg = _module()
    to_ours = {10: 1, 11: 2, 12: 3}
    assert dg.agreement([[1, 2, 3]], [[10, 11, 12]], to_ours) == 1.0
    assert dg.agreement([[1, 2, 3], [1, 1, 1]], [[10, 11, 11], [99, 10, 10]], to_ours) == 4 / 6


def test_cpu_dry_run_agrees_with_hugging_face(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from transduce import kernels
    from transduce.kernels import topk_tiles

    dg = _module()
    # the static steps take the tiles' candidates, as on CUDA (their torch stage here), so that
    # beam4_plain_candidates compares two ways of choosing them
    monkeypatch.setattr(kernels, "log_softmax_topk_pays", lambda device, k: True)
    monkeypatch.setattr(
        kernels,
        "log_softmax_topk",
        lambda x, k, lo, hi, **kw: topk_tiles.log_softmax_topk(
            x, k, lo, hi, use_triton=False, **kw
        ),
    )
    out = dg.main(["--device", "cpu", "--quick", "--dtype", "fp32", "--batches", "2", "3"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out
    assert out["device"] == "cpu" and out["dtype"] == "fp32"
    assert out["greedy_agreement"] == 1.0
    assert out["check_max_abs_diff_fp32_cpu"] <= 1e-3
    # the static steps (eagerly on a CPU) choose the engine's tokens, greedy and beam 4
    want = {"greedy": 1.0, "beam4": 1.0, "beam4_plain_candidates": 1.0}
    assert out["static_agreement"] == want
    for n in (2, 3):
        for name in ("beam4", "greedy"):
            for key in ("vs_hf", "static_vs_hf", "static_vs_eager", "static_vs_plain"):
                assert out[f"gpu_{name}_b{n}_{key}"] > 0
    systems = ("transduce", "transduce_static", "transduce_static_plain", "hf")
    assert out["peak_memory_gb"] == dict.fromkeys(systems)
