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

    Computed a chunk of rows at a time, never with a (B*T, V) float32 tensor: the forward pass
    keeps two numbers per token, -log p(y) and sum_v -log p(v), from a float32 ``log_softmax`` of
    the chunk; the backward pass recomputes the chunk's softmax and writes the gradient, d loss /
    dz = softmax(z) - q, straight into the logits' dtype. The point is memory: the paper's base
    batch (25k target tokens, 37k vocabulary) would otherwise hold several 3.7 GB float32 (N, V)
    tensors. The fused ``log_softmax`` / ``softmax`` kernels, which read bfloat16 logits without
    a float32 copy, also made it faster than the logsumexp form it replaced
    (benchmarks/RESULTS.md).
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
    def forward(
        ctx: Any, logits: Tensor, target: Tensor, keep: Tensor, eps: float
    ) -> tuple[Tensor, Tensor]:
        n, v = logits.shape
        step = _chunk_rows(logits)
        nll_rows = torch.empty(n, dtype=torch.float32, device=logits.device)  # (N,) -log p(y)
        smooth_rows = torch.empty_like(nll_rows)  # (N,) sum_v -log p(v)
        for i in range(0, n, step):
            # one fused kernel reads the chunk in its own dtype and writes float32 log-probs
            logp = torch.log_softmax(logits[i : i + step], dim=-1, dtype=torch.float32)
            smooth_rows[i : i + step] = logp.sum(dim=-1).neg_()
            nll_rows[i : i + step] = logp.gather(1, target[i : i + step, None]).squeeze(1).neg_()
        w = keep.float()  # (N,)
        nll = (nll_rows * w).sum()
        loss = (1.0 - eps) * nll + (eps / v) * (smooth_rows * w).sum()
        ctx.save_for_backward(logits, target, w)
        ctx.eps = eps
        return loss, nll

    @staticmethod
    def backward(
        ctx: Any, g_loss: Tensor | None, g_nll: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        logits, target, w = ctx.saved_tensors
        eps, v = ctx.eps, logits.size(1)
        zero = torch.zeros((), dtype=torch.float32, device=logits.device)
        g_loss = zero if g_loss is None else g_loss.float()
        g_nll = zero if g_nll is None else g_nll.float()
        # d/dz of g_loss * loss + g_nll * nll, per row with weight w (1 kept, 0 padding):
        #   w * [(g_loss + g_nll) * p - (g_loss * (1 - eps) + g_nll) * onehot(y) - g_loss * eps / V]
        row_p = w * (g_loss + g_nll)  # (N,)
        row_y = w * (g_loss * (1.0 - eps) + g_nll)
        row_u = w * (g_loss * (eps / v))
        grad = torch.empty_like(logits)
        step = _chunk_rows(logits)
        for i in range(0, logits.size(0), step):
            rows = slice(i, i + step)
            p = torch.softmax(logits[rows], dim=-1, dtype=torch.float32)  # (n_chunk, V)
            p.mul_(row_p[rows, None]).sub_(row_u[rows, None])
            p.scatter_add_(1, target[rows, None], -row_y[rows, None])
            grad[rows] = p
        return grad, None, None, None
