"""linear(): x W^T + b through MKL (F.linear) or oneDNN, with the same values and gradients, and
the rule that picks the library."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transduce.kernels import Linear, stacked_linear
from transduce.kernels import matmul as linear_module
from transduce.kernels.matmul import (
    linear,
    onednn_available,
    onednn_linear,
    onednn_packed,
    use_onednn,
)

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="no oneDNN in this PyTorch")


@needs_onednn
@pytest.mark.parametrize("shape", [(5, 16), (2, 7, 16), (0, 16)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("out_features", [24, 1100])  # 1100 x 16 ... the large-weight branch too
def test_onednn_values_and_gradients_equal_f_linear(
    shape: tuple[int, ...], bias: bool, out_features: int
) -> None:
    g = torch.Generator().manual_seed(len(shape) + out_features)
    in_f = shape[-1]
    if out_features == 1100:  # past the size where the weight gradient goes back to MKL
        in_f, shape = 1000, (*shape[:-1], 1000)
    w = torch.randn(out_features, in_f, generator=g, requires_grad=True)
    b = torch.randn(out_features, generator=g, requires_grad=True) if bias else None
    x = torch.randn(shape, generator=g, requires_grad=True)
    grad = torch.randn(*shape[:-1], out_features, generator=g)
    results = {}
    for mode in ("mkl", "onednn"):
        out = linear(x, w, b, mode)
        params = [x, w] + ([b] if bias else [])
        grads = torch.autograd.grad(out, params, grad, allow_unused=False)
        results[mode] = (out.detach(), grads)
    reference = F.linear(x, w, b).detach()
    torch.testing.assert_close(results["onednn"][0], reference, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(results["onednn"][0], results["mkl"][0], atol=1e-4, rtol=1e-5)
    for mine, ref in zip(results["onednn"][1], results["mkl"][1], strict=True):
        torch.testing.assert_close(mine, ref, atol=1e-3, rtol=1e-5)


@needs_onednn
def test_a_bias_alone_that_requires_grad_gets_its_gradient() -> None:
    x, w = torch.randn(3, 4), torch.randn(5, 4)  # frozen weight, trainable bias
    b = torch.zeros(5, requires_grad=True)
    linear(x, w, b, "onednn").sum().backward()
    torch.testing.assert_close(b.grad, torch.full((5,), 3.0))


@needs_onednn
def test_onednn_is_not_used_under_autocast_or_for_other_dtypes(monkeypatch) -> None:
    calls = []
    real = linear_module.onednn_linear
    monkeypatch.setattr(linear_module, "onednn_linear", lambda *a: calls.append(1) or real(*a))
    x, w = torch.randn(3, 4), torch.randn(5, 4)
    linear(x, w, None, "onednn")
    assert calls == [1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # autocast's F.linear, not oneDNN
        assert linear(x, w, None, "onednn").dtype == torch.bfloat16
    linear(x.double(), w.double(), None, "onednn")
    linear(x[:1], w, None, "onednn")  # one row against a small weight: MKL's, faster there
    linear(x, w, None, "mkl")
    assert calls == [1]
    linear(x[:1], torch.randn(140_000, 4), None, "onednn")  # a large weight: oneDNN, one row too
    assert calls == [1, 1]


@pytest.mark.parametrize(
    ("vendor", "dtype", "expected"),
    [
        ("AuthenticAMD", torch.float32, True),
        ("GenuineIntel", torch.float32, False),
        ("", torch.float32, False),
        ("AuthenticAMD", torch.bfloat16, False),
    ],
)
def test_auto_takes_onednn_for_float32_on_cpus_not_made_by_intel(
    monkeypatch: pytest.MonkeyPatch, vendor: str, dtype: torch.dtype, expected: bool
) -> None:
    monkeypatch.setattr(linear_module, "_cpu_vendor", lambda: vendor)
    monkeypatch.setattr(linear_module, "onednn_available", lambda: True)
    weight = torch.zeros(4, 3, dtype=dtype)
    assert use_onednn("auto", weight) is expected
    assert use_onednn("mkl", weight) is False
    assert use_onednn("onednn", weight) is True
    monkeypatch.setattr(linear_module, "onednn_available", lambda: False)
    assert use_onednn("auto", weight) is False
    with pytest.raises(ValueError, match="no oneDNN"):
        use_onednn("onednn", weight)


def test_weights_off_the_cpu_never_take_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    # oneDNN's operators are CPU kernels: a GPU model with matmul="onednn" keeps F.linear
    # ("meta" stands in for a GPU here)
    monkeypatch.setattr(linear_module, "_cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(linear_module, "onednn_available", lambda: True)
    weight = torch.zeros(4, 3, device="meta")
    assert [use_onednn(c, weight) for c in ("auto", "mkl", "onednn")] == [False] * 3
    with pytest.raises(ValueError, match="'blas'"):
        use_onednn("blas", weight)  # type: ignore[arg-type]


def test_an_unknown_choice_is_refused() -> None:
    with pytest.raises(ValueError, match="'blas'"):
        linear(torch.randn(3, 4), torch.randn(5, 4), None, "blas")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'blas'"):
        Linear(4, 5, matmul="blas")  # type: ignore[arg-type]


@pytest.mark.parametrize("matmul", ["auto", "mkl"])
def test_linear_module_equals_nn_linear_and_stacks(matmul: str) -> None:
    torch.manual_seed(0)
    layers = [Linear(6, n, matmul=matmul) for n in (4, 4, 3)]  # type: ignore[arg-type]
    x = torch.randn(2, 5, 6, requires_grad=True)
    assert sorted(layers[0].state_dict()) == ["bias", "weight"]  # nn.Linear's keys
    for layer in layers:
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    stacked = stacked_linear(x, layers)
    for layer, out in zip(layers, stacked, strict=True):
        torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))
    sum(o.sum() for o in stacked).backward()
    assert all(layer.weight.grad is not None for layer in layers)
    # an input of another dtype is cast to the weight's (attention hands back float32)
    low = Linear(6, 4).to(torch.bfloat16)
    assert low(torch.randn(3, 6)).dtype == torch.bfloat16


@needs_onednn
@pytest.mark.parametrize("rows", [0, 1, 3, 130])
@pytest.mark.parametrize("bias", [True, False])
def test_a_packed_weight_multiplies_like_the_plain_one(rows: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(40, 24, generator=g), torch.randn(rows, 24, generator=g)
    b = torch.randn(40, generator=g) if bias else None
    packed = onednn_packed(w)
    assert packed.shape == w.shape
    torch.testing.assert_close(onednn_linear(x, packed, b), F.linear(x, w, b))
