"""The native float32 product (kernels/native/f32_gemm.cpp): x W^T + b (ReLU'd) against W's
panels, the formula's numbers within float32 rounding, each row's result the same whatever the
other rows, shapes off its blocks."""

from __future__ import annotations

import pytest
import torch
from test_native import _native_or_skip

from transduce.kernels import matmul as matmul_module
from transduce.kernels import native
from transduce.kernels import projection as projection_module
from transduce.kernels.matmul import use_native_f32
from transduce.kernels.projection import Projection, ProjectionLayout


@pytest.fixture(autouse=True)
def _built() -> None:
    _native_or_skip()
    if not native.f32_gemm_available():
        pytest.skip("the native float32 product is built for CPUs with AVX-512 only")


def _reference(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, relu: bool
) -> torch.Tensor:
    y = x.double() @ w.double().t()  # (N, out) in float64
    if b is not None:
        y = y + b.double()
    return y.relu() if relu else y


@pytest.mark.parametrize(
    ("out_f", "in_f"), [(1, 1), (31, 7), (32, 16), (33, 256), (100, 65), (768, 256), (256, 1024)]
)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_the_formula_within_float32_rounding(out_f: int, in_f: int, bias: bool, relu: bool) -> None:
    g = torch.Generator().manual_seed(out_f * 1000 + in_f)
    w = torch.randn(out_f, in_f, generator=g)
    b = torch.randn(out_f, generator=g) if bias else None
    packed = native.f32_pack(w)
    assert packed.shape == (-(-out_f // 32), in_f, 32)
    for n in (1, 5, 11, 12, 13, 25, 40):  # row counts on and off the 12-row blocks
        x = torch.randn(n, in_f, generator=g)
        y = native.f32_linear(x, packed, b, out_f, relu)
        assert y.shape == (n, out_f) and y.dtype == torch.float32
        ref = _reference(x, w, b, relu)
        # sums of in_f products: the error grows with the terms' magnitudes, not the sum's
        bound = (x.double().abs() @ w.double().abs().t() + 1) * in_f * 2e-7
        assert ((y.double() - ref).abs() <= bound).all(), (n, (y.double() - ref).abs().max())


def test_a_rows_result_does_not_depend_on_the_other_rows() -> None:
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(300, 256, generator=g), torch.randn(300, generator=g)
    packed = native.f32_pack(w)
    x = torch.randn(37, 256, generator=g) * torch.logspace(-3, 3, 37)[:, None]
    whole = native.f32_linear(x, packed, b, 300, False)
    for i in (0, 11, 12, 36):
        for rows in (x[i : i + 1], x[max(0, i - 5) : i + 1]):
            alone = native.f32_linear(rows, packed, b, 300, False)
            assert torch.equal(alone[-1], whole[i])


def test_strided_rows_and_no_rows() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(40, 64, generator=g)
    packed = native.f32_pack(w)
    wide = torch.randn(9, 100, generator=g)
    cols = wide[:, 10:74]  # rows 100 apart
    assert torch.equal(
        native.f32_linear(cols, packed, None, 40),
        native.f32_linear(cols.contiguous(), packed, None, 40),
    )
    t = torch.randn(64, 9, generator=g).t()  # (9, 64), columns 9 apart
    assert torch.equal(
        native.f32_linear(t, packed, None, 40), native.f32_linear(t.contiguous(), packed, None, 40)
    )
    assert native.f32_linear(wide[:0, :64], packed, None, 40).shape == (0, 40)


def test_bad_operands_are_refused() -> None:
    packed = native.f32_pack(torch.randn(40, 64))
    with pytest.raises(RuntimeError, match="width"):
        native.f32_linear(torch.randn(3, 65), packed, None, 40)
    with pytest.raises(RuntimeError, match="width"):
        native.f32_linear(torch.randn(3, 64), packed, None, 70)
    with pytest.raises(RuntimeError, match="bias"):
        native.f32_linear(torch.randn(3, 64), packed, torch.randn(39), 40)
    with pytest.raises(RuntimeError, match="float32"):
        native.f32_pack(torch.randn(4, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="one input or more"):
        native.f32_linear(torch.randn(3, 0), native.f32_pack(torch.randn(4, 0)), None, 4)


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
def test_the_native_projection_is_x_w_t_plus_b_at_every_row_count(parts: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(parts)
    w = torch.randn(70, 48, generator=g)
    b = torch.randn(70, generator=g) if bias else None
    proj = Projection.of(w, b, ProjectionLayout(one_row_parts=parts, native=True))
    assert proj.panels is not None and proj.weight_t is None and proj.weight is None
    assert (proj.blocks is None) == (parts == 1)  # one row through the column blocks if split
    for rows in (0, 1, 2, 13):
        x = torch.randn(rows, 48, generator=g)
        expected = x @ w.t() + (0 if b is None else b)
        torch.testing.assert_close(proj(x), expected, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(proj.relu(x), expected.relu(), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    ("vendor", "dtype", "matmul", "expected"),
    [
        ("GenuineIntel", torch.float32, "auto", True),
        ("GenuineIntel", torch.float32, "mkl", False),
        ("GenuineIntel", torch.float32, "onednn", False),
        ("GenuineIntel", torch.bfloat16, "auto", False),
        ("AuthenticAMD", torch.float32, "auto", False),  # unmeasured there: oneDNN stays
        ("", torch.float32, "auto", False),
    ],
)
def test_auto_takes_the_native_product_on_intel_cpus(
    monkeypatch: pytest.MonkeyPatch, vendor: str, dtype: torch.dtype, matmul: str, expected: bool
) -> None:
    monkeypatch.setattr(matmul_module, "_cpu_vendor", lambda: vendor)
    monkeypatch.setattr(matmul_module, "onednn_available", lambda: True)
    weight = torch.zeros(4, 3, dtype=dtype)
    assert use_native_f32(matmul, weight) is expected  # type: ignore[arg-type]
    layout = ProjectionLayout.choose(weight, matmul)  # type: ignore[arg-type]
    assert layout.native is expected and not (layout.native and layout.onednn)
    monkeypatch.setattr(native, "f32_gemm_available", lambda: False)  # a CPU without AVX-512
    assert use_native_f32(matmul, weight) is False  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        ProjectionLayout(onednn=True, native=True)


def test_the_engine_on_the_native_product_decodes_as_on_mkl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # whatever this CPU's vendor: the engine made with the native product against one on MKL
    from model_testkit import tiny_batch, tiny_model

    from transduce.inference import beam_search, greedy_search
    from transduce.inference.engine import DecodingModel

    model = tiny_model()
    src, _ = tiny_batch()
    with monkeypatch.context() as m:
        m.setattr(projection_module, "use_native_f32", lambda matmul, weight: True)
        ours = DecodingModel(model)
    mkl = DecodingModel(model, matmul="mkl")
    assert ours.layout.native and not mkl.layout.native
    calls: list[bool] = []
    real = native.f32_linear

    def counted(*args: object, **kw: object) -> torch.Tensor:
        calls.append(bool(kw.get("relu", False)))
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(native, "f32_linear", counted)
    with torch.no_grad():
        assert greedy_search(ours, src, max_len=8) == greedy_search(mkl, src, max_len=8)
        beams = zip(
            beam_search(ours, src, beam=4, max_len=8),
            beam_search(mkl, src, beam=4, max_len=8),
            strict=True,
        )
        for a, b in beams:
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
    assert calls and any(calls)  # the products on the panels, the FFN's with its ReLU


def test_more_threads_than_panels_split_the_rows_too() -> None:
    # a narrow W (2 panels) over 100 rows: from 3 threads the grid splits the row blocks as
    # well; every split gives the same numbers (a row's sums do not depend on the others)
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(40, 64, generator=g), torch.randn(40, generator=g)
    packed, x = native.f32_pack(w), torch.randn(100, 64, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = native.f32_linear(x, packed, b, 40, True)
        for t in (2, 3, 5, 8, 40):
            # other numbers, every row written (one thread), in the memory that the next
            # call's output is likely to reuse: a row the split skips shows
            torch.set_num_threads(1)
            native.f32_linear(x * 2, packed, b, 40, True)
            torch.set_num_threads(t)
            assert torch.equal(native.f32_linear(x, packed, b, 40, True), alone), t
    finally:
        torch.set_num_threads(threads)


def test_relu_keeps_a_nan_as_torch_relu_does() -> None:
    w = torch.randn(8, 4)
    x = torch.tensor([[float("nan"), 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]])
    y = native.f32_linear(x, native.f32_pack(w), None, 8, True)
    assert y[0].isnan().all() and not y[1].isnan().any()
