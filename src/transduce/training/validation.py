"""Validation loss and perplexity of a model on held-out pairs, and the task's own metrics."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from transduce.architectures import Seq2Seq
from transduce.config import TrainConfig
from transduce.data.batching import Pair, collate, model_lengths, token_batches
from transduce.data.vocab import PAD, Vocab
from transduce.training.loss import label_smoothed_nll

# The task's validation metrics: numbers, or lists of numbers (accuracy per answer position)
Validator = Callable[[Seq2Seq], dict[str, Any]]
# A Validator of the model's output text: from the vocabulary, the sources and their references
TextValidator = Callable[[Vocab, Sequence[str], Sequence[str]], Validator]


@torch.no_grad()
def validation_loss(
    model: Seq2Seq,
    pairs: Sequence[Pair],
    *,
    max_tokens: int,
    label_smoothing: float,
    device: torch.device,
) -> dict[str, float]:
    """``valid_loss`` (label-smoothed) and ``valid_nll`` per target token, ``valid_ppl`` =
    exp(NLL) and ``neg_valid_nll`` (a score: higher is better) of ``model`` on ``pairs`` (not
    empty), in batches of at most ``max_tokens`` padded tokens. Puts the model in eval mode."""
    model.eval()
    loss = nll = 0.0
    n = 0
    batches = token_batches(model_lengths(pairs), max_tokens, seed=0, epoch=0, shuffle=False)
    for idx in batches:
        b = collate([pairs[i] for i in idx]).to(device)
        sums = label_smoothed_nll(
            model(b.src, b.tgt_in), b.tgt_out, epsilon=label_smoothing, ignore_index=PAD
        )
        loss, nll, n = loss + sums.loss.item(), nll + sums.nll.item(), n + sums.n_tokens
    return {
        "valid_loss": loss / n,
        "valid_nll": nll / n,
        "valid_ppl": math.exp(nll / n),
        "neg_valid_nll": -nll / n,
    }


def validate(
    model: Seq2Seq,
    pairs: Sequence[Pair],
    validator: Validator | None,
    t: TrainConfig,
    device: torch.device,
) -> dict[str, Any]:
    """Validation loss and perplexity on ``pairs`` (none without them), plus the task's own
    metrics from ``validator``."""
    model.eval()
    out: dict[str, Any] = {}
    if pairs:
        out.update(
            validation_loss(
                model,
                pairs,
                max_tokens=t.max_tokens,
                label_smoothing=t.label_smoothing,
                device=device,
            )
        )
    if validator is not None:
        out.update(validator(model))
    return out


__all__ = ["TextValidator", "Validator", "validate", "validation_loss"]
