"""Position-wise FFN (eq. 2) and the residual/LayerNorm wiring of the layers (section 3.1)."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transduce.kernels import dropout, dropout_add
from transduce.model.attention import MultiHeadAttention
from transduce.model.feed_forward import PositionwiseFeedForward
from transduce.model.layers import DecoderLayer, EncoderLayer

D, H, DK, DV, DFF = 16, 2, 6, 5, 24


def _perturb(module: nn.Module, seed: int = 0) -> None:
    """Make biases and LayerNorm parameters non-trivial so mis-wiring shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif "norms" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))


def _linear(x: Tensor, lin: nn.Linear) -> Tensor:
    return x @ lin.weight.T + lin.bias


def _ln(x: Tensor, norm: nn.LayerNorm) -> Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def _ffn(x: Tensor, ffn: PositionwiseFeedForward) -> Tensor:
    return _linear(torch.clamp(_linear(x, ffn.w_1), min=0.0), ffn.w_2)


def _mha(mha: MultiHeadAttention, x: Tensor, mem: Tensor, allowed: Tensor) -> Tensor:
    """Per-head loop; ``allowed`` (B, T, S) bool."""
    heads = []
    for i in range(mha.n_heads):
        sk, sv = slice(i * mha.d_k, (i + 1) * mha.d_k), slice(i * mha.d_v, (i + 1) * mha.d_v)
        q = x @ mha.w_q.weight[sk].T + mha.w_q.bias[sk]
        k = mem @ mha.w_k.weight[sk].T + mha.w_k.bias[sk]
        v = mem @ mha.w_v.weight[sv].T + mha.w_v.bias[sv]
        s = (q @ k.transpose(1, 2) / math.sqrt(mha.d_k)).masked_fill(~allowed, float("-inf"))
        heads.append(s.softmax(-1) @ v)
    return _linear(torch.cat(heads, -1), mha.w_o)


def _layer_kwargs(pre_norm: bool, **extra) -> dict:
    kw = dict(d_model=D, n_heads=H, d_k=DK, d_v=DV, d_ff=DFF, dropout=0.0, pre_norm=pre_norm)
    kw.update(extra)
    return kw


def test_ffn_by_hand() -> None:
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(d_model=D, d_ff=DFF)
    assert ffn.w_1.weight.shape == (DFF, D) and ffn.w_2.weight.shape == (D, DFF)
    x = torch.randn(2, 3, D)
    w1, b1, w2, b2 = ffn.w_1.weight.T, ffn.w_1.bias, ffn.w_2.weight.T, ffn.w_2.bias
    expected = torch.maximum(torch.zeros(()), x @ w1 + b1) @ w2 + b2
    torch.testing.assert_close(ffn(x), expected)


def test_ffn_activation_dropout_train_only() -> None:
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(d_model=D, d_ff=DFF, activation_dropout=0.5)
    x = torch.randn(2, 3, D)
    ffn.train()
    assert not torch.allclose(ffn(x), ffn(x))
    ffn.eval()
    torch.testing.assert_close(ffn(x), _ffn(x, ffn))


@pytest.mark.parametrize("pre_norm", [False, True])
def test_encoder_layer_by_hand(pre_norm: bool) -> None:
    torch.manual_seed(1)
    layer = EncoderLayer(**_layer_kwargs(pre_norm)).eval()
    _perturb(layer)
    x = torch.randn(2, 5, D)
    valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    allowed = valid[:, None, :].expand(2, 5, 5)
    n0, n1 = layer.norms
    with torch.no_grad():
        if pre_norm:  # x + Sublayer(LayerNorm(x))
            h = x + _mha(layer.self_attn, _ln(x, n0), _ln(x, n0), allowed)
            expected = h + _ffn(_ln(h, n1), layer.ffn)
        else:  # LayerNorm(x + Sublayer(x))
            h = _ln(x + _mha(layer.self_attn, x, x, allowed), n0)
            expected = _ln(h + _ffn(h, layer.ffn), n1)
        got = layer(x, valid[:, None, None, :])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_decoder_layer_by_hand(pre_norm: bool) -> None:
    torch.manual_seed(2)
    layer = DecoderLayer(**_layer_kwargs(pre_norm)).eval()
    _perturb(layer, seed=1)
    t, s = 4, 6
    x = torch.randn(2, t, D)
    mem = torch.randn(2, s, D)
    valid = torch.tensor([[1] * 6, [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool)).expand(2, t, t)
    cross = valid[:, None, :].expand(2, t, s)
    n0, n1, n2 = layer.norms
    with torch.no_grad():
        if pre_norm:
            a = _ln(x, n0)
            h = x + _mha(layer.self_attn, a, a, causal)
            h = h + _mha(layer.cross_attn, _ln(h, n1), mem, cross)
            expected = h + _ffn(_ln(h, n2), layer.ffn)
        else:
            h = _ln(x + _mha(layer.self_attn, x, x, causal), n0)
            h = _ln(h + _mha(layer.cross_attn, h, mem, cross), n1)
            expected = _ln(h + _ffn(h, layer.ffn), n2)
        got = layer(x, mem, valid[:, None, None, :])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("which", ["dropout", "attention_dropout", "activation_dropout"])
@pytest.mark.parametrize("cls", [EncoderLayer, DecoderLayer])
def test_layer_dropout_train_vs_eval(which: str, cls: type) -> None:
    torch.manual_seed(3)
    layer = cls(**_layer_kwargs(False, **{which: 0.3}))
    x = torch.randn(2, 5, D)
    args = (x, None) if cls is EncoderLayer else (x, torch.randn(2, 3, D), None)
    layer.train()
    assert not torch.allclose(layer(*args), layer(*args))
    layer.eval()
    assert torch.equal(layer(*args), layer(*args))


def test_residual_dropout_is_applied_to_sublayer_output() -> None:
    # With all weights of the sub-layers zeroed, residual dropout has nothing to drop: the output
    # is LayerNorm(x) twice even in train mode (dropout must not touch the residual path).
    torch.manual_seed(4)
    layer = EncoderLayer(**_layer_kwargs(False, dropout=0.5)).train()
    with torch.no_grad():
        for p in list(layer.self_attn.parameters()) + list(layer.ffn.parameters()):
            p.zero_()
    x = torch.randn(2, 5, D)
    n0, n1 = layer.norms
    expected = F.layer_norm(F.layer_norm(x, (D,)), (D,))
    with torch.no_grad():
        torch.testing.assert_close(layer(x, None), expected, atol=1e-5, rtol=1e-5)
        assert n0.weight.shape == (D,) and n1.weight.shape == (D,)


# --------------------------------------------------------------------------------------------
# dropout on the CPU (16-bit integer-threshold masks)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_dropout_rate_scale_and_seed(p: float) -> None:
    x = torch.ones(200_000)
    torch.manual_seed(5)
    out = dropout(x, p, training=True)
    dropped = (out == 0).float().mean().item()
    assert dropped == pytest.approx(p, abs=0.005)  # ~7 standard deviations at n = 2e5
    kept = out[out != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1.0 / (1.0 - p)))
    torch.manual_seed(5)
    assert torch.equal(dropout(x, p, training=True), out)  # governed by torch.manual_seed
    assert not torch.equal(dropout(x, p, training=True), out)
    assert dropout(x, p, training=False) is x


def test_dropout_resolves_p_to_two_to_the_minus_sixteen() -> None:
    from transduce.kernels.dropout import _keep_mask

    shape = torch.Size((7, 1001))  # an element count that is no multiple of 4
    assert _keep_mask(shape, 2**-17, torch.device("cpu")).all()  # floor(p * 2^16) = 0
    dropped = (~_keep_mask(shape, 1 - 2**-17, torch.device("cpu"))).float().mean().item()
    assert dropped > 0.999  # P(drop) = 65535 / 65536


def test_dropout_odd_sizes_bf16_and_edge_rates() -> None:
    x = torch.randn(3, 5, 7, dtype=torch.bfloat16)  # odd element count
    out = dropout(x, 0.2, training=True)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    assert torch.all((out == 0) | torch.isclose(out, x * 1.25, rtol=1e-2))
    assert torch.equal(dropout(x, 1.0, training=True), torch.zeros_like(x))
    assert dropout(x, 0.0, training=True) is x


@pytest.mark.parametrize(
    "dtypes", [(torch.float32, torch.float32), (torch.float32, torch.bfloat16)]
)
def test_dropout_add_is_residual_plus_dropout(dtypes: tuple[torch.dtype, torch.dtype]) -> None:
    residual = torch.randn(4, 6, 8, dtype=dtypes[0], requires_grad=True)
    x = torch.randn(4, 6, 8, dtype=dtypes[1], requires_grad=True)
    torch.manual_seed(7)
    out = dropout_add(residual, x, 0.4, training=True)
    torch.manual_seed(7)
    expected = residual + dropout(x, 0.4, training=True)
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert torch.equal(residual.grad, torch.ones_like(residual))
    grad = x.grad.float()
    assert torch.all((grad == 0) | torch.isclose(grad, torch.tensor(1 / 0.6), rtol=1e-2))
    assert 0 < (grad == 0).sum() < grad.numel()
    assert torch.equal(dropout_add(residual, x, 0.4, training=False), residual + x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dropout_scale_is_exactly_the_rounded_one_over_one_minus_p(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PyTorch's form (the native kernel's: tests/kernels/test_native_training.py): the mask's
    # bytes times a 0-dim scale in x's dtype, the same numbers, bit for bit, as the mask cast
    # to x's dtype and scaled, and the result in x's dtype (not promoted to float32)
    from transduce.kernels.dropout import _keep_mask

    # the module (the package's name "dropout" is its function)
    dropout_module = importlib.import_module("transduce.kernels.dropout")

    monkeypatch.setattr(dropout_module, "_native_takes", lambda x: False)

    x = torch.randn(6, 7, 9, dtype=dtype)
    torch.manual_seed(11)
    out = dropout(x, 0.3, training=True)
    torch.manual_seed(11)
    keep = _keep_mask(x.shape, 0.3, x.device)
    expected = x * keep.to(dtype).mul_(1 / 0.7)
    assert out.dtype == dtype
    assert torch.equal(out, expected)
