"""benchmarks/gpu_probe.py: each shape's measurements run on that shape's tensors (a probe whose
calls all ran on the last shape's once reported the small model's figures as the paper batch's),
every backend that cannot take a case is reported as such, and the dry run's JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from benchmark_testkit import BENCHMARKS, load_benchmark


def test_each_shape_is_timed_on_its_own_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = load_benchmark("gpu_probe")
    seen: list[tuple[int, ...]] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        seen.append(tuple(q.shape))
        return real(q, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    shapes = {"a": (2, 2, 5, 8), "b": (3, 1, 4, 8)}
    calls = probe.attention_cases(torch.device("cpu"), shapes, torch.float32)
    assert {name.split("/")[2] for name in calls} == {"none", "causal", "padding"}
    timed = 0
    for name, call in calls.items():
        if call is None or name.endswith("formula"):  # the formula takes no fused kernel
            continue
        seen.clear()
        call()
        assert seen == [shapes[name.split("/")[1]]], name
        timed += 1
    assert timed >= 6  # at least math and the CPU's flash kernel, for both shapes and 3 cases


def test_the_dry_run_reports_every_measurement() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_probe.py"), "--device", "cpu"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    ms = result["ms"]
    assert result["benchmark"] == "gpu_probe" and result["device"] == "cpu"
    assert ms["attention/tiny/padding/formula"] > 0 and ms["cast/flat"] > 0
    # what a CPU cannot run is there as None, named in the lines above it
    assert ms["attention/tiny/none/cudnn"] is None and ms["norm/layernorm/liger"] is None
    assert "attention/tiny/none/cudnn" in out and "not available here" in out


def test_the_top_k_candidates_agree() -> None:
    """The three ways of a beam step's top-k in the probe find the k best log-probabilities,
    each at entries that hold them (bf16 logits tie often: which of tied entries may differ)."""
    from transduce.inference.common import next_token_log_probs

    probe = load_benchmark("gpu_probe")
    calls = probe.topk_cases(torch.device("cpu"), {"s": (6, 1000)})
    logits = calls["topk/s/log_softmax+topk"].__defaults__[0]  # the probe's own tensor
    lprobs = next_token_log_probs(logits, None)
    ref = lprobs.topk(4, dim=1).values
    for name in ("log_softmax+topk", "log_softmax+chunked", "logits_topk+lse"):
        values, index = calls[f"topk/s/{name}"]()
        torch.testing.assert_close(values, ref, msg=name)
        torch.testing.assert_close(lprobs.gather(1, index), ref, msg=name)
        assert all(len(set(row)) == 4 for row in index.tolist()), name
