"""Forced decoding: the log-probability a model gives a given output (``transduce score``).

Each target token, and the EOS after them, is scored as the searches score it
(``transduce.inference.common``): ``log_softmax`` over the whole vocabulary of the model's
logits after BOS and the tokens before it. A target is fed in one ``decode`` call (teacher
forcing; right padding is harmless, the decoder is causal), so a batch costs one encoder and
one decoder pass, not one per token. The log-probability of the beam's output is the beam's own
``Hypothesis.log_prob``, and ``log_prob / length_penalty(len + 1, alpha)`` its ``score``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from transduce.data.vocab import BOS, EOS, PAD
from transduce.inference.common import check_eval_mode
from transduce.inference.contract import DecodableModel
from transduce.inference.length_penalty import length_penalty


@dataclass(frozen=True)
class PairScore:
    """The score of one target: ``log_prob`` the sum of its token log-probabilities, EOS
    included; ``tokens`` how many (target tokens + EOS); ``per_token = log_prob / tokens``;
    ``normalized = log_prob / length_penalty(tokens, alpha)``, what the beam ranks by."""

    log_prob: float
    tokens: int
    per_token: float
    normalized: float

    @classmethod
    def of(cls, log_prob: float, tokens: int, alpha: float) -> PairScore:
        return cls(log_prob, tokens, log_prob / tokens, log_prob / length_penalty(tokens, alpha))


@torch.inference_mode()
def token_log_probs(
    model: DecodableModel[Any], src: Tensor, targets: Sequence[Sequence[int]]
) -> list[list[float]]:
    """src (B, S) right-padded ids, B targets (ids without BOS/EOS) -> per target the
    log-probability of each of its tokens and of the final EOS (len + 1 values).
    Call ``model.eval()`` first."""
    check_eval_mode(model)
    if src.size(0) != len(targets):
        raise ValueError(f"{src.size(0)} sources but {len(targets)} targets")
    if not targets:
        return []
    longest = max(len(y) for y in targets) + 1
    tgt_in = src.new_full((len(targets), longest), PAD)  # (B, T): BOS + target, shifted right
    gold = src.new_full((len(targets), longest), PAD)  # (B, T): target + EOS
    for i, y in enumerate(targets):
        tgt_in[i, : len(y) + 1] = torch.tensor([BOS, *y])
        gold[i, : len(y) + 1] = torch.tensor([*y, EOS])
    memory, src_valid = model.encode(src)
    # all positions at once, no cache: the inference engine (DecodingModel) takes this to its
    # model's own decode (its fast path is the one-step cached one), which is the right one here
    logits = model.decode(tgt_in, memory, src_valid, None)  # (B, T, V)
    picked = F.log_softmax(logits.float(), dim=-1).gather(2, gold[:, :, None]).squeeze(2)
    rows = picked.tolist()
    return [rows[i][: len(y) + 1] for i, y in enumerate(targets)]


def score_targets(
    model: DecodableModel[Any], src: Tensor, targets: Sequence[Sequence[int]], alpha: float
) -> list[PairScore]:
    """``token_log_probs`` summed: one ``PairScore`` per target, its ``normalized`` with the
    length penalty's ``alpha``."""
    return [PairScore.of(sum(lps), len(lps), alpha) for lps in token_log_probs(model, src, targets)]


__all__ = ["PairScore", "score_targets", "token_log_probs"]
