"""benchmarks/train_step.py's arithmetic: the FLOPs formula against PyTorch's own FLOP counter on a
real training step, and the summary (the JSON keys the issue names, ratios as medians of
per-round ratios)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from transduce.config import ModelConfig
from transduce.kernels import KernelOptions
from transduce.model import make_model

ROOT = Path(__file__).resolve().parents[2]


def _train_step() -> types.ModuleType:
    """The benchmark script as a module."""
    spec = importlib.util.spec_from_file_location(
        "train_step", ROOT / "benchmarks" / "train_step.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_step"] = module  # dataclasses look the module up while it loads
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["train_step"]
    return module


@pytest.mark.parametrize("d_k,d_v", [(16, 16), (16, 8)])
def test_flops_formula_counts_every_matrix_product_of_a_step(d_k: int, d_v: int) -> None:
    ts = _train_step()
    size = {
        "n_layers": 2,
        "d_model": 32,
        "n_heads": 2,
        "d_k": d_k,
        "d_v": d_v,
        "d_ff": 64,
        "vocab": 50,
    }
    batch, s, t = 3, 5, 7
    cfg = ModelConfig(n_layers=2, d_model=32, d_ff=64, n_heads=2, d_k=d_k, d_v=d_v, dropout=0.0)
    # oneDNN's operator is invisible to the FLOP counter
    options = KernelOptions(matmul="mkl")
    model = make_model(cfg, src_vocab_size=50, pad_id=0, options=options).train()
    g = torch.Generator().manual_seed(0)
    src, tgt = (
        torch.randint(4, 50, (batch, s), generator=g),
        torch.randint(4, 50, (batch, t), generator=g),
    )
    with FlopCounterMode(display=False) as counter:
        model(src, tgt).float().square().sum().backward()
    # forward and backward of every product, attention's full T x T scores included
    assert ts.flops_per_step(size, batch, s, t) == counter.get_total_flops()


def test_the_issue_sizes_cost_what_the_docstring_says() -> None:
    ts = _train_step()
    tokens = ts.BATCH * ts.TGT_LEN
    assert ts.flops_per_step(ts.SIZES["small"]) / tokens == pytest.approx(46.0e6, rel=1e-3)
    assert ts.flops_per_step(ts.SIZES["base"]) / tokens == pytest.approx(380.6e6, rel=1e-3)


def test_summary_keys_and_median_ratios() -> None:
    ts = _train_step()
    times = {
        "transduce/fp32": [1.0, 1.0, 4.0],
        "torch/fp32": [2.0, 3.0, 4.0],
        "hf/fp32": [1.0, 2.0, 2.0],
        "transduce/bf16": [0.5, 0.5, 0.5],
        "torch/bf16": [1.0, 1.0, 1.0],
        "hf/bf16": [0.75, 0.75, 0.75],
    }
    sizes = {
        name: {"seconds_per_step": times, "flops_per_step": 1e12} for name in ("small", "base")
    }
    rows, out = ts.summarise({"sizes": sizes, "peak_flops": {"fp32": 4e12, "bf16": 8e12}})
    required = [
        "small_fp32_vs_hf",
        "small_fp32_vs_torch",
        "small_bf16_vs_hf",
        "base_fp32_vs_hf",
        "base_bf16_vs_hf",
        "small_fp32_mfu",
    ]
    assert all(key in out for key in required)
    # per-round ratios 2, 3, 1 -> 2 and 1, 2, 0.5 -> 1; the ratios of the medians would be 3 and 2
    assert out["small_fp32_vs_torch"] == 2.0 and out["small_fp32_vs_hf"] == 1.0
    assert out["small_bf16_vs_hf"] == 1.5 and out["base_bf16_vs_torch"] == 2.0
    assert out["small_fp32_mfu"] == pytest.approx(1e12 / 1.0 / 4e12, rel=1e-3)
    assert out["small_bf16_over_fp32"] == 2.0  # per-round 2, 2, 8
    assert len(rows) == 12
