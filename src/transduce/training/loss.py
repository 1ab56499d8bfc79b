"""Label-smoothed cross-entropy (section 5.4) as a pure function."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

# Logit entries handled at once on a CPU (4 MiB of float32: 131 rows of an 8000-word vocabulary),
# so no (N, V) float32 tensor is ever made. On a GPU, kernel launches per chunk cost more than
# memory, so chunks are 64x larger there (still 1 GiB less than a paper-sized batch's log-probs).
_CHUNK_ELEMENTS = 1 << 20
_GPU_CHUNK_FACTOR = 64


class LossSums(NamedTuple):
    """Sums over the non-padding target tokens of a batch (divide by ``n_tokens`` for means)."""

    loss: Tensor  # label-smoothed cross-entropy, summed
    nll: Tensor  # plain negative log-likelihood, summed (perplexity = exp(nll / n_tokens))
    kept: Tensor  # () int64: the number of non-padding target tokens, on the logits' device

    @property
    def n_tokens(self) -> int:
        """``kept`` as a Python int. Read only where it is needed: on a GPU, reading it waits
        for the forward pass to finish."""
        return int(self.kept)


def label_smoothed_nll(
    logits: Tensor, target: Tensor, *, epsilon: float, ignore_index: int
) -> LossSums:
    """Cross-entropy against the smoothed target q = (1 - eps) * onehot(y) + eps / V.

    This is the variant of Szegedy et al. (2016) that ``torch.nn.functional.cross_entropy(...,
    label_smoothing=eps)`` implements: the uniform part spreads eps over all V classes, the true
    class and padding included. Per token it equals (1 - eps) * -log p(y) + (eps / V) * sum_v
    -log p(v). Positions where ``target == ignore_index`` count for nothing.

    logits (B, T, V) (any float dtype; computed in float32), target (B, T).

    Computed without a (B*T, V) float32 log-probability tensor: with lse = logsumexp(z),
    -log p(y) = lse - z_y and sum_v -log p(v) = V * lse - sum_v z_v, so the forward pass keeps
    three numbers per token; the backward pass writes the gradient straight into the logits'
    dtype, d loss / dz = softmax(z) - q, a chunk of rows at a time. The point is memory: the
    paper's base batch (25k target tokens, 37k vocabulary) would otherwise hold several 3.7 GB
    float32 (N, V) tensors. It is not a speed-up: on a 2-core CPU an ad-hoc timing (2560 tokens x
    8000 words, forward and backward) found it as fast as the textbook version, within noise.
    """
    keep = target != ignore_index  # (B, T)
    loss, nll = _SmoothedCrossEntropy.apply(
        logits.flatten(0, -2), target.flatten().clamp(min=0), keep.flatten(), float(epsilon)
    )
    return LossSums(loss=loss, nll=nll, kept=keep.sum())


def _chunk_rows(logits: Tensor) -> int:
    elements = _CHUNK_ELEMENTS * (1 if logits.device.type == "cpu" else _GPU_CHUNK_FACTOR)
    return max(1, elements // max(logits.size(1), 1))


class _SmoothedCrossEntropy(torch.autograd.Function):
    """(summed smoothed loss, summed NLL) of logits (N, V) against target (N,) where keep (N,)."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, keep: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        n, v = logits.shape
        step = _chunk_rows(logits)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)  # (N,)
        z_sum = torch.empty_like(lse)  # (N,)
        for i in range(0, n, step):
            z = logits[i : i + step].float()  # (n_chunk, V)
            lse[i : i + step] = torch.logsumexp(z, dim=-1)
            z_sum[i : i + step] = z.sum(dim=-1)
        z_y = logits.gather(1, target.unsqueeze(1)).squeeze(1).float()  # (N,)
        w = keep.float()  # (N,)
        nll = ((lse - z_y) * w).sum()
        smooth = ((v * lse - z_sum) * w).sum()
        loss = (1.0 - eps) * nll + (eps / v) * smooth
        ctx.save_for_backward(logits, target, w, lse)
        ctx.eps = eps
        return loss, nll

    @staticmethod
    def backward(ctx: Any, g_loss: Tensor | None, g_nll: Tensor | None) -> tuple[Tensor | None, ...]:
        logits, target, w, lse = ctx.saved_tensors
        eps, (n, v) = ctx.eps, logits.shape
        zero = torch.zeros((), dtype=torch.float32, device=logits.device)
        g_loss = zero if g_loss is None else g_loss.float()
        g_nll = zero if g_nll is None else g_nll.float()
        # d/dz of g_loss * loss + g_nll * nll, per kept row:
        #   (g_loss + g_nll) * p - (g_loss * (1 - eps) + g_nll) * onehot(y) - g_loss * eps / V
        g_p = g_loss + g_nll
        g_y = g_loss * (1.0 - eps) + g_nll
        g_u = g_loss * (eps / v)
        grad = torch.empty_like(logits)
        step = _chunk_rows(logits)
        for i in range(0, n, step):
            rows = slice(i, i + step)
            p = (logits[rows].float() - lse[rows, None]).exp_()  # (n_chunk, V) softmax
            p.mul_(g_p).sub_(g_u)
            tgt = target[rows, None]  # (n_chunk, 1)
            p.scatter_add_(1, tgt, (-g_y).expand(tgt.shape))
            p.mul_(w[rows, None])
            grad[rows] = p
        return grad, None, None, None
