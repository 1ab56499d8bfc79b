"""Adam's step for bf16-weights in one pass (kernels/adam.py, native/adam.cpp): torch's fused
Adam bit for bit, the bfloat16 working copy its result rounded, nothing written on a refusal."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from transduce.kernels import adam, native

# lengths with a tail past the last full vector (torch's scalar loop), one past a block
SHAPES = [(64, 48), (33,), (7, 3), (16_384 + 40,)]


def _native_or_skip() -> None:
    if not native.available():
        pytest.skip("the native kernels are not built here")


def _torch_and_ours(
    steps: int,
    *,
    weight_decay: float,
    lr: float,
    beta1: float,
    grad_scale: float,
    grad_dtype: torch.dtype = torch.bfloat16,
) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(0)
    start = [torch.randn(s, generator=g) for s in SHAPES]
    ref = [p.clone().requires_grad_() for p in start]
    opt = torch.optim.Adam(
        [{"params": ref, "weight_decay": weight_decay}],
        lr=lr,
        betas=(beta1, 0.98),
        eps=1e-9,
        decoupled_weight_decay=True,
        fused=True,
    )
    ours = [p.clone() for p in start]
    m, v = [torch.zeros_like(p) for p in start], [torch.zeros_like(p) for p in start]
    counts = [torch.zeros(()) for _ in start]
    working = [torch.full(s, 7.0, dtype=torch.bfloat16) for s in SHAPES]  # overwritten
    for k in range(steps):
        # gradients of growing size, so the moments' old and new terms both count
        grads = [(torch.randn(s, generator=g) * 10.0 ** (k - 1)).to(grad_dtype) for s in SHAPES]
        for p, grad in zip(ref, grads, strict=True):
            p.grad = grad.float() * torch.tensor(grad_scale)  # widened, then clipped
        opt.step()
        adam.adam_bf16_copy(
            ours, grads, m, v, counts, working,
            lr=lr, betas=(beta1, 0.98), eps=1e-9, weight_decay=weight_decay,
            grad_scale=grad_scale,
        )  # fmt: skip
    return ref, opt, ours, working, m, v, counts


@pytest.mark.parametrize(
    "weight_decay, lr, beta1, grad_scale, grad_dtype",
    [
        (0.0, 1e-3, 0.9, 1.0, torch.bfloat16),
        (0.1, 7e-4, 0.9, 1.0, torch.bfloat16),
        (0.0, 1e-3, 0.9, 0.37, torch.bfloat16),
        (0.1, 1e-3, 0.3, 1.0, torch.bfloat16),
        (0.1, 7e-4, 0.9, 1.0, torch.float32),  # the master's own (accumulated) gradients
    ],
)
def test_the_step_is_torchs_fused_adam_bit_for_bit(
    weight_decay: float, lr: float, beta1: float, grad_scale: float, grad_dtype: torch.dtype
) -> None:
    # beta1 0.3: torch's lerp takes its other form (weight 0.7 >= 0.5)
    _native_or_skip()
    ref, opt, ours, working, m, v, counts = _torch_and_ours(
        4,
        weight_decay=weight_decay,
        lr=lr,
        beta1=beta1,
        grad_scale=grad_scale,
        grad_dtype=grad_dtype,
    )
    for j, p in enumerate(ref):
        state = opt.state[p]
        assert torch.equal(ours[j], p.detach()), SHAPES[j]
        assert torch.equal(m[j], state["exp_avg"]) and torch.equal(v[j], state["exp_avg_sq"])
        assert torch.equal(counts[j], state["step"]) and counts[j].item() == 4
        assert torch.equal(working[j], p.detach().bfloat16())  # the copy, rounded to nearest


def test_the_step_against_adams_formula_in_float64() -> None:
    # independent of torch's kernel: one step from zero moments is p - lr * g / (|g| + eps')
    _native_or_skip()
    p = torch.tensor([1.0, -2.0, 0.5, 3.0] * 4)
    grad = torch.tensor([0.5, -0.25, 2.0, 0.0] * 4, dtype=torch.bfloat16)
    m, v, count = torch.zeros(16), torch.zeros(16), torch.zeros(())
    working = torch.empty(16, dtype=torch.bfloat16)
    expected = p.double() - 0.01 * torch.sign(grad.double())  # m_hat / sqrt(v_hat) = sign(g)
    adam.adam_bf16_copy(
        [p], [grad], [m], [v], [count], [working],
        lr=0.01, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, grad_scale=1.0,
    )  # fmt: skip
    assert torch.allclose(p.double(), expected, rtol=0, atol=1e-6)
    assert torch.allclose(m.double(), 0.1 * grad.double(), rtol=1e-6, atol=0)
    assert count.item() == 1.0


def test_a_refused_call_writes_nothing() -> None:
    _native_or_skip()
    p, m, v = torch.ones(16), torch.zeros(16), torch.zeros(16)
    count, working = torch.zeros(()), torch.zeros(16, dtype=torch.bfloat16)
    ok = torch.ones(16, dtype=torch.bfloat16)
    cases = [
        ([p, p], [ok, ok.half()]),  # a float16 gradient
        ([p, p], [ok, torch.ones(15, dtype=torch.bfloat16)]),  # too short
    ]
    for params, grads in cases:
        with pytest.raises(RuntimeError, match="adam_bf16_copy"):
            adam.adam_bf16_copy(
                params, grads, [m, m], [v, v], [count, count], [working, working],
                lr=0.1, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, grad_scale=1.0,
            )  # fmt: skip
        assert count.item() == 0 and torch.equal(p, torch.ones(16)) and not working.any()
    with pytest.raises(RuntimeError, match="equally long"):
        adam.adam_bf16_copy(
            [p], [ok, ok], [m], [v], [count], [working],
            lr=0.1, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, grad_scale=1.0,
        )  # fmt: skip
