"""benchmarks/table1.py: the banded restricted attention is masked full attention, the FLOP
formulas are PyTorch's count, the growth fit and the crossover recover known curves, and a quick
run prints its JSON and draws its figure."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import pytest
import torch
from benchmark_testkit import load_benchmark

from transduce import kernels
from transduce.kernels import AttentionPath


def _table1() -> types.ModuleType:
    """The benchmark script as a module (it imports table1_layers.py from beside itself)."""
    return load_benchmark("table1")


def _layers() -> types.ModuleType:
    """benchmarks/table1_layers.py as a module."""
    return load_benchmark("table1_layers", "table1_layers_under_test")


def _band(n: int, half: int) -> torch.Tensor:
    """(n, n) bool: |i - j| <= half."""
    i = torch.arange(n)
    return (i.view(n, 1) - i.view(1, n)).abs() <= half


@pytest.mark.parametrize("n,half", [(1, 4), (5, 8), (7, 4), (16, 4), (33, 8), (40, 3)])
@pytest.mark.parametrize("path", ["formula", "fused"])
def test_banded_attention_is_masked_full_attention(n: int, half: int, path: AttentionPath) -> None:
    layers = _layers()
    g = torch.Generator().manual_seed(n * 100 + half)
    q, k, v = (
        torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3)
    )
    out = layers.banded_attention(q, k, v, half, path)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    banded = torch.autograd.grad(out, (q, k, v), grad)
    full = kernels.attention(q, k, v, _band(n, half), path="formula")
    expected = torch.autograd.grad(full, (q, k, v), grad)
    torch.testing.assert_close(out, full)
    for got, want in zip(banded, expected):  # the gradients too: no leak through the padding
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("n,half", [(10, 4), (3, 4), (12, 3)])
def test_band_mask_is_the_band_in_window_coordinates(n: int, half: int) -> None:
    mask = _layers().band_mask(n, half)  # (blocks, half, 3 half)
    blocks = -(-n // half)
    assert mask.shape == (blocks, half, 3 * half)
    dense = torch.zeros(blocks * half, n, dtype=torch.bool)
    for b, a, c in mask.nonzero().tolist():  # slot c of block b is key (b - 1) half + c
        dense[b * half + a, (b - 1) * half + c] = True
    assert torch.equal(dense[:n], _band(n, half))


@pytest.mark.parametrize("n", [5, 16, 40])
def test_flop_formulas_are_the_flop_counters(n: int) -> None:
    t1 = _table1()
    for layer in t1.LAYERS:
        counted = t1.counted_flops(layer, n)
        assert counted == (t1.forward_flops(layer, n), t1.backward_flops(layer, n)), layer


def test_flop_formulas_scale_as_the_paper_says() -> None:
    t1 = _table1()
    d = t1.D_MODEL
    assert t1.forward_flops("self-attention core", 2048) == 4 * 2048**2 * d  # n^2 d
    assert t1.forward_flops(t1.RECURRENT, 2048) == 2 * t1.forward_flops(t1.RECURRENT, 1024)
    assert t1.forward_flops("convolutional", 100) == 2 * 3 * 100 * d * d  # k n d^2
    # banded: linear in n once n fills whole blocks of r/2
    assert t1.forward_flops("restricted core", 4096) == 2 * t1.forward_flops(
        "restricted core", 2048
    )
    assert [t1.sequential_ops(name, 64) for name in t1.LAYERS] == [1, 1, 64, 1, 1, 1]
    assert t1.max_path("restricted", 4096) == 64 and t1.max_path(
        "convolutional", 27
    ) == pytest.approx(3)


def test_fit_recovers_a_known_exponent_and_the_crossover_a_known_n() -> None:
    t1 = _table1()
    lengths = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    wobble = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.01, 0.99, 1.0]  # noise, symmetric-ish
    times = [3e-7 * n**1.7 * w for n, w in zip(lengths, wobble)]
    assert t1.fit_exponent(lengths, times) == pytest.approx(1.7, abs=0.02)
    assert t1.fit_exponent([10, 100], [1.0, 100.0]) == pytest.approx(2.0)
    quadratic, linear = [n * n for n in lengths], [700 * n for n in lengths]
    assert t1.crossover(lengths, quadratic, linear) == pytest.approx(700)  # exact in log-log
    assert t1.power_law_crossover(lengths, quadratic, linear) == pytest.approx(700)
    assert t1.crossover(lengths, linear, [2 * x for x in linear]) is None
    assert t1.power_law_crossover(lengths, linear, [2 * x for x in linear]) is None
    # the quick run's failure: nearly parallel fits meet past a float's range: no crossover
    a, b = [0.011146380005811807, 0.01555341600032989], [0.027241576503001852, 0.03798671749973437]
    assert t1.power_law_crossover([32, 64], a, b) is None
    # the last crossing counts: small-n noise crossing twice first is passed over
    assert t1.crossover([1, 2, 4, 8], [1, 4, 1, 4], [2, 2, 2, 2]) == pytest.approx(2**2.5)
    assert t1.fit_lengths([16, 64, 256, 1024], 256) == [256, 1024]
    assert t1.fit_lengths([16, 64, 256], 256) == [64, 256]


def test_quick_run_prints_the_table_json_and_draws(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t1 = _table1()
    threads = torch.get_num_threads()
    summary = t1.main(
        ["--quick", "--threads", "1", "--lengths", "16,32,64", "--output", str(tmp_path)]
    )
    assert torch.get_num_threads() == threads  # put back
    out = capsys.readouterr().out
    assert json.loads(out.strip().splitlines()[-1]) == json.loads(json.dumps(summary))
    assert summary["flops_checked"] is True
    assert set(summary["exponents"]) == set(t1.LAYERS)
    assert all(
        len(v) == 3 and all(t > 0 for t in v) for v in summary["times_ms"]["forward"].values()
    )
    assert "O(n·d²)" in out and "O(n) = 64" in out and "O(n/r)" in out
    png = tmp_path / "table1.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 200_000
    assert all(math.isfinite(e["forward"]) for e in summary["exponents"].values())
