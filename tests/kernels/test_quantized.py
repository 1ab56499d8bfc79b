"""int8 projections: per-channel weights, the int8 kernel against float references, and the rule
of where int8 may run (CPU flags, the forcing variable, the device)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transduce.kernels import quantized
from transduce.kernels.projection import Int8Projection, Projection, ProjectionLayout
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


# 8-bit activations need int8 dot products; without them fbgemm quantises x to 7 bits
EIGHT_BITS = pytest.mark.skipif(
    quantized._reduce_range(), reason="this CPU lacks int8 dot products: x gets 7 bits"
)


@EIGHT_BITS
def test_a_hand_checked_product_is_exact() -> None:
    # x's row over its largest magnitude, 1.27, is k / 127 for k = -127, 127, 50, 0: on the grid
    x = torch.tensor([[-1.27, 1.27, 0.5, 0.0]])
    b = torch.tensor([0.5, -1.0])
    # 0.5 (127 * -1.27 - 3 * 1.27 + 10 * 0.5) + 0.5 = -79.55; 0.25 (-1.27 - 127 * 1.27 + 32) - 1
    expected = torch.tensor([[-79.55, -33.64]])
    proj = Projection.of(W_EXACT, b, ProjectionLayout(int8=True))
    assert isinstance(proj, Int8Projection)
    torch.testing.assert_close(proj(x), expected, atol=1e-4, rtol=0)


@EIGHT_BITS
@pytest.mark.parametrize("rows", [1, 4, 33])
def test_products_on_the_quantisation_grids_are_exact(rows: int) -> None:
    # W: integers in [-127, 127] times a scale a row (each row's largest 127); x: integers in
    # [-127, 127] times a scale a row, rows of magnitudes 100x apart (each row's largest 127): both
    # quantise exactly, each row of x on its own grid, so the int8 product is x W^T
    g = torch.Generator().manual_seed(rows)
    ints = torch.randint(-127, 128, (70, 48), generator=g).float()
    ints[:, 0] = 127
    w = ints * torch.rand(70, 1, generator=g)
    k = torch.randint(-127, 128, (rows, 48), generator=g).float()
    k[:, 1] = -127
    x = k * torch.logspace(-2, 0, rows)[:, None]
    b = torch.randn(70, generator=g)
    y = Int8Projection.quantized(w, b)(x)
    expected = x @ w.t() + b
    torch.testing.assert_close(y, expected, atol=1e-6 * float(expected.abs().max()), rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 4, 33])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_projection_error_is_bounded_by_the_quantisation_steps(rows: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(70, 48, generator=g)
    x = torch.randn(rows, 48, generator=g) * torch.logspace(-1, 1, rows)[:, None]
    b = torch.randn(70, generator=g) if bias else None
    y = Int8Projection.quantized(w, b)(x)
    exact = x @ w.t() + (0 if b is None else b)
    q = quantize_weight(w)
    # |x W^T - x_q W_q^T| <= sum_j |x_j| |dW_ij| + |W_ij| |dx_j| (+ their product): half a step of
    # W's row i, and half of x's row's step (its largest magnitude / 127; 7 bits: about twice)
    levels = 127 / 2.01 if quantized._reduce_range() else 127
    x_step = x.abs().amax(1, keepdim=True) / levels  # (rows, 1)
    bound = (
        x.abs().sum(1, keepdim=True) * q.scale / 2
        + w.abs().sum(1) * x_step / 2
        + 48 * q.scale * x_step / 4
    )  # (rows, 70)
    assert ((y - exact).abs() <= bound + 1e-4).all()
    assert (y - exact).abs().max() > 0  # it is int8: not the float product by accident
    assert y.shape == (rows, 70) and y.dtype == torch.float32


@pytest.mark.parametrize("bias", [True, False])
def test_a_rows_result_does_not_depend_on_the_other_rows(bias: bool) -> None:
    # each row alone, and in batches of other rows (of other magnitudes, a row of zeros among
    # them): bit for bit the same, so a sentence's int8 translation is the same in any batch
    g = torch.Generator().manual_seed(3)
    w = torch.randn(300, 64, generator=g)
    b = torch.randn(300, generator=g) if bias else None
    x = torch.randn(40, 64, generator=g) * torch.logspace(-3, 2, 40)[:, None]
    x[7] = 0.0
    proj = Int8Projection.quantized(w, b)
    alone = torch.cat([proj(x[i : i + 1]) for i in range(40)])
    for rows in (list(range(40)), list(range(39, -1, -1)), [5, 6, 7, 8], [30, 2, 39]):
        assert torch.equal(proj(x[rows]), alone[rows])
    assert torch.equal(alone[7], torch.zeros(300) if b is None else b)


def _hard_product(
    shape: tuple[int, int], bias: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """W (out, in), b (out,) or None and x (70, in): rows of magnitudes 10^5 apart, a row of
    zeros (7), ReLU'd rows (10-19), rows whose scaled entries are halves (20-23: ties); W of
    mean 1 at 4096 inputs, so that sums with the ReLU'd rows pass 2^24."""
    out_f, in_f = shape
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g) + (1.0 if in_f == 4096 else 0.0)
    b = torch.randn(out_f, generator=g) if bias else None
    x = torch.randn(70, in_f, generator=g) * torch.logspace(-3, 2, 70)[:, None]
    x[7] = 0.0
    x[10:20] = x[10:20].relu()
    halves = torch.randint(-126, 126, (4, in_f), generator=g) + 0.5
    halves[:, 0] = 127.0  # each row's largest 127: its unit is 1, its entries stay halves
    x[20:24] = halves
    return w, b, x


AMX_INT8 = pytest.mark.skipif(
    not quantized.onednn_int8_available(),
    reason="oneDNN's int8 kernel runs only where the CPU has AMX's int8 tiles (amx_int8)",
)


@AMX_INT8
@pytest.mark.parametrize("shape", [(300, 64), (768, 256), (512, 2048), (64, 4096)])
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_and_fbgemm_give_the_same_numbers_bit_for_bit(shape, bias: bool) -> None:
    # the engine's row count picks the kernel (ONEDNN_MIN_ROWS): a sentence's translation must not
    # depend on it. Rows of magnitudes 10^5 apart, a row of zeros, ReLU'd rows, and rows whose
    # scaled entries are halves (ties: both round to even). Weights of mean 1 against ReLU'd rows
    # at 4096 inputs make int32 sums past 2^24, where a float32 step would round (with uint8 and
    # a zero point, oneDNN took the zero point's term off in float32: 8,000 elements differed)
    w, b, x = _hard_product(shape, bias, seed=shape[0])
    q = quantize_weight(w)
    packed, onednn = quantized.fbgemm_packed(q, None), quantized.OnednnInt8.of(q)
    for rows in (slice(0, 70), slice(20, 24), slice(7, 8), slice(30, 62)):
        fb = quantized.fbgemm_linear_rows(x[rows], packed, b)
        dnn = quantized.onednn_linear_rows(x[rows], onednn, b)
        assert torch.equal(fb, dnn), (rows, (fb - dnn).abs().max())


def test_many_rows_take_onednn_where_it_runs_amx(monkeypatch) -> None:
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(quantized, "onednn_int8_available", lambda: True)
    monkeypatch.setattr(
        quantized.OnednnInt8, "of", classmethod(lambda cls, q: cls(q.weight, q.scale, q.scale))
    )
    from transduce.kernels import projection

    def record(name):
        return lambda x, w, b: calls.append((name, x.size(0))) or torch.zeros(x.size(0), 5)

    monkeypatch.setattr(projection, "amx_int8_available", lambda: False)  # (its own test)
    monkeypatch.setattr(projection, "onednn_int8_available", lambda: True)
    monkeypatch.setattr(projection, "onednn_linear_rows", record("onednn"))
    monkeypatch.setattr(projection, "fbgemm_linear_rows", record("fbgemm"))
    proj = Int8Projection.quantized(torch.randn(5, 8), None)
    assert proj.onednn is not None
    for rows in (1, quantized.ONEDNN_MIN_ROWS - 1, quantized.ONEDNN_MIN_ROWS, 640):
        proj(torch.randn(rows, 8))
    n = quantized.ONEDNN_MIN_ROWS
    assert calls == [("fbgemm", 1), ("fbgemm", n - 1), ("onednn", n), ("onednn", 640)]
    monkeypatch.setattr(projection, "onednn_int8_available", lambda: False)
    assert Int8Projection.quantized(torch.randn(5, 8), None).onednn is None


AMX_KERNEL = pytest.mark.skipif(
    not quantized.amx_int8_available(),
    reason="our int8 kernel runs only where the CPU has AMX's int8 tiles and the kernels built",
)


@AMX_KERNEL
@pytest.mark.parametrize("shape", [(300, 64), (768, 256), (33, 70), (5, 2), (64, 4096)])
@pytest.mark.parametrize("bias", [True, False])
def test_the_amx_kernel_and_fbgemm_give_the_same_numbers_bit_for_bit(shape, bias: bool) -> None:
    """Widths and output counts off the tiles' 64 and 16, the rows of the oneDNN test above
    (magnitudes 10^5 apart, zeros, ReLU'd, halves, sums past 2^24), row counts off 16."""
    w, b, x = _hard_product(shape, bias, seed=sum(shape))
    out_f = shape[0]
    q = quantize_weight(w)
    packed, amx = quantized.fbgemm_packed(q, None), quantized.AmxInt8.of(q)
    for rows in (slice(0, 70), slice(20, 24), slice(7, 8), slice(30, 62), slice(3, 36)):
        fb = quantized.fbgemm_linear_rows(x[rows], packed, b)
        ours = quantized.amx_linear_rows(x[rows], amx, b)
        assert torch.equal(fb, ours), (rows, (fb - ours).abs().max())
    assert quantized.amx_linear_rows(x[:0], amx, b).shape == (0, out_f)


def test_every_row_count_takes_the_amx_kernel_where_it_runs(monkeypatch) -> None:
    calls: list[int] = []
    from transduce.kernels import projection

    monkeypatch.setattr(projection, "amx_int8_available", lambda: True)
    monkeypatch.setattr(
        quantized.AmxInt8, "of", classmethod(lambda cls, q: cls(q.weight, q.scale, 5))
    )
    monkeypatch.setattr(
        projection, "amx_linear_rows", lambda x, w, b: calls.append(x.size(0)) or torch.zeros(1)
    )
    proj = Int8Projection.quantized(torch.randn(5, 8), None)
    assert proj.amx is not None and proj.packed is None and proj.onednn is None  # one copy
    for rows in (1, quantized.ONEDNN_MIN_ROWS, 640):
        proj(torch.randn(rows, 8))
    assert calls == [1, quantized.ONEDNN_MIN_ROWS, 640]
    monkeypatch.setattr(quantized, "cpu_flags", lambda: frozenset({"avx512_vnni", "avx2"}))
    assert not quantized.amx_int8_available()


def test_onednn_int8_needs_amx(monkeypatch) -> None:
    quantized.onednn_int8_available.cache_clear()
    try:
        monkeypatch.setattr(quantized, "cpu_flags", lambda: frozenset({"avx512_vnni", "avx2"}))
        assert not quantized.onednn_int8_available()
    finally:
        quantized.onednn_int8_available.cache_clear()


def test_a_row_of_tiny_values_leaves_the_others_as_they_are() -> None:
    # a row whose largest magnitude is just above the smallest normal float: its unit (max / 127)
    # would be subnormal, and x / unit then reached 127.001, past the guard row's range, which
    # changed fbgemm's quantisation of every row of the batch
    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(40, 32, generator=g), torch.randn(2, 32, generator=g)
    x[1] = torch.linspace(-1, 1, 32) * 1.5 * torch.finfo(torch.float32).tiny
    proj = Int8Projection.quantized(w, None)
    assert torch.equal(proj(x)[0], proj(x[:1])[0])
    assert (x[1].abs() / quantized.row_units(x[1:])).max() <= 127


def test_int8_projections_need_two_inputs() -> None:
    with pytest.raises(ValueError, match="2 or more inputs"):
        Int8Projection.quantized(torch.ones(3, 1), None)


def test_int8_layout_takes_float32_cpu_weights_only() -> None:
    w = torch.zeros(6, 4)
    layout = ProjectionLayout.choose(w, int8=True)
    assert layout.int8 and dataclasses.replace(layout, int8=False) == ProjectionLayout.choose(w)
    with pytest.raises(ValueError, match="float32 CPU weights"):
        ProjectionLayout.choose(w.bfloat16(), int8=True)


def test_one_row_takes_the_int8_kernel_for_every_weight() -> None:
    # no float32 path for one row (it would part a sentence decoded alone from the same sentence
    # in a batch): one row's result is its result among others
    g = torch.Generator().manual_seed(0)
    for out in (16, 1024):
        w, b = torch.randn(out, 256, generator=g), torch.randn(out, generator=g)
        proj = Projection.of(w, b, ProjectionLayout.choose(w, int8=True))
        assert isinstance(proj, Int8Projection)
        x = torch.randn(3, 256, generator=g)
        assert torch.equal(proj(x[:1]), proj(x)[:1])
        assert not torch.allclose(proj(x[:1]), x[:1] @ w.t() + b, atol=1e-4)


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
