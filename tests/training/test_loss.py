"""label_smoothed_nll against torch's cross_entropy and a hand computation."""

import math

import pytest
import torch
import torch.nn.functional as F

from transduce.data.vocab import PAD
from transduce.training.loss import LossSums, label_smoothed_nll


def _batch(seed: int = 0, b: int = 3, t: int = 5, v: int = 7):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, v, generator=g) * 3
    target = torch.randint(1, v, (b, t), generator=g)
    target[0, 3:] = PAD  # right padding of different lengths
    target[2, 1:] = PAD
    return logits, target


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2, 0.5])
def test_matches_torch_cross_entropy(eps: float) -> None:
    logits, target = _batch()
    sums = label_smoothed_nll(logits, target, epsilon=eps, ignore_index=PAD)
    ref = F.cross_entropy(
        logits.flatten(0, 1),
        target.flatten(),
        ignore_index=PAD,
        label_smoothing=eps,
        reduction="sum",
    )
    torch.testing.assert_close(sums.loss, ref, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_nll_is_unsmoothed_cross_entropy_and_counts_non_pad(eps: float) -> None:
    logits, target = _batch(seed=1)
    sums = label_smoothed_nll(logits, target, epsilon=eps, ignore_index=PAD)
    ref = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(sums.nll, ref, rtol=1e-6, atol=1e-5)
    assert sums.n_tokens == int((target != PAD).sum()) == 15 - 2 - 4
    assert isinstance(sums.n_tokens, int)


def test_padding_positions_do_not_matter() -> None:
    logits, target = _batch(seed=2)
    a = label_smoothed_nll(logits, target, epsilon=0.1, ignore_index=PAD)
    changed = logits.clone()
    changed[target == PAD] = torch.randn_like(changed[target == PAD]) * 100
    b = label_smoothed_nll(changed, target, epsilon=0.1, ignore_index=PAD)
    torch.testing.assert_close(a.loss, b.loss)
    torch.testing.assert_close(a.nll, b.nll)


def test_negative_ignore_index() -> None:
    logits, target = _batch(seed=3)
    target = target.masked_fill(target == PAD, -100)
    sums = label_smoothed_nll(logits, target, epsilon=0.1, ignore_index=-100)
    ref = F.cross_entropy(
        logits.flatten(0, 1),
        target.flatten(),
        ignore_index=-100,
        label_smoothing=0.1,
        reduction="sum",
    )
    torch.testing.assert_close(sums.loss, ref, rtol=1e-6, atol=1e-5)


def test_bf16_logits() -> None:
    logits, target = _batch(seed=4)
    low = logits.to(torch.bfloat16)
    sums = label_smoothed_nll(low, target, epsilon=0.1, ignore_index=PAD)
    assert sums.loss.dtype == torch.float32
    ref = F.cross_entropy(
        low.float().flatten(0, 1),
        target.flatten(),
        ignore_index=PAD,
        label_smoothing=0.1,
        reduction="sum",
    )
    torch.testing.assert_close(sums.loss, ref, rtol=1e-6, atol=1e-5)
    assert torch.isfinite(sums.nll)


def test_hand_computed_single_token() -> None:
    # V = 3, logits (0, ln 2, ln 5): p = (1/8, 2/8, 5/8); true class 2 (id 2), eps 0.3.
    logits = torch.tensor([[[0.0, math.log(2.0), math.log(5.0)]]])
    target = torch.tensor([[2]])
    eps = 0.3
    nll = -math.log(5 / 8)
    uniform = -(math.log(1 / 8) + math.log(2 / 8) + math.log(5 / 8)) / 3
    expected = (1 - eps) * nll + eps * uniform
    sums = label_smoothed_nll(logits, target, epsilon=eps, ignore_index=-1)
    assert sums.n_tokens == 1
    assert sums.nll.item() == pytest.approx(nll, rel=1e-6)
    assert sums.loss.item() == pytest.approx(expected, rel=1e-6)
    # q = (0.1, 0.1, 0.8): the same number written as a cross-entropy against q.
    q = [eps / 3, eps / 3, 1 - eps + eps / 3]
    p = [1 / 8, 2 / 8, 5 / 8]
    assert sums.loss.item() == pytest.approx(
        -sum(qi * math.log(pi) for qi, pi in zip(q, p)), rel=1e-6
    )


def test_gradient_flows_only_through_real_tokens() -> None:
    logits, target = _batch(seed=5)
    logits.requires_grad_(True)
    label_smoothed_nll(logits, target, epsilon=0.1, ignore_index=PAD).loss.backward()
    assert torch.all(logits.grad[target == PAD] == 0)
    assert torch.all(logits.grad[target != PAD].abs().sum(-1) > 0)


def _reference(
    logits: torch.Tensor, target: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook formula on a float32 log-softmax, for gradients to compare with."""
    lprobs = F.log_softmax(logits.float(), dim=-1)
    keep = (target != PAD).float()
    nll = -(lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1) * keep).sum()
    smooth = -(lprobs.sum(-1) * keep).sum()
    return (1 - eps) * nll + eps / logits.size(-1) * smooth, nll


@pytest.mark.parametrize("chunk", [1 << 20, 7 * 4, 7])  # one chunk; 4 rows; 1 row at a time
@pytest.mark.parametrize("weights", [(1.0, 0.0), (0.0, 1.0), (0.7, -2.0)])
def test_gradient_matches_reference(
    monkeypatch: pytest.MonkeyPatch, chunk: int, weights: tuple[float, float]
) -> None:
    # The backward pass is written by hand (softmax - q, chunk by chunk): compare it with autograd
    # through the textbook formula, for the loss, for the NLL and for a mix of both.
    monkeypatch.setattr("transduce.training.loss._CHUNK_ELEMENTS", chunk)
    logits, target = _batch(seed=6)
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    sums = label_smoothed_nll(a, target, epsilon=0.2, ignore_index=PAD)
    loss, nll = _reference(b, target, 0.2)
    torch.testing.assert_close(sums.loss, loss)
    torch.testing.assert_close(sums.nll, nll)
    (weights[0] * sums.loss + weights[1] * sums.nll).backward()
    (weights[0] * loss + weights[1] * nll).backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_bf16_gradient_is_bf16_and_close() -> None:
    logits, target = _batch(seed=7, b=4, t=6, v=50)
    low = logits.to(torch.bfloat16).requires_grad_(True)
    ref = low.detach().float().requires_grad_(True)
    label_smoothed_nll(low, target, epsilon=0.1, ignore_index=PAD).loss.backward()
    _reference(ref, target, 0.1)[0].backward()
    assert low.grad.dtype == torch.bfloat16
    torch.testing.assert_close(low.grad.float(), ref.grad, rtol=1e-2, atol=1e-3)


# --- the fused computation (gradient in the forward pass) against the reference ----------------


def _both(
    logits: torch.Tensor, target: torch.Tensor, eps: float, weights: tuple[float, float], **fused
) -> tuple[LossSums, LossSums, torch.Tensor, torch.Tensor]:
    """The reference and the fused loss sums of ``logits`` and the gradients of
    weights[0] * loss + weights[1] * nll, the logits reached through a product (as a model's)."""
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    ref = label_smoothed_nll(a * 1.0, target, epsilon=eps, ignore_index=PAD, method="reference")
    new = label_smoothed_nll(
        b * 1.0, target, epsilon=eps, ignore_index=PAD, method="fused", **fused
    )
    (weights[0] * ref.loss + weights[1] * ref.nll).backward()
    (weights[0] * new.loss + weights[1] * new.nll).backward()
    return ref, new, a.grad, b.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("chunk", [1 << 20, 50 * 4, 50])  # one chunk; 4 rows; 1 row at a time
@pytest.mark.parametrize("weights", [(1 / 9, 0.0), (0.0, 1.0), (0.7, -2.0)])
def test_fused_matches_reference(
    monkeypatch: pytest.MonkeyPatch,
    dtype: torch.dtype,
    eps: float,
    overwrite: bool,
    chunk: int,
    weights: tuple[float, float],
) -> None:
    monkeypatch.setattr("transduce.training.loss._CHUNK_ELEMENTS", chunk)
    logits, target = _batch(seed=8, b=3, t=5, v=50)
    ref, new, g_ref, g_new = _both(
        logits.to(dtype), target, eps, weights, overwrite_logits=overwrite
    )
    torch.testing.assert_close(new.loss, ref.loss, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(new.nll, ref.nll, rtol=1e-6, atol=1e-5)
    assert new.n_tokens == ref.n_tokens == 9
    assert g_new.dtype == dtype
    assert torch.all(g_new[target == PAD] == 0)
    # bfloat16: the stored p - q is rounded, then scaled and rounded again (the reference
    # rounds once): one or two units in the last place
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 1e-3}
    torch.testing.assert_close(g_new.float(), g_ref.float(), **tol)


def test_fused_gradient_by_hand() -> None:
    # V = 3, logits (0, ln 2, ln 5): p = (1/8, 2/8, 5/8); true class 2, eps 0.3:
    # q = (0.1, 0.1, 0.8), d loss / dz = p - q = (0.025, 0.15, -0.175); a padding row: 0.
    logits = torch.tensor([[[0.0, math.log(2.0), math.log(5.0)], [1.0, 2.0, 3.0]]])
    logits.requires_grad_(True)
    target = torch.tensor([[2, -1]])
    sums = label_smoothed_nll(logits, target, epsilon=0.3, ignore_index=-1, method="fused")
    (2.0 * sums.loss).backward()
    expected = torch.tensor([[[0.025, 0.15, -0.175], [0.0, 0.0, 0.0]]]) * 2.0
    torch.testing.assert_close(logits.grad, expected, rtol=1e-6, atol=1e-7)
    assert sums.nll.item() == pytest.approx(-math.log(5 / 8), rel=1e-6)


def test_fused_does_not_underflow_where_p_of_the_target_does() -> None:
    # p(y) = e^-200 / (e^-200 + 2) is 0 in float32: -log p(y) must still be 200 + ln 2
    logits = torch.tensor([[[-200.0, 0.0, 0.0]]], requires_grad=True)
    target = torch.tensor([[0]])
    sums = label_smoothed_nll(logits, target, epsilon=0.0, ignore_index=-1, method="fused")
    assert sums.nll.item() == pytest.approx(200 + math.log(2), rel=1e-6)
    sums.loss.backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[[-1.0, 0.5, 0.5]]]))


def test_overwrite_logits_writes_the_gradient_into_them_only_when_asked() -> None:
    logits, target = _batch(seed=9)
    for overwrite in (False, True):
        leaf = logits.clone().requires_grad_(True)
        z = leaf * 1.0  # (B, T, V) a non-leaf, as a model's output
        before = z.detach().clone()
        sums = label_smoothed_nll(
            z, target, epsilon=0.1, ignore_index=PAD, method="fused", overwrite_logits=overwrite
        )
        assert torch.equal(z.detach(), before) != overwrite
        sums.loss.backward()
        ref = logits.clone().requires_grad_(True)
        _reference(ref, target, 0.1)[0].backward()
        torch.testing.assert_close(leaf.grad, ref.grad, rtol=1e-5, atol=1e-6)


def test_fused_backward_only_once_and_logits_untouched_without_grad() -> None:
    logits, target = _batch(seed=10)
    leaf = logits.clone().requires_grad_(True)
    sums = label_smoothed_nll(leaf, target, epsilon=0.1, ignore_index=PAD, method="fused")
    (sums.loss * 2).backward(retain_graph=True)  # not the promised gradient (grad_scale 1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        sums.loss.backward()  # its stored gradient was scaled in place: refused, not wrong
    with torch.no_grad():
        kept = logits.clone()
        sums = label_smoothed_nll(
            logits, target, epsilon=0.1, ignore_index=PAD, method="fused", overwrite_logits=True
        )
    assert torch.equal(logits, kept)
    ref = label_smoothed_nll(logits, target, epsilon=0.1, ignore_index=PAD, method="reference")
    torch.testing.assert_close(sums.loss, ref.loss)


def test_auto_method_is_fused_but_for_float16_and_unknown_methods_are_refused() -> None:
    from transduce.training.loss import _fused

    assert _fused("auto", torch.zeros(1, dtype=torch.float32))
    assert _fused("auto", torch.zeros(1, dtype=torch.bfloat16))
    assert not _fused("auto", torch.zeros(1, dtype=torch.float16))
    assert not _fused("reference", torch.zeros(1))
    logits, target = _batch()
    with pytest.raises(ValueError, match="method must be one of"):
        label_smoothed_nll(logits, target, epsilon=0.1, ignore_index=PAD, method="liger")  # type: ignore[arg-type]


def _liger_on_cuda() -> bool:
    from transduce.kernels.cross_entropy import liger_available

    return torch.cuda.is_available() and liger_available(torch.device("cuda"))


@pytest.mark.skipif(
    not _liger_on_cuda(), reason="needs a CUDA GPU and liger-kernel (the gpu extra)"
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_liger_on_cuda_matches_reference(dtype: torch.dtype, eps: float) -> None:
    logits, target = _batch(seed=11, b=4, t=6, v=300)
    logits, target = logits.cuda().to(dtype), target.cuda()
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    ref = label_smoothed_nll(a * 1.0, target, epsilon=eps, ignore_index=PAD, method="reference")
    new = label_smoothed_nll(b * 1.0, target, epsilon=eps, ignore_index=PAD, overwrite_logits=True)
    torch.testing.assert_close(new.loss, ref.loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(new.nll, ref.nll, rtol=1e-5, atol=1e-4)
    (ref.loss / 7).backward()
    (new.loss / 7).backward()
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 1e-3}
    torch.testing.assert_close(b.grad.float(), a.grad.float(), **tol)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_liger_dispatch_and_its_nll_with_a_stand_in(
    monkeypatch: pytest.MonkeyPatch, eps: float
) -> None:
    # On the CPU, with torch's cross_entropy standing in for Liger's kernel (and, like it,
    # overwriting the logits): "auto" with overwrite_logits takes it and derives the NLL from
    # its loss; without overwrite_logits, or for float16, it does not
    from transduce.kernels import cross_entropy

    calls: list[int] = []

    def stand_in(logits: torch.Tensor, target: torch.Tensor, *, epsilon: float, ignore_index: int):
        calls.append(1)
        loss = F.cross_entropy(
            logits.float(),
            target,
            ignore_index=ignore_index,
            label_smoothing=epsilon,
            reduction="sum",
        )
        with torch.no_grad():
            logits.fill_(123.0)  # Liger writes the gradient into the logits
        return loss

    monkeypatch.setattr(cross_entropy, "liger_available", lambda device: True)
    monkeypatch.setattr(cross_entropy, "liger_smoothed_cross_entropy_sum", stand_in)
    logits, target = _batch(seed=12)
    ref = label_smoothed_nll(logits, target, epsilon=eps, ignore_index=PAD, method="reference")
    leaf = logits.clone().requires_grad_(True)
    sums = label_smoothed_nll(
        leaf * 1, target, epsilon=eps, ignore_index=PAD, overwrite_logits=True
    )
    assert calls == [1]
    torch.testing.assert_close(sums.loss, ref.loss)
    torch.testing.assert_close(sums.nll, ref.nll)
    assert sums.n_tokens == ref.n_tokens
    label_smoothed_nll(leaf, target, epsilon=0.1, ignore_index=PAD)
    label_smoothed_nll(leaf.half(), target, epsilon=0.1, ignore_index=PAD, overwrite_logits=True)
    assert calls == [1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grad_scale_stores_the_scaled_gradient_and_any_other_gradient_is_honoured(
    dtype: torch.dtype,
) -> None:
    # the trainer's loss * scale: the fused method told grad_scale=scale stores (p - q) * scale
    # and hands it back untouched (float32: bit for bit the gradient scaled in the backward
    # pass); told another scale than the loss gets, the gradient is still right
    from transduce.training import loss as loss_module

    logits, target = _batch(seed=12)
    scale = 1 / 37
    grads = []
    for told in (1.0, scale, 0.5):
        leaf = logits.to(dtype).requires_grad_(True)
        sums = label_smoothed_nll(
            leaf * 1, target, epsilon=0.1, ignore_index=PAD, overwrite_logits=True, grad_scale=told
        )
        (sums.loss * scale).backward()
        grads.append(leaf.grad.float())
    exact = dtype == torch.float32
    tol = {"atol": 0.0, "rtol": 0.0} if exact else {"atol": 1e-4, "rtol": 2e-2}
    torch.testing.assert_close(grads[1], grads[0], **tol)
    torch.testing.assert_close(grads[2], grads[0], atol=1e-6 if exact else 1e-4, rtol=2e-2)
    # the promised gradient skips the multiply: the backward returns the stored tensor itself
    leaf = logits.to(dtype).requires_grad_(True)
    z = leaf * 1
    sums = loss_module.label_smoothed_nll(
        z, target, epsilon=0.1, ignore_index=PAD, overwrite_logits=True, grad_scale=scale
    )
    seen = []
    z.register_hook(lambda g: seen.append((g.data_ptr(), g._version)))
    version = z._version  # (p - q) * scale written into the logits by the forward pass
    (sums.loss * scale).backward()
    assert seen == [(z.data_ptr(), version)]  # the logits' own storage, not written again
