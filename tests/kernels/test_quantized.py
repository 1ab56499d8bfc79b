"""int8 projections: per-channel weights, the int8 kernel against float references, and the rule
of where int8 may run (CPU flags, the forcing variable, the device)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transduce.kernels import quantized
from transduce.kernels.projection import (
    INT8_ONE_ROW_MIN_ELEMENTS,
    Int8Projection,
    Projection,
    ProjectionLayout,
)
from transduce.kernels.quantized import int8_refusal, quantize_weight

# rows that are exactly a scale times integers in [-127, 127], each row's largest 127
W_EXACT = torch.tensor([[127.0, -3, 10, 0], [1, -127, 64, 2]]) * torch.tensor([[0.5], [0.25]])


def test_weights_quantise_per_output_channel() -> None:
    q = quantize_weight(W_EXACT)
    assert q.weight.dtype == torch.int8
    assert q.weight.tolist() == [[127, -3, 10, 0], [1, -127, 64, 2]]
    assert q.scale.tolist() == [0.5, 0.25]
    assert torch.equal(q.dequantized(), W_EXACT)
    zero = quantize_weight(torch.zeros(2, 3))  # a row of zeros: scale 1, not 0/127
    assert zero.scale.tolist() == [1.0, 1.0] and not zero.weight.any()


def test_weight_error_is_at_most_half_a_step() -> None:
    w = torch.randn(50, 40, generator=torch.Generator().manual_seed(0))
    q = quantize_weight(w)
    assert q.weight.abs().amax(1).eq(127).all()  # each row's largest maps to 127
    assert ((q.dequantized() - w).abs() <= q.scale[:, None] / 2 + 1e-7).all()


def test_a_hand_checked_product_is_exact() -> None:
    # x spans [-1.28, 1.27] in steps of 0.01: 256 levels, so its 8-bit quantisation is exact too
    x = torch.tensor([[-1.28, 1.27, 0.5, 0.0]])
    b = torch.tensor([0.5, -1.0])
    # 0.5 (127 * -1.28 - 3 * 1.27 + 10 * 0.5) + 0.5 = -80.185; 0.25 (-1.28 - 127 * 1.27 + 32) - 1
    expected = torch.tensor([[-80.185, -33.6425]])
    proj = Projection.of(W_EXACT, b, ProjectionLayout(int8=True))
    assert isinstance(proj, Int8Projection)
    torch.testing.assert_close(proj(x), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("rows", [1, 4, 33])
def test_products_on_the_quantisation_grids_are_exact(rows: int) -> None:
    # W: integers in [-127, 127] times a scale a row (each row's largest 127); x: hundredths
    # spanning [-1.28, 1.27] (256 levels): both quantise exactly, so the int8 product is x W^T
    g = torch.Generator().manual_seed(rows)
    ints = torch.randint(-127, 128, (70, 48), generator=g).float()
    ints[:, 0] = 127
    w = ints * torch.rand(70, 1, generator=g)
    x = torch.randint(-128, 128, (rows, 48), generator=g) * 0.01
    x[0, :2] = torch.tensor([-1.28, 1.27])
    b = torch.randn(70, generator=g)
    y = Int8Projection.quantized(w, b)(x)
    torch.testing.assert_close(y, x @ w.t() + b, atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 4, 33])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_projection_error_is_bounded_by_the_quantisation_steps(rows: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(70, 48, generator=g), torch.randn(rows, 48, generator=g)
    b = torch.randn(70, generator=g) if bias else None
    y = Int8Projection.quantized(w, b)(x)
    exact = x @ w.t() + (0 if b is None else b)
    q = quantize_weight(w)
    # |x W^T - x_q W_q^T| <= sum_j |x_j| |dW_ij| + |W_ij| |dx_j| (+ their product): half a step of
    # W's row i, and half of x's step (at most its range / 255, 8 bits)
    x_step = float(x.max().clamp(min=0) - x.min().clamp(max=0)) / 255
    bound = (
        x.abs().sum(1, keepdim=True) * q.scale / 2
        + (w.abs().sum(1) * x_step / 2)
        + 48 * q.scale * x_step / 4
    )  # (rows, 70)
    assert ((y - exact).abs() <= bound + 1e-4).all()
    assert (y - exact).abs().max() > 0  # it is int8: not the float product by accident
    assert y.shape == (rows, 70) and y.dtype == torch.float32


def test_int8_layout_takes_float32_cpu_weights_only() -> None:
    w = torch.zeros(6, 4)
    layout = ProjectionLayout.choose(w, int8=True)
    assert layout.int8 and dataclasses.replace(layout, int8=False) == ProjectionLayout.choose(w)
    with pytest.raises(ValueError, match="float32 CPU weights"):
        ProjectionLayout.choose(w.bfloat16(), int8=True)


def test_one_row_against_a_small_weight_stays_float32() -> None:
    g = torch.Generator().manual_seed(0)
    small, large = (torch.randn(out, 256, generator=g) for out in (512, 1024))
    assert small.numel() < INT8_ONE_ROW_MIN_ELEMENTS <= large.numel()
    layout = ProjectionLayout.choose(small, int8=True)
    for w in (small, large):
        b = torch.randn(w.size(0), generator=g)
        proj = Projection.of(w, b, layout)
        assert isinstance(proj, Int8Projection)
        many = Projection.of(w, b, layout, one_row=False)  # one row as many: int8
        assert isinstance(many, Int8Projection) and many.float_one_row is None
        x = torch.randn(3, 256, generator=g)
        exact = x @ w.t() + b
        one = proj(x[:1])
        if w is small:  # float32 for one row, int8 for more
            torch.testing.assert_close(one, exact[:1], atol=1e-4, rtol=1e-5)
            assert not torch.allclose(proj(x)[:1], exact[:1], atol=1e-4)
        else:  # int8 for every row count
            assert proj.float_one_row is None
            assert not torch.allclose(one, exact[:1], atol=1e-4)


def test_int8_runs_where_the_cpu_has_int8_dot_products(monkeypatch) -> None:
    monkeypatch.delenv(quantized.FORCE_VARIABLE, raising=False)
    for flags in ({"avx512_vnni"}, {"avx_vnni"}, {"amx_int8", "avx512f"}):
        monkeypatch.setattr(quantized, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert int8_refusal(torch.device("cpu")) is None
    monkeypatch.setattr(quantized, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    why = int8_refusal(torch.device("cpu"))
    assert why is not None and "TRANSDUCE_FORCE_INT8=1" in why and "\n" not in why
    monkeypatch.setenv(quantized.FORCE_VARIABLE, "1")
    assert int8_refusal(torch.device("cpu")) is None


def test_int8_is_refused_off_the_cpu() -> None:
    why = int8_refusal(torch.device("cuda", 0))
    assert why == "int8 decoding runs on CPUs; use fp32 or bf16 on cuda"


def test_cpu_flags_are_read_from_proc_cpuinfo() -> None:
    flags = quantized.cpu_flags()
    assert isinstance(flags, frozenset)
    assert set(quantized.cpu_int8_flags()) <= set(quantized.INT8_DOT_FLAGS)
