"""Label-smoothed cross-entropy (section 5.4) as a pure function."""

from __future__ import annotations

from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor


class LossSums(NamedTuple):
    """Sums over the non-padding target tokens of a batch (divide by ``n_tokens`` for means)."""

    loss: Tensor  # label-smoothed cross-entropy, summed
    nll: Tensor  # plain negative log-likelihood, summed (perplexity = exp(nll / n_tokens))
    n_tokens: int


def label_smoothed_nll(
    logits: Tensor, target: Tensor, *, epsilon: float, ignore_index: int
) -> LossSums:
    """Cross-entropy against the smoothed target q = (1 - eps) * onehot(y) + eps / V.

    This is the variant of Szegedy et al. (2016) that ``torch.nn.functional.cross_entropy(...,
    label_smoothing=eps)`` implements: the uniform part spreads eps over all V classes, the true
    class and padding included. Per token it equals (1 - eps) * -log p(y) + (eps / V) * sum_v
    -log p(v). Positions where ``target == ignore_index`` count for nothing.

    logits (B, T, V) (any float dtype; computed in float32), target (B, T).
    """
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    keep = target != ignore_index  # (B, T)
    nll = -lprobs.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, T)
    nll = nll.masked_fill(~keep, 0.0).sum()
    if epsilon > 0.0:
        smooth = -lprobs.sum(dim=-1).masked_fill(~keep, 0.0).sum()
        loss = (1.0 - epsilon) * nll + epsilon / lprobs.size(-1) * smooth
    else:
        loss = nll
    return LossSums(loss=loss, nll=nll, n_tokens=int(keep.sum()))
