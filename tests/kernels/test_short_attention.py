"""kernels.short_attention (one Triton program per sentence and head, forward and backward)
against the formula in float64: on CPU tensors under Triton's interpreter (a subprocess: the
interpreter is chosen when the kernels are defined; float32 and float16, the interpreter has no
bfloat16), and on CUDA where there is a GPU (bfloat16 too); where it is taken and where not; and
a whole model's gradients through it against the same model on PyTorch's kernel."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

from transduce import kernels
from transduce.kernels import short_attention

# (B, H, T, T', d_k, d_v, key mask, causal)
CASES = [
    (3, 2, 5, 7, 16, 8, True, False),  # cross attention, T < T', d_v < 16
    (2, 3, 24, 24, 64, 64, False, True),  # the decoder's self-attention
    (2, 2, 17, 17, 32, 32, True, True),
    (2, 1, 3, 40, 24, 24, True, False),  # 40 keys: blocks of 64, d_k not a power of two
    (1, 2, 64, 64, 64, 64, True, False),  # the longest taken
    (2, 2, 6, 9, 16, 16, False, True),  # causal with T < T': query i sees keys 0 .. i + 3
]
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def reference(q, k, v, mask, causal):
    """softmax(Q K^T / sqrt(d_k)) V in float64; a query that sees no key gets zeros."""
    q, k, v = q.double(), k.double(), v.double()
    allowed = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed.tril(k.size(2) - q.size(2))
    if mask is not None:
        allowed = allowed & mask
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(~allowed, -math.inf)
    weights = scores.softmax(dim=-1).nan_to_num(0.0)  # rows with no key: nan -> 0
    return weights @ v


def inputs(case, dtype, device, seed=0):
    """q as the model makes it (a strided view of a stacked projection), k and v contiguous, a
    key mask with one sentence that may attend no key."""
    b, h, t, tk, dk, dv, masked, _ = case
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(b, t, 3 * h * dk, generator=g)  # (B, T, 3 * H * K): q of a q|k|v product
    q = rows[..., : h * dk].view(b, t, h, dk).transpose(1, 2)  # (B, H, T, K), strided
    k = torch.randn(b, h, tk, dk, generator=g)
    v = torch.randn(b, h, tk, dv, generator=g)
    q, k, v = (x.to(device=device, dtype=dtype).requires_grad_() for x in (q, k, v))
    mask = None
    if masked:
        valid = torch.rand(b, tk, generator=g) > 0.3
        valid[0] = False  # a sentence with every key masked: zero weights, zero gradients
        mask = valid[:, None, None, :].to(device)  # (B, 1, 1, T')
    grad = torch.randn(b, h, t, dv, generator=g).to(device=device, dtype=dtype)
    return q, k, v, mask, grad


def check(case, dtype, device):
    q, k, v, mask, grad = inputs(case, dtype, device)
    causal = case[-1]
    assert short_attention.takes(q, k, v, mask, 0.0, causal)
    out = kernels.attention(q, k, v, mask, is_causal=causal)  # "auto" takes the kernel
    assert out.dtype == dtype and out.shape == grad.shape
    got = (out, *torch.autograd.grad(out, (q, k, v), grad))
    qq, kk, vv = (x.detach().double().requires_grad_() for x in (q, k, v))
    want_out = reference(qq, kk, vv, mask, causal)
    want = (want_out, *torch.autograd.grad(want_out, (qq, kk, vv), grad.double()))
    tol = TOLERANCE[dtype]
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        scale = max(1.0, b.abs().max().item())
        err = (a.double() - b).abs().max().item() / scale
        assert err <= tol, f"{case} {dtype} {name}: {err:.2e} > {tol}"
    if mask is not None:  # the sentence that may attend no key: exactly zero
        assert not got[0][0].any() and not got[1][0].any()


def model_gradients(device, dtype):
    """A tiny model's loss and gradients with "auto" (the kernel) and "fused" (PyTorch's)."""
    from transduce.config import ModelConfig
    from transduce.model import make_model

    cfg = ModelConfig(n_layers=2, d_model=32, d_ff=64, n_heads=2, d_k=16, d_v=16, dropout=0.0)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, 40, (4, 11), generator=g)
    tgt = torch.randint(3, 40, (4, 9), generator=g)
    src[1, 7:], tgt[2, 5:] = 0, 0  # padding (id 0)
    results = []
    for path in ("auto", "fused"):
        torch.manual_seed(0)
        model = make_model(
            cfg, src_vocab_size=40, options=kernels.KernelOptions(attention=path)
        ).to(device=device, dtype=dtype)
        logits = model(src.to(device), tgt.to(device))
        loss = logits.float().logsumexp(-1).mean()
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    return results


INTERPRETED = """
import torch
from tests_kernel_cases import CASES, check, model_gradients, short_attention
for case in CASES:
    for dtype in (torch.float32, torch.float16):
        check(case, dtype, "cpu")
calls = []
apply = short_attention._ShortAttention.apply
short_attention._ShortAttention.apply = lambda *a: calls.append(1) or apply(*a)
(loss_a, grads_a), (loss_b, grads_b) = model_gradients("cpu", torch.float32)
assert len(calls) == 6, calls  # "auto": 2 layers' encoder, decoder and cross attention
torch.testing.assert_close(loss_a, loss_b, atol=1e-5, rtol=1e-5)
for name in grads_b:
    torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-5, rtol=1e-4, msg=name)
assert short_attention._agrees(torch.device("cpu"))
print("interpreted", len(CASES) * 2)
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed")
def test_the_kernels_under_the_interpreter_give_the_formula(tmp_path):
    # this module's cases and check, importable by the subprocess under another name
    (tmp_path / "tests_kernel_cases.py").write_text(open(__file__, encoding="utf-8").read())
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"interpreted {len(CASES) * 2}"


def test_where_the_kernel_is_not_taken():
    q = torch.randn(2, 2, 5, 16, requires_grad=True)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    # a CPU tensor outside the interpreter: never
    assert not short_attention.takes(q, q, q, mask, 0.0, False)
    meta = torch.empty(2, 2, 5, 16, device="meta")
    if short_attention.available():
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            assert short_attention.takes(q, q, q, mask, 0.0, False)  # the control
            assert not short_attention.takes(q, q, q, mask, 0.1, False)  # dropout
            long = torch.randn(1, 1, 65, 16)
            assert not short_attention.takes(long, long, long, None, 0.0, False)  # > 64
            wide = torch.randn(1, 1, 5, 256)
            assert not short_attention.takes(wide, wide, wide, None, 0.0, False)
            per_query = torch.ones(2, 1, 5, 5, dtype=torch.bool)
            assert not short_attention.takes(q, q, q, per_query, 0.0, False)
            per_head = torch.ones(2, 2, 1, 5, dtype=torch.bool)
            assert not short_attention.takes(q, q, q, per_head, 0.0, False)
            assert not short_attention.takes(q, q, q, mask.float(), 0.0, False)
            assert not short_attention.takes(q.double(), q.double(), q.double(), None, 0.0, False)
            longer_queries = torch.randn(1, 1, 6, 16)
            assert not short_attention.takes(longer_queries, q[:1], q[:1], None, 0.0, True)
            assert not short_attention.takes(meta, meta, meta, None, 0.0, False)
            with torch.no_grad():  # decoding
                assert not short_attention.takes(q, q, q, mask, 0.0, False)
        finally:
            del os.environ["TRITON_INTERPRET"]


def test_a_mask_of_another_form_is_refused_in_one_line():
    q = torch.randn(2, 2, 5, 16)
    with pytest.raises(ValueError, match=r"key mask \(B, 1, 1, T'\), not \(2, 1, 5, 5\)"):
        short_attention.attention(q, q, q, torch.ones(2, 1, 5, 5, dtype=torch.bool), False)


needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or not short_attention.available(),
    reason="needs a CUDA device and Triton",
)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_the_kernels_on_cuda_give_the_formula(case, dtype):
    short_attention._RUNS_ON.clear()
    assert short_attention.runs_on(torch.device("cuda"))
    check(case, dtype, "cuda")


@needs_cuda
def test_a_model_trains_the_same_through_the_kernel_on_cuda():
    (loss_a, grads_a), (loss_b, grads_b) = model_gradients("cuda", torch.float32)
    torch.testing.assert_close(loss_a, loss_b, atol=1e-5, rtol=1e-5)
    for name in grads_b:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-4, rtol=1e-3, msg=name)
