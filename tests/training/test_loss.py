"""label_smoothed_nll against torch's cross_entropy and a hand computation."""

import math

import pytest
import torch
import torch.nn.functional as F

from transduce.data.vocab import PAD
from transduce.training.loss import label_smoothed_nll


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
