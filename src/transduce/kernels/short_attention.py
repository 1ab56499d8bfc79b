"""softmax(Q K^T / sqrt(d_k)) V for short sequences, forward and backward, one Triton program
per (sentence, head) holding the whole T x T' matrix of scores.

PyTorch's fused kernels tile queries and keys in blocks of 64-128 and carry a running softmax
across key blocks: at the paper's ~24-token sentences one block holds a whole sentence, mostly
padding, and the kernels ran at a tenth of the memory's speed on an H200 (1024 x 8 heads x 24 x
64, bf16, 0.5 ms a forward and backward: benchmarks/RESULTS.md). Here a program loads one
head's Q (T, K), K (T', K) and V (T', Dv) once, each padded to a power of two >= 16 (what
``tl.dot`` takes), computes the scores, the softmax and the output in registers, and saves the
row log-sum-exps; the backward recomputes the weights from them (as flash attention does):

    P = exp(S - lse),  dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),
    dQ = dS K / sqrt(d_k),  dK = dS^T Q / sqrt(d_k).

Masks: a key mask (B, 1, 1, T') (padding) or none, and the causal mask (query i sees keys
0 .. i + T' - T); a query that may see no key gets zero weights and zero gradients, as the
formula in ``kernels/attention.py`` gives. No dropout on the weights (the paper has none).
Products in the inputs' dtype with float32 accumulation (float32 inputs: IEEE products, not
TF32); the softmax in float32. Shapes: B sentences, H heads, T queries, T' keys, K = d_k,
Dv = d_v. ``attention`` is the entry; ``takes`` says where it applies.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from typing import Any

import torch
from torch import Tensor

# the longest query and key sequences taken: a program holds T x T' float32 scores
MAX_LEN = 64
# the widest head (d_k, d_v) taken
MAX_HEAD = 128
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@functools.lru_cache(maxsize=1)
def _triton() -> Any:
    """(forward kernel, backward kernel), or None where Triton cannot be imported."""
    try:
        import triton
        import triton.language as tl
    except Exception:  # ImportError, or a Triton that fails to load
        return None

    @triton.jit
    def forward_kernel(  # type: ignore[no-untyped-def]
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, valid_ptr,
        q_b, q_h, q_t, k_b, k_h, k_t, v_b, v_h, v_t, o_b, o_h, o_t, valid_b,
        heads, t, tk, dk, dv, scale,
        HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
        BT: tl.constexpr, BK: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0).to(tl.int64)  # b * q_b may pass 2**31
        b, h = pid // heads, pid % heads
        rt, rk = tl.arange(0, BT), tl.arange(0, BK)
        rd, re = tl.arange(0, BDK), tl.arange(0, BDV)
        q = tl.load(q_ptr + b * q_b + h * q_h + rt[:, None] * q_t + rd[None, :],
                    mask=(rt[:, None] < t) & (rd[None, :] < dk), other=0.0)  # fmt: skip
        k = tl.load(k_ptr + b * k_b + h * k_h + rk[:, None] * k_t + rd[None, :],
                    mask=(rk[:, None] < tk) & (rd[None, :] < dk), other=0.0)  # fmt: skip
        v = tl.load(v_ptr + b * v_b + h * v_h + rk[:, None] * v_t + re[None, :],
                    mask=(rk[:, None] < tk) & (re[None, :] < dv), other=0.0)  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BT, BK) float32
        # (BT, BK): key j exists, is not masked, and (causal) is not after query i
        ok = (rt[:, None] >= 0) & (rk[None, :] < tk)
        if HAS_MASK:
            keep = tl.load(valid_ptr + b * valid_b + rk, mask=rk < tk, other=0)
            ok = ok & (keep[None, :] != 0)
        if CAUSAL:
            ok = ok & (rk[None, :] <= rt[:, None] + (tk - t))
        s = tl.where(ok, s, float("-inf"))
        m = tl.max(s, axis=1)
        m = tl.where(m == float("-inf"), 0.0, m)  # a row with no key: weights 0, not nan
        p = tl.where(ok, tl.exp(s - m[:, None]), 0.0)
        total = tl.sum(p, axis=1)
        seen = total > 0.0
        p = p / tl.where(seen, total, 1.0)[:, None]
        o = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)  # (BT, BDV) float32
        tl.store(o_ptr + b * o_b + h * o_h + rt[:, None] * o_t + re[None, :],
                 o.to(o_ptr.dtype.element_ty),
                 mask=(rt[:, None] < t) & (re[None, :] < dv))  # fmt: skip
        lse = tl.where(seen, m + tl.log(tl.where(seen, total, 1.0)), float("inf"))
        tl.store(lse_ptr + pid * t + rt, lse, mask=rt < t)  # +inf: no key, exp(s - lse) = 0

    @triton.jit
    def backward_kernel(  # type: ignore[no-untyped-def]
        q_ptr, k_ptr, v_ptr, o_ptr, do_ptr, lse_ptr, valid_ptr, dq_ptr, dk_ptr, dv_ptr,
        q_b, q_h, q_t, k_b, k_h, k_t, v_b, v_h, v_t, o_b, o_h, o_t, do_b, do_h, do_t, valid_b,
        heads, t, tk, dk, dv, scale,
        HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
        BT: tl.constexpr, BK: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0).to(tl.int64)
        b, h = pid // heads, pid % heads
        rt, rk = tl.arange(0, BT), tl.arange(0, BK)
        rd, re = tl.arange(0, BDK), tl.arange(0, BDV)
        qmask = (rt[:, None] < t) & (rd[None, :] < dk)
        kmask = (rk[:, None] < tk) & (rd[None, :] < dk)
        vmask = (rk[:, None] < tk) & (re[None, :] < dv)
        omask = (rt[:, None] < t) & (re[None, :] < dv)
        q = tl.load(
            q_ptr + b * q_b + h * q_h + rt[:, None] * q_t + rd[None, :], mask=qmask, other=0.0
        )  # noqa: E501
        k = tl.load(
            k_ptr + b * k_b + h * k_h + rk[:, None] * k_t + rd[None, :], mask=kmask, other=0.0
        )  # noqa: E501
        v = tl.load(
            v_ptr + b * v_b + h * v_h + rk[:, None] * v_t + re[None, :], mask=vmask, other=0.0
        )  # noqa: E501
        o = tl.load(
            o_ptr + b * o_b + h * o_h + rt[:, None] * o_t + re[None, :], mask=omask, other=0.0
        )  # noqa: E501
        do = tl.load(
            do_ptr + b * do_b + h * do_h + rt[:, None] * do_t + re[None, :], mask=omask, other=0.0
        )  # noqa: E501
        lse = tl.load(lse_ptr + pid * t + rt, mask=rt < t, other=float("inf"))
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BT, BK) float32
        # (BT, BK): key j exists, is not masked, and (causal) is not after query i
        ok = (rt[:, None] >= 0) & (rk[None, :] < tk)
        if HAS_MASK:
            keep = tl.load(valid_ptr + b * valid_b + rk, mask=rk < tk, other=0)
            ok = ok & (keep[None, :] != 0)
        if CAUSAL:
            ok = ok & (rk[None, :] <= rt[:, None] + (tk - t))
        p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)  # the forward's weights
        delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), axis=1)  # rowsum(dO * O), (BT,)
        grad_v = tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)  # (BK, BDV)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (BT, BK)
        ds = p * (dp - delta[:, None])
        grad_q = tl.dot(ds.to(k.dtype), k, input_precision=PRECISION) * scale  # (BT, BDK)
        grad_k = tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION) * scale  # (BK, BDK)  # noqa: E501
        # dq, dk, dv: contiguous (B, T, H, size) buffers
        tl.store(dq_ptr + ((b * t + rt[:, None]) * heads + h) * dk + rd[None, :],
                 grad_q.to(dq_ptr.dtype.element_ty), mask=qmask)  # fmt: skip
        tl.store(dk_ptr + ((b * tk + rk[:, None]) * heads + h) * dk + rd[None, :],
                 grad_k.to(dk_ptr.dtype.element_ty), mask=kmask)  # fmt: skip
        tl.store(dv_ptr + ((b * tk + rk[:, None]) * heads + h) * dv + re[None, :],
                 grad_v.to(dv_ptr.dtype.element_ty), mask=vmask)  # fmt: skip

    return forward_kernel, backward_kernel


def available() -> bool:
    """Whether Triton can be imported (its kernels run on CUDA, or on CPU tensors under
    ``TRITON_INTERPRET=1``)."""
    return _triton() is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _key_mask(mask: Tensor | None, batch: int, n_keys: int) -> Tensor | None:
    """A (B, 1, 1, T') bool mask (or one broadcast to it) as (B', T') bytes, B' in (1, B); None
    where ``mask`` has another form (a mask per query or per head)."""
    if mask is None:
        return None
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.size(1) != 1 or mask.size(2) != 1:
        return None
    if mask.size(0) not in (1, batch) or mask.size(3) != n_keys:
        return None
    rows = mask[:, 0, 0, :]  # (B', T')
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return rows.view(torch.uint8)  # the same bytes; Triton loads bytes, not bools


def takes(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
) -> bool:
    """Whether ``attention`` computes this call: training (gradients on, not under
    torch.compile) on a CUDA device where Triton runs, or CPU tensors under Triton's
    interpreter (the tests); T, T' <= MAX_LEN; d_k, d_v <= MAX_HEAD; bf16, fp16 or fp32; no
    dropout; no mask, or a key mask (B, 1, 1, T'); causal only with T <= T'."""
    if not torch.is_grad_enabled() or dropout_p > 0.0:  # decoding: the cheapest test first
        return False
    if query.device.type != "cuda" and not (query.device.type == "cpu" and _interpreting()):
        return False
    if torch.compiler.is_compiling():  # inductor compiles PyTorch's kernel into its graph
        return False
    t, n_keys = query.size(-2), key.size(-2)
    return (
        query.dim() == 4
        and query.dtype in _DTYPES
        and key.dtype == query.dtype == value.dtype
        and t <= MAX_LEN
        and n_keys <= MAX_LEN
        and query.size(-1) <= MAX_HEAD
        and value.size(-1) <= MAX_HEAD
        and query.stride(-1) == key.stride(-1) == value.stride(-1) == 1
        and (not is_causal or t <= n_keys)
        and (mask is None or _key_mask(mask, query.size(0), n_keys) is not None)
        and available()
        and (query.device.type == "cpu" or runs_on(query.device))
    )


# device -> whether the kernels compiled and ran there and agreed with the formula (tried once)
_RUNS_ON: dict[str, bool] = {}


def runs_on(device: torch.device) -> bool:
    """Whether the kernels compile and run on ``device`` and agree with the formula there, tried
    once on a small case: an importable Triton may still fail at its first launch (no C
    compiler for its launcher, a GPU it does not support). Training then keeps PyTorch's
    kernel, with a warning, rather than fail."""
    key = str(device)
    if key not in _RUNS_ON:
        _RUNS_ON[key] = False  # while trying: the formula below must not come back here
        try:
            works, why = _agrees(device), "its results differ from the formula's"
        except Exception as e:  # a compiler, a driver, a GPU Triton does not support
            works, why = False, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        if not works:
            warnings.warn(
                f"the Triton short-attention kernel does not run on {device} ({why}); "
                "training takes PyTorch's attention there",
                RuntimeWarning,
                stacklevel=4,  # the layer that asked
            )
        _RUNS_ON[key] = works
    return _RUNS_ON[key]


def _agrees(device: torch.device) -> bool:
    """The kernels on a small masked case against softmax(Q K^T / sqrt(d_k)) V (float32)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 2, 5, 16, generator=gen).to(device).requires_grad_() for _ in range(3)
    )
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]], device=device)
    mask = mask[:, None, None, :]  # (2, 1, 1, 5)
    got = attention(q, k, v, mask, False)
    scores = (q @ k.transpose(-2, -1) / 4.0).masked_fill(~mask, float("-inf"))  # d_k = 16
    want = scores.softmax(dim=-1) @ v
    grads = torch.autograd.grad(got.sum(), (q, k, v))
    wants = torch.autograd.grad(want.sum(), (q, k, v))
    return all(
        bool(torch.allclose(a, b, atol=1e-4, rtol=1e-4))
        for a, b in zip((got, *grads), (want, *wants), strict=True)
    )


def _blocks(t: int, n_keys: int, dk: int, dv: int) -> dict[str, int]:
    def size(n: int) -> int:  # tl.dot takes dimensions of 16 or more
        return max(16, 1 << (n - 1).bit_length())

    return {"BT": size(t), "BK": size(n_keys), "BDK": size(dk), "BDV": size(dv)}


def _precision(q: Tensor) -> str:
    return "ieee" if q.dtype == torch.float32 else "tf32"  # float32: not TF32's 10-bit products


def _warps(blocks: dict[str, int]) -> int:
    return 4 if max(blocks["BT"], blocks["BK"]) >= 64 else 2


class _ShortAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None, causal: bool
    ) -> Tensor:
        forward_kernel, _ = _triton()
        b, h, t, dk = q.shape
        n_keys, dv = k.size(2), v.size(3)
        out = torch.empty(b, t, h, dv, dtype=q.dtype, device=q.device).transpose(1, 2)
        lse = torch.empty(b * h, t, dtype=torch.float32, device=q.device)
        blocks = _blocks(t, n_keys, dk, dv)
        forward_kernel[(b * h,)](
            q, k, v, out, lse, q if valid is None else valid,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
            0 if valid is None or valid.size(0) == 1 else valid.stride(0),
            h, t, n_keys, dk, dv, 1 / math.sqrt(dk),
            HAS_MASK=valid is not None, CAUSAL=causal, PRECISION=_precision(q),
            num_warps=_warps(blocks), **blocks,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, valid)
        ctx.causal = causal
        return out  # (B, H, T, Dv), a view of a (B, T, H, Dv) buffer

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        _, backward_kernel = _triton()
        q, k, v, out, lse, valid = ctx.saved_tensors
        b, h, t, dk = q.shape
        n_keys, dv = k.size(2), v.size(3)
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        # contiguous (B, T, H, size): viewed as (B, H, T, size), their transposes back are the
        # (B, T, H*size) rows of the projections, without a copy
        dq = torch.empty(b, t, h, dk, dtype=q.dtype, device=q.device)
        dkey = torch.empty(b, n_keys, h, dk, dtype=k.dtype, device=k.device)
        dval = torch.empty(b, n_keys, h, dv, dtype=v.dtype, device=v.device)
        blocks = _blocks(t, n_keys, dk, dv)
        backward_kernel[(b * h,)](
            q, k, v, out, grad_out, lse, q if valid is None else valid, dq, dkey, dval,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
            grad_out.stride(0), grad_out.stride(1), grad_out.stride(2),
            0 if valid is None or valid.size(0) == 1 else valid.stride(0),
            h, t, n_keys, dk, dv, 1 / math.sqrt(dk),
            HAS_MASK=valid is not None, CAUSAL=ctx.causal, PRECISION=_precision(q),
            num_warps=_warps(blocks), **blocks,
        )  # fmt: skip
        return dq.transpose(1, 2), dkey.transpose(1, 2), dval.transpose(1, 2), None, None


def attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, is_causal: bool
) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V where ``takes`` holds: query (B, H, T, K), key (B, H, T',
    K), value (B, H, T', Dv), mask None or a key mask (B, 1, 1, T') bool (True = may attend),
    ``is_causal``: query i sees keys 0 .. i + T' - T. Returns (B, H, T, Dv) in the dtype of
    ``query``, differentiable in query, key and value."""
    valid = _key_mask(mask, query.size(0), key.size(-2))
    if mask is not None and valid is None:
        raise ValueError(
            f"the short-attention kernel takes a key mask (B, 1, 1, T'), not {tuple(mask.shape)}"
        )  # noqa: E501
    out: Tensor = _ShortAttention.apply(query, key, value, valid, is_causal)
    return out


__all__ = ["MAX_HEAD", "MAX_LEN", "attention", "available", "takes"]
