"""The native training kernels (kernels/native/training.cpp, layer_norm.cpp): dropout's
keep-and-scale tensor against SplitMix64 computed in Python, the label-smoothed cross-entropy
with its gradient against a float64 reference and PyTorch's chunked form (training/loss.py),
layer norm and the total norm against float64."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from test_native import _native_or_skip

from transduce.kernels import cross_entropy, dropout, dropout_add, layer_norm, native, total_norm
from transduce.kernels.norm import native_norm_takes
from transduce.training.loss import label_smoothed_nll

dropout_module = importlib.import_module("transduce.kernels.dropout")  # not the function
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _splitmix_draws(seed: int, n: int) -> list[int]:
    """The 16-bit draws of ``training.cpp``: the four quarters (low first) of SplitMix64's words
    mix64(seed + (k + 1) * golden), k = 0, 1, ..., written from its definition."""
    draws = []
    for k in range((n + 3) // 4):
        z = (seed + (k + 1) * _GOLDEN) & _MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        z ^= z >> 31
        draws += [(z >> (16 * q)) & 0xFFFF for q in range(4)]
    return draws[:n]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(7, 1001), (3, 5), (1,)])  # counts no multiple of 4
def test_keep_scale_is_splitmix64_thresholded(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    _native_or_skip()
    like = torch.empty(shape, dtype=dtype)
    scale = torch.tensor(1 / 0.7, dtype=dtype)
    seed = -(2**62) + 12345  # negative as an int64: read as its unsigned bits
    out = native.dropout_keep_scale(like, scale, int(0.3 * 2**16), seed)
    draws = torch.tensor(_splitmix_draws(seed & _MASK, like.numel())).view(shape)
    expected = torch.where(draws >= int(0.3 * 2**16), scale, torch.zeros((), dtype=dtype))
    assert out.dtype == dtype and out.shape == like.shape
    assert torch.equal(out, expected)


def test_keep_scale_is_the_same_on_any_number_of_threads() -> None:
    _native_or_skip()
    like = torch.empty(3, 100_003)  # many blocks of 2,048 draws, a ragged last one
    scale = torch.tensor(1.25)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.dropout_keep_scale(like, scale, 13107, 99)
        torch.set_num_threads(2)
        two = native.dropout_keep_scale(like, scale, 13107, 99)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    assert not torch.equal(one, native.dropout_keep_scale(like, scale, 13107, 100))


def test_keep_scale_thresholds_at_the_ends() -> None:
    _native_or_skip()
    like, scale = torch.empty(4099), torch.tensor(2.0)
    assert torch.equal(native.dropout_keep_scale(like, scale, 0, 5), torch.full((4099,), 2.0))
    assert not native.dropout_keep_scale(like, scale, 65536, 5).any()
    with pytest.raises(RuntimeError, match="threshold"):
        native.dropout_keep_scale(like, scale, 65537, 5)
    with pytest.raises(RuntimeError, match="scale"):
        native.dropout_keep_scale(like, torch.tensor(2.0, dtype=torch.float64), 10, 5)


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_on_the_cpu_takes_the_native_draws_seeded_by_torch(p: float) -> None:
    _native_or_skip()
    x = torch.randn(64, 24, 33, dtype=torch.bfloat16)
    torch.manual_seed(3)
    out = dropout(x, p, training=True)
    torch.manual_seed(3)
    seed = int(torch.empty((), dtype=torch.int64).random_(-(2**63), 2**63 - 1))
    scale = torch.tensor(1 / (1 - p), dtype=x.dtype)
    keep = native.dropout_keep_scale(x, scale, int(p * 2**16), seed)
    assert torch.equal(out, x * keep)
    dropped = (keep == 0).float().mean().item()
    assert dropped == pytest.approx(p, abs=0.01)  # 50,688 draws: ~6 standard deviations


def test_dropout_add_backward_uses_the_same_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    _native_or_skip()
    residual = torch.randn(8, 9, 16, requires_grad=True)
    x = torch.randn(8, 9, 16, requires_grad=True)
    torch.manual_seed(8)
    out = dropout_add(residual, x, 0.25, training=True)
    out.sum().backward()
    assert x.grad is not None
    kept = (out - residual).detach() != 0
    assert torch.equal(x.grad != 0, kept)
    torch.testing.assert_close(x.grad[kept], torch.full_like(x.grad[kept], 1 / 0.75))
    # PyTorch's draws where the kernel is not taken: other masks, the same rate
    monkeypatch.setattr(dropout_module, "_native_takes", lambda x: False)
    torch.manual_seed(8)
    assert not torch.equal(dropout_add(residual, x, 0.25, training=True), out)


# ------------------------------------------------------------------- the smoothed loss


def _reference(
    z: torch.Tensor, target: torch.Tensor, keep: torch.Tensor, eps: float, scale: float
) -> tuple[torch.Tensor, ...]:
    """float64 (lse, z_y, z_sum, grad) from their definitions."""
    z64 = z.double()
    lse = torch.logsumexp(z64, dim=-1)
    z_y = z64.gather(1, target[:, None]).squeeze(1)
    q = torch.full_like(z64, eps / z.size(1))
    q.scatter_add_(1, target[:, None], torch.full((z.size(0), 1), 1 - eps, dtype=torch.float64))
    grad = (torch.softmax(z64, dim=-1) - q) * scale * keep[:, None]
    return lse, z_y, z64.sum(dim=-1), grad


@pytest.mark.parametrize("v", [5, 16, 37, 8003])  # below, at and off the 16 lanes
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_smoothed_cross_entropy_against_float64(v: int, dtype: torch.dtype) -> None:
    _native_or_skip()
    g = torch.Generator().manual_seed(v)
    z = (torch.randn(23, v, generator=g) * 6).to(dtype)
    target = torch.randint(0, v, (23,), generator=g)
    keep = torch.rand(23, generator=g) > 0.2
    grad = torch.full_like(z, 7.0)  # every entry must be written
    lse, z_y, z_sum = native.smoothed_cross_entropy(z, target, keep, 0.1, 3.0, grad)
    ref_lse, ref_y, ref_sum, ref_grad = _reference(z, target, keep, 0.1, 3.0)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-5)
    assert torch.equal(z_y.double(), ref_y)  # a copy of one logit: exact
    torch.testing.assert_close(z_sum.double(), ref_sum, rtol=1e-5, atol=1e-3)
    # float32: a few ulps of the largest entry; bfloat16: one rounding of the float32 value
    tol = {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-6, "rtol": 4e-3}
    torch.testing.assert_close(grad.double(), ref_grad, **tol)
    assert not grad[~keep].any()


def test_smoothed_cross_entropy_in_place_nan_rows_and_bad_targets() -> None:
    _native_or_skip()
    z = torch.randn(4, 50).bfloat16()
    target, keep = torch.tensor([0, 49, 3, 7]), torch.tensor([True, True, False, True])
    apart = torch.empty_like(z)
    expected = native.smoothed_cross_entropy(z, target, keep, 0.2, 1.0, apart)
    inplace = z.clone()
    got = native.smoothed_cross_entropy(inplace, target, keep, 0.2, 1.0, inplace)
    assert torch.equal(inplace, apart)  # the row is read whole before its gradient is written
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
    z[1, 5] = float("nan")
    lse, _, z_sum = native.smoothed_cross_entropy(z, target, keep, 0.2, 1.0, None)
    assert lse[1].isnan() and z_sum[1].isnan() and lse[[0, 2, 3]].isfinite().all()
    with pytest.raises(RuntimeError, match="not a column"):
        native.smoothed_cross_entropy(z, torch.tensor([0, 50, 1, 1]), keep, 0.2, 1.0, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_training_loss_is_the_chunked_one_within_rounding(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    _native_or_skip()
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(6, 9, 301, generator=g) * 4).to(dtype)
    target = torch.randint(0, 301, (6, 9), generator=g)
    target[1, 4:] = -1  # padding

    def run() -> tuple[torch.Tensor, ...]:
        z = logits.clone().requires_grad_()
        sums = label_smoothed_nll(z, target, epsilon=0.1, ignore_index=-1, grad_scale=2.0)
        (sums.loss * 2.0).backward()
        assert z.grad is not None
        return sums.loss.detach(), sums.nll.detach(), z.grad

    calls: list[int] = []
    real = cross_entropy.native_smoothed_rows

    def spy(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cross_entropy, "native_smoothed_rows", spy)
    native_out = run()
    assert calls  # the CPU took the kernel
    monkeypatch.setattr(cross_entropy, "native_takes", lambda logits: False)
    chunked = run()
    assert len(calls) == 1
    torch.testing.assert_close(native_out[0], chunked[0], rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(native_out[1], chunked[1], rtol=1e-5, atol=1e-3)
    tol = {} if dtype == torch.float32 else {"atol": 1e-6, "rtol": 4e-3}
    torch.testing.assert_close(native_out[2].float(), chunked[2].float(), **tol)
    assert not native_out[2][1, 4:].any()


# --------------------------------------------------------------- layer norm, total norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [7, 16, 512])
def test_layer_norm_forward_and_backward_against_float64(dtype: torch.dtype, d: int) -> None:
    _native_or_skip()
    g = torch.Generator().manual_seed(d)
    x = (torch.randn(5, 41, d, generator=g) * 3 + 1).to(dtype).requires_grad_()
    w = (torch.randn(d, generator=g) + 1).to(dtype).requires_grad_()
    b = torch.randn(d, generator=g).to(dtype).requires_grad_()
    grad = torch.randn(5, 41, d, generator=g).to(dtype)
    y = layer_norm(x, (d,), w, b, 1e-5)
    assert y.grad_fn is not None and type(y.grad_fn).__name__.startswith("_NativeLayerNorm")
    y.backward(grad)
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    y64 = F.layer_norm(leaves[0], (d,), leaves[1], leaves[2], 1e-5)
    y64.backward(grad.double())
    # float32: within rounding; bfloat16: one rounding of a float32 result (dw and db are sums
    # of 205 rows, each of them rounded once, not at every addition)
    tol = {"atol": 2e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 8e-3}
    torch.testing.assert_close(y.double(), y64, **tol)
    for ours, ref in zip((x.grad, w.grad, b.grad), (t.grad for t in leaves), strict=True):
        assert ours is not None and ours.dtype == dtype
        torch.testing.assert_close(ours.double(), ref, **tol)


def test_layer_norm_is_pytorchs_where_the_kernel_does_not_apply() -> None:
    x = torch.randn(3, 8, requires_grad=True)
    w, b = torch.ones(8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64)
    y = layer_norm(x, (8,), w.float(), b.float(), 1e-5)  # float32, grad wanted: native
    with torch.no_grad():  # inference: PyTorch's
        assert torch.equal(layer_norm(x, (8,), w.float(), b.float(), 1e-5), F.layer_norm(x, (8,)))
    x64 = x.detach().double().requires_grad_()
    out = layer_norm(x64, (8,), w, b, 1e-5)  # float64: PyTorch's
    assert type(out.grad_fn).__name__ == "NativeLayerNormBackward0"  # PyTorch's
    torch.testing.assert_close(y, F.layer_norm(x, (8,)), atol=1e-6, rtol=1e-6)


def test_layer_norm_weight_gradient_is_the_same_on_any_number_of_threads() -> None:
    _native_or_skip()
    x = torch.randn(1000, 64).bfloat16()
    w, b = torch.randn(64).bfloat16(), torch.randn(64).bfloat16()
    g = torch.randn(1000, 64).bfloat16()
    _, mean, rstd = native.layer_norm(x, w, b, 1e-5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.layer_norm_backward(g, x, mean, rstd, w)
        torch.set_num_threads(2)
        two = native.layer_norm_backward(g, x, mean, rstd, w)
    finally:
        torch.set_num_threads(threads)
    for a, c in zip(one, two, strict=True):
        assert torch.equal(a, c)


def test_total_norm_against_float64_and_overflow() -> None:
    _native_or_skip()
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(s, generator=g) for s in [(300, 7), (16,), (1,), (40_001,)]]
    exact = torch.cat([t.double().flatten() for t in tensors]).norm()
    norm = total_norm(tensors)
    assert norm.dtype == torch.float32 and norm.dim() == 0
    assert abs(norm.item() - exact.item()) <= 1e-6 * exact.item()
    assert torch.equal(norm, native.sum_of_squares(tensors).sqrt().float())
    # squares past float32's range are summed in float64: the norm of [3e20, 4e20] is 5e20
    assert total_norm([torch.tensor([3e20, 4e20])]).item() == pytest.approx(5e20, rel=1e-6)
    assert total_norm([torch.tensor([1.0, float("nan")])]).isnan()
    assert total_norm([torch.tensor([1.0, float("inf")])]).isinf()


def _overwriting_loss(logits: torch.Tensor) -> torch.Tensor:
    """The smoothed loss of logits (2, 3, V) against target 0, its gradient written into them."""
    target = torch.zeros(2, 3, dtype=torch.long)
    return label_smoothed_nll(
        logits, target, epsilon=0.1, ignore_index=-1, overwrite_logits=True
    ).loss


def test_logits_overwritten_in_place_are_refused_to_an_op_that_saved_them() -> None:
    # the kernel writes the gradient into the logits behind autograd's back: their version is
    # bumped, so tanh (which saved its output) refuses, as with PyTorch's chunked form
    _native_or_skip()
    h = torch.randn(2, 3, 11, requires_grad=True)
    logits = torch.tanh(h) * 1.0  # a product: saves nothing, may be overwritten
    _overwriting_loss(logits).backward()
    assert h.grad is not None and h.grad.isfinite().all()
    saved = torch.tanh(torch.randn(2, 3, 11, requires_grad=True))  # tanh saved this output
    before = saved._version
    loss = _overwriting_loss(saved)
    assert saved._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_the_native_paths_step_aside_for_empty_rows_sparse_and_second_derivatives() -> None:
    _native_or_skip()
    x = torch.randn(3, 0, requires_grad=True)
    assert layer_norm(x, (0,), torch.ones(0), torch.zeros(0), 1e-5).shape == (3, 0)
    sparse = torch.zeros(5).to_sparse()  # PyTorch's norm takes none either: not ours to take
    assert not native_norm_takes([sparse]) and native_norm_takes([torch.zeros(5)])
    y = torch.randn(4, 8, requires_grad=True)
    (dx,) = torch.autograd.grad(
        layer_norm(y, (8,), torch.ones(8), torch.zeros(8), 1e-5).pow(2).sum(),
        y,
        create_graph=True,
    )
    with pytest.raises(RuntimeError, match="once_differentiable|marked with @once_differentiable"):
        dx.sum().backward()


def test_layer_norm_of_a_diverged_row_is_nan_not_the_bias() -> None:
    # squares past float32's range: rstd 0 would give y = b, finite, and hide the divergence
    _native_or_skip()
    x = torch.ones(3, 64)
    x[1] = torch.linspace(-1e20, 1e20, 64)
    x = x.requires_grad_()
    y = layer_norm(x, (64,), torch.ones(64), torch.zeros(64), 1e-5)
    assert y[1].isnan().all() and y[[0, 2]].isfinite().all()


def test_the_norm_of_bfloat16_gradients_is_that_of_their_float32_copy() -> None:
    # bf16-weights' one-pass update takes the norm of the working copy's gradients
    _native_or_skip()
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(s, generator=g).bfloat16() for s in [(300, 7), (16,), (40_001,)]]
    assert native_norm_takes(grads)
    assert torch.equal(total_norm(grads), total_norm([t.float() for t in grads]))
    assert total_norm([torch.tensor([1.0, float("nan")]).bfloat16()]).isnan()
