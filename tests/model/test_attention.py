"""Scaled dot-product attention (eq. 1), masks and multi-head attention (section 3.2)."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from torch import nn

from transduce.kernels import KernelOptions, attention_weights
from transduce.model.attention import MultiHeadAttention
from transduce.model.attention import attention as model_attention
from transduce.model.masks import causal_mask, combine, key_padding_mask

B, H, T, S = 2, 3, 4, 5
# the kernels' module, not the attention() function that transduce.kernels exports
_ATTENTION_MODULE = importlib.import_module("transduce.kernels.attention")


@pytest.fixture(autouse=True)
def _kernel_means_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    # "auto" takes the formula when training on the CPU with short keys; here it must mean the
    # fused kernel, or the kernel-vs-formula comparisons would compare the formula with itself.
    monkeypatch.setattr(_ATTENTION_MODULE, "FORMULA_MAX_KEYS_CPU_TRAINING", 0)


def _options(fast: bool) -> KernelOptions:
    return KernelOptions(attention="auto" if fast else "formula")


def attention(q, k, v, mask=None, fast: bool = True, is_causal: bool = False):  # noqa: ANN001, ANN201
    """The model's eq. 1 on the path of ``fast``: "auto" (the kernel here) or the formula."""
    return model_attention(q, k, v, mask, is_causal=is_causal, options=_options(fast))


def _qkv(d_k: int, d_v: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, d_k, generator=g)
    k = torch.randn(B, H, S, d_k, generator=g)
    v = torch.randn(B, H, S, d_v, generator=g)
    return q, k, v


def _reference_attention(q, k, v, mask=None):
    """softmax(QK^T/sqrt(d_k))V with the softmax written out, masked keys excluded from the sum."""
    scores = torch.einsum("bhtk,bhsk->bhts", q, k) / math.sqrt(q.size(-1))
    if mask is None:
        mask = torch.ones_like(scores, dtype=torch.bool)
    mask = mask.expand_as(scores)
    e = torch.exp(scores - scores.max(dim=-1, keepdim=True).values) * mask
    denom = e.sum(dim=-1, keepdim=True)
    w = torch.where(denom > 0, e / denom.clamp_min(1e-30), torch.zeros_like(e))
    return torch.einsum("bhts,bhsv->bhtv", w, v), w


def _masks() -> dict[str, torch.Tensor | None]:
    valid = torch.tensor([[True] * S, [True, True, True, False, False]])
    g = torch.Generator().manual_seed(7)
    rand = torch.rand(B, H, T, S, generator=g) > 0.4
    rand[..., 0] = True  # keep at least one key per row
    return {
        "none": None,
        "key_padding": key_padding_mask(valid),
        "causal": causal_mask(T, S),
        "random": rand,
        "combined": combine(key_padding_mask(valid), causal_mask(T, S)),
    }


# --------------------------------------------------------------------------------------------
# masks


def test_causal_mask_square_is_lower_triangular() -> None:
    m = causal_mask(4, 4)
    assert m.shape == (1, 1, 4, 4) and m.dtype == torch.bool
    assert torch.equal(m[0, 0], torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_causal_mask_with_cached_prefix() -> None:
    # 2 new queries at positions 3 and 4 of a 5-key sequence
    m = causal_mask(2, 5)[0, 0]
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expected)


def test_key_padding_mask_shape_and_combine() -> None:
    valid = torch.tensor([[True, True, False]])
    m = key_padding_mask(valid)
    assert m.shape == (1, 1, 1, 3)
    c = combine(None, m, causal_mask(3, 3))
    assert c is not None and c.shape == (1, 1, 3, 3)
    assert torch.equal(c[0, 0], torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool))
    assert combine(None, None) is None


# --------------------------------------------------------------------------------------------
# attention()


@pytest.mark.parametrize("mask_name", list(_masks()))
@pytest.mark.parametrize("d_k,d_v", [(8, 8), (8, 5), (3, 11)])
def test_attention_fast_equals_formula_and_reference(mask_name: str, d_k: int, d_v: int) -> None:
    q, k, v = _qkv(d_k, d_v)
    mask = _masks()[mask_name]
    fast = attention(q, k, v, mask, fast=True)
    slow = attention(q, k, v, mask, fast=False)
    ref, _ = _reference_attention(q, k, v, mask)
    assert fast.shape == (B, H, T, d_v)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(slow, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fast", [True, False])
def test_fully_masked_row_gives_zeros_not_nan(fast: bool) -> None:
    q, k, v = _qkv(6, 4)
    q.requires_grad_(True)
    k.requires_grad_(True)
    v.requires_grad_(True)
    mask = torch.ones(B, H, T, S, dtype=torch.bool)
    mask[0, 1, 2] = False  # one query row sees nothing
    mask[1, :, 0] = False
    out = attention(q, k, v, mask, fast=fast)
    assert not torch.isnan(out).any()
    assert torch.equal(out[0, 1, 2], torch.zeros(4))
    assert torch.equal(out[1, :, 0], torch.zeros(H, 4))
    ref, _ = _reference_attention(q.detach(), k.detach(), v.detach(), mask)
    torch.testing.assert_close(out.detach(), ref, atol=1e-5, rtol=1e-5)
    out.square().sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()


def test_attention_weights_rows_sum_to_one_and_masked_keys_are_zero() -> None:
    q, k, _ = _qkv(8, 8)
    mask = _masks()["random"].clone()
    mask[1, 2, 3] = False  # fully masked row
    w = attention_weights(q, k, mask)
    assert w.shape == (B, H, T, S)
    assert torch.all(w[~mask] == 0.0)  # exactly zero
    sums = w.sum(-1)
    full = mask.any(-1)
    torch.testing.assert_close(sums[full], torch.ones_like(sums[full]))
    assert torch.all(sums[~full] == 0.0)
    _, ref = _reference_attention(q, k, k, mask)
    torch.testing.assert_close(w, ref, atol=1e-6, rtol=1e-5)


def test_attention_weights_scale_by_sqrt_dk() -> None:
    # two keys, one query: weight of key 0 = sigmoid((s0 - s1) / sqrt(d_k))
    d_k = 16
    q = torch.zeros(1, 1, 1, d_k)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 2, d_k)
    k[0, 0, 0, 0] = 8.0  # s0 = 8, s1 = 0
    w = attention_weights(q, k)
    expected = 1.0 / (1.0 + math.exp(-8.0 / math.sqrt(d_k)))
    assert w[0, 0, 0, 0].item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_attention_weights_and_gradients_on_cpu(dtype: torch.dtype) -> None:
    # the softmax runs in float32 and is rounded once; masked keys and fully masked rows stay
    # exactly zero, and the gradients match float32 arithmetic on the rounded inputs
    q, k, _ = _qkv(8, 8)
    mask = _masks()["random"].clone()
    mask[1, 2, 3] = False  # fully masked row
    low_q, low_k = (t.to(dtype).requires_grad_() for t in (q, k))
    w = attention_weights(low_q, low_k, mask)
    assert w.dtype == dtype
    assert torch.all(w[~mask] == 0.0) and torch.all(w[1, 2, 3] == 0.0)
    ref_q, ref_k = (t.detach().float().requires_grad_() for t in (low_q, low_k))
    ref = _reference_attention(ref_q, ref_k, ref_k, mask)[1]
    torch.testing.assert_close(w.float(), ref, atol=1e-2, rtol=1e-2)
    g = torch.randn(w.shape, generator=torch.Generator().manual_seed(3))
    (w.float() * g).sum().backward()
    (ref * g).sum().backward()
    for low, full in ((low_q, ref_q), (low_k, ref_k)):
        assert low.grad is not None and full.grad is not None
        torch.testing.assert_close(low.grad.float(), full.grad, atol=3e-2, rtol=3e-2)


# --------------------------------------------------------------------------------------------
# MultiHeadAttention


def _copy_from_torch_mha(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    d = ref.embed_dim
    with torch.no_grad():
        w_q, w_k, w_v = ref.in_proj_weight.split(d, dim=0)
        b_q, b_k, b_v = ref.in_proj_bias.split(d, dim=0)
        ours.w_q.weight.copy_(w_q)
        ours.w_k.weight.copy_(w_k)
        ours.w_v.weight.copy_(w_v)
        ours.w_q.bias.copy_(b_q)
        ours.w_k.bias.copy_(b_k)
        ours.w_v.bias.copy_(b_v)
        ours.w_o.weight.copy_(ref.out_proj.weight)
        ours.w_o.bias.copy_(ref.out_proj.bias)


@pytest.mark.parametrize("fast", [True, False])
def test_multihead_equals_torch_mha_with_key_padding(fast: bool) -> None:
    torch.manual_seed(0)
    d_model, h = 32, 4
    ref = nn.MultiheadAttention(d_model, h, dropout=0.0, batch_first=True)
    with torch.no_grad():  # non-zero biases so the bias mapping is checked too
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    ours = MultiHeadAttention(d_model=d_model, n_heads=h, d_k=d_model // h, d_v=d_model // h)
    _copy_from_torch_mha(ours, ref)
    ours.options = _options(fast)
    ref.eval()
    ours.eval()
    query = torch.randn(3, 4, d_model)
    memory = torch.randn(3, 6, d_model)
    valid = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    expected, _ = ref(query, memory, memory, key_padding_mask=~valid, need_weights=False)
    got = ours(query, memory, key_padding_mask(valid))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_multihead_self_attention_causal_equals_torch_mha() -> None:
    torch.manual_seed(1)
    d_model, h, t = 16, 2, 5
    ref = nn.MultiheadAttention(d_model, h, batch_first=True)
    ours = MultiHeadAttention(d_model=d_model, n_heads=h, d_k=8, d_v=8)
    _copy_from_torch_mha(ours, ref)
    x = torch.randn(2, t, d_model)
    expected, _ = ref(x, x, x, attn_mask=~causal_mask(t, t)[0, 0], need_weights=False)
    torch.testing.assert_close(ours(x, x, causal_mask(t, t)), expected, atol=1e-5, rtol=1e-5)


def _per_head_loop(
    mha: MultiHeadAttention, x: torch.Tensor, mem: torch.Tensor, valid: torch.Tensor
):
    """Each head separately: Attention(x W_i^Q, mem W_i^K, mem W_i^V), concatenated, then W^O."""
    dk, dv = mha.d_k, mha.d_v
    heads = []
    for i in range(mha.n_heads):
        wq = mha.w_q.weight[i * dk : (i + 1) * dk]
        bq = mha.w_q.bias[i * dk : (i + 1) * dk]
        wk = mha.w_k.weight[i * dk : (i + 1) * dk]
        bk = mha.w_k.bias[i * dk : (i + 1) * dk]
        wv = mha.w_v.weight[i * dv : (i + 1) * dv]
        bv = mha.w_v.bias[i * dv : (i + 1) * dv]
        q = x @ wq.T + bq  # (B, T, dk)
        k = mem @ wk.T + bk
        v = mem @ wv.T + bv
        scores = q @ k.transpose(1, 2) / math.sqrt(dk)
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v)
    concat = torch.cat(heads, dim=-1)
    return concat @ mha.w_o.weight.T + mha.w_o.bias


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("d_k,d_v", [(5, 7), (16, 3), (12, 12)])
def test_multihead_with_free_head_sizes_equals_per_head_loop(
    fast: bool, d_k: int, d_v: int
) -> None:
    torch.manual_seed(2)
    d_model, h = 24, 3
    mha = MultiHeadAttention(d_model=d_model, n_heads=h, d_k=d_k, d_v=d_v)
    with torch.no_grad():
        for lin in (mha.w_q, mha.w_k, mha.w_v, mha.w_o):
            lin.bias.normal_()
    mha.options = _options(fast)
    assert mha.w_q.weight.shape == (h * d_k, d_model)
    assert mha.w_v.weight.shape == (h * d_v, d_model)
    assert mha.w_o.weight.shape == (d_model, h * d_v)
    x = torch.randn(2, 4, d_model)
    mem = torch.randn(2, 5, d_model)
    valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    got = mha(x, mem, key_padding_mask(valid))
    with torch.no_grad():
        expected = _per_head_loop(mha, x, mem, valid)
    torch.testing.assert_close(got.detach(), expected, atol=1e-5, rtol=1e-5)


def test_kernel_options_reach_every_projection_and_attention() -> None:
    from transduce.config import ModelConfig
    from transduce.kernels import Linear
    from transduce.model import make_model

    options = KernelOptions(matmul="mkl", attention="formula")
    cfg = ModelConfig(n_layers=2, d_model=8, d_ff=16, n_heads=2, d_k=4, d_v=4)
    model = make_model(cfg, src_vocab_size=11, options=options)
    attns = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(attns) == 6 and all(m.options == options for m in attns)
    assert linears and all(isinstance(m, Linear) and m.matmul == "mkl" for m in linears)
    with pytest.raises(ValueError, match="attention"):
        KernelOptions(attention="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize("fast", [True, False])
def test_attention_dropout_only_in_training(fast: bool) -> None:
    torch.manual_seed(3)
    mha = MultiHeadAttention(d_model=16, n_heads=2, d_k=8, d_v=8, dropout=0.5)
    mha.options = _options(fast)
    x = torch.randn(2, 6, 16)
    mha.train()
    assert not torch.allclose(mha(x, x), mha(x, x))
    mha.eval()
    assert torch.equal(mha(x, x), mha(x, x))


# --------------------------------------------------------------------------------------------
# is_causal, float32 attention for low-precision inputs on the CPU, fused projections


@pytest.mark.parametrize("fast", [True, False])
def test_is_causal_equals_the_causal_mask(fast: bool) -> None:
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(B, H, T, 8, generator=g) for _ in range(3))
    expected = _reference_attention(q, k, v, causal_mask(T, T))[0]
    torch.testing.assert_close(
        attention(q, k, v, is_causal=True, fast=fast), expected, atol=1e-5, rtol=1e-5
    )
    valid = torch.tensor([[True] * T, [True, True, False, False]])
    both = combine(key_padding_mask(valid), causal_mask(T, T))
    got = attention(q, k, v, key_padding_mask(valid), is_causal=True, fast=fast)
    torch.testing.assert_close(got, _reference_attention(q, k, v, both)[0], atol=1e-5, rtol=1e-5)


def test_low_precision_attention_runs_in_float32_on_cpu() -> None:
    q, k, v = _qkv(8, 8)
    mask = _masks()["key_padding"]
    low = [t.to(torch.bfloat16) for t in (q, k, v)]
    out = attention(*low, mask)
    assert out.dtype == torch.bfloat16
    # float32 arithmetic on the rounded inputs, rounded once at the end
    expected = _reference_attention(*(t.float() for t in low), mask)[0].to(torch.bfloat16)
    torch.testing.assert_close(out, expected, atol=1e-2, rtol=1e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = attention(q, k, v, mask)
    assert inside.dtype == torch.float32  # autocast does not push the kernel to bfloat16
    torch.testing.assert_close(inside, _reference_attention(q, k, v, mask)[0], atol=1e-5, rtol=1e-5)


def test_fused_projections_equal_separate_linears() -> None:
    torch.manual_seed(4)
    mha = MultiHeadAttention(d_model=12, n_heads=3, d_k=5, d_v=7)
    with torch.no_grad():
        for lin in (mha.w_q, mha.w_k, mha.w_v):
            lin.bias.normal_()
    x = torch.randn(2, 4, 12)
    q, k, v = mha.project_qkv(x)
    assert (q.shape, k.shape, v.shape) == ((2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 4, 7))
    torch.testing.assert_close(q, mha.w_q(x).view(2, 4, 3, 5).transpose(1, 2))
    torch.testing.assert_close(k, mha.w_k(x).view(2, 4, 3, 5).transpose(1, 2))
    torch.testing.assert_close(v, mha.w_v(x).view(2, 4, 3, 7).transpose(1, 2))
    k2, v2 = mha.project_key_value(x)
    torch.testing.assert_close(k2, k)
    torch.testing.assert_close(v2, v)
    (q.sum() + k.sum() + v.sum()).backward()
    for lin in (mha.w_q, mha.w_k, mha.w_v):
        assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0


# --------------------------------------------------------------------------------------------
# the CPU training path: the formula for short keys


def test_cpu_training_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    attn = _ATTENTION_MODULE
    monkeypatch.setattr(attn, "FORMULA_MAX_KEYS_CPU_TRAINING", 128)
    monkeypatch.setattr(attn.native, "available", lambda: False)  # (its own test below)
    calls: list[str] = []
    real_sdpa = attn.F.scaled_dot_product_attention

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append("kernel")
        return real_sdpa(*args, **kwargs)

    monkeypatch.setattr(attn.F, "scaled_dot_product_attention", spy)
    short = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 128, 4), torch.randn(1, 1, 128, 4)
    long = short[0], torch.randn(1, 1, 129, 4), torch.randn(1, 1, 129, 4)
    attention(*short)  # training (gradients on), 128 keys: the formula
    assert calls == []
    attention(*long)  # 129 keys: the kernel
    assert calls == ["kernel"]
    with torch.no_grad():  # inference: the kernel whatever the length
        attention(*short)
    assert calls == ["kernel", "kernel"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cpu_training_formula_matches_kernel_with_gradients(
    monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    # A multi-head self- and cross-attention step under the trainer's autocast, once through the
    # formula (the CPU training path) and once through the kernel: outputs and gradients agree.
    attn = _ATTENTION_MODULE
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=16, n_heads=2, d_k=8, d_v=8)
    x, memory = torch.randn(3, 5, 16), torch.randn(3, 7, 16)
    pad = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    pad[1, ..., 4:] = False
    results = []
    for limit in (128, 0):  # formula, then kernel
        monkeypatch.setattr(attn, "FORMULA_MAX_KEYS_CPU_TRAINING", limit)
        mha.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = mha(x, x, causal_mask(5, 5)) + mha(x, memory, pad)
        out.float().square().sum().backward()
        results.append((out.float(), [p.grad.clone() for p in mha.parameters()]))
    tol = {"fp32": {"atol": 1e-5, "rtol": 1e-5}, "bf16": {"atol": 0.05, "rtol": 0.05}}[precision]
    torch.testing.assert_close(results[0][0], results[1][0], **tol)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("path", ["fused", "formula"])
def test_is_causal_with_other_query_and_key_lengths_is_refused(path: str) -> None:
    """The fused kernel aligns the causal mask to the top left, the formula to the bottom
    right: with T != T' the two paths gave other answers, so neither is given."""
    from transduce.kernels import attention as kernel_attention

    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match="is_causal needs T == T'; got 3 and 5"):
        kernel_attention(q, k, k, is_causal=True, path=path)  # type: ignore[arg-type]
    square = kernel_attention(k, k, k, is_causal=True, path=path)  # type: ignore[arg-type]
    assert square.shape == (1, 2, 5, 4)


def _strided_cache(b: int, h: int, s: int, k: int) -> torch.Tensor:
    """(B, H, S, K) as the engine's cache views it: positions of a (B, capacity, H, K) buffer."""
    buffer = torch.randn(b, s + 5, h, k)
    return buffer.narrow(1, 0, s).transpose(1, 2)


@pytest.mark.parametrize("queries", [1, 4])
def test_a_search_step_takes_the_native_kernel(
    monkeypatch: pytest.MonkeyPatch, queries: int
) -> None:
    attn = _ATTENTION_MODULE
    if not attn.native.available():
        pytest.skip("the native kernels did not build")
    calls: list[str] = []
    real = attn.native.decode_attention
    monkeypatch.setattr(
        attn.native, "decode_attention", lambda *a: calls.append("native") or real(*a)
    )
    kernel = attn.attention  # the kernels' function (``attention`` here is the model's)
    torch.manual_seed(0)
    q = torch.randn(3, 2, queries, 8)
    k, v = _strided_cache(3, 2, 7, 8), _strided_cache(3, 2, 7, 8)
    valid = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    valid[1, ..., 4:] = False
    valid[2] = False  # a sentence with no valid key: zero weights, as the formula gives
    with torch.no_grad():
        out = kernel(q, k, v, valid)
        ref = kernel(q, k, v, valid, path="formula")
        plain = kernel(q, k, v)
        plain_ref = kernel(q, k, v, path="fused")
    assert calls == ["native", "native"]
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    torch.testing.assert_close(plain, plain_ref, atol=1e-6, rtol=1e-5)
    kernel(q, k, v)  # gradients on (training): not the native kernel
    with torch.no_grad():
        kernel(q.bfloat16(), k.bfloat16(), v.bfloat16())  # not float32
        kernel(torch.randn(3, 2, 9, 8), k, v)  # more queries than a step's
        shared = kernel(q, k[:, :1], v[:, :1])  # keys broadcast over the heads: PyTorch's
        torch.testing.assert_close(shared, kernel(q, k[:, :1], v[:, :1], path="fused"))
    assert calls == ["native", "native"]
