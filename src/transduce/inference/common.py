"""What greedy and beam search share: output length limits and next-token log-probabilities.

Conventions of both searches:

- the output of a sentence is at most ``max_len`` tokens, EOS not counted, where ``max_len`` is
  the number of non-pad source tokens plus ``max_len_offset`` (or a fixed ``max_len`` for every
  sentence). At step ``max_len`` (``max_len`` tokens generated) EOS is forced: every other token
  gets log-probability -inf, and EOS keeps the model's own log-probability, so every finished
  hypothesis ends in EOS and its log-probability is that of a complete sequence (fairseq does the
  same). The output lists never contain BOS or EOS.
- PAD and BOS are never generated (log-probability -inf); UNK may be. Log-probabilities are
  ``log_softmax`` over the whole vocabulary, not renormalised after this masking.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from transduce.data.vocab import BOS, EOS, PAD


def max_output_lengths(src: Tensor, max_len_offset: int, max_len: int | None) -> Tensor:
    """src (B, S) -> LongTensor (B,): the most tokens (EOS not counted) each output may have."""
    if src.dim() != 2:
        raise ValueError(f"src must be (B, S) token ids, got shape {tuple(src.shape)}")
    if max_len is not None:
        if max_len < 0:
            raise ValueError(f"max_len must not be negative, got {max_len}")
        return torch.full((src.size(0),), max_len, dtype=torch.long, device=src.device)
    if max_len_offset < 0:
        raise ValueError(f"max_len_offset must not be negative, got {max_len_offset}")
    return (src != PAD).sum(dim=1) + max_len_offset


# The most subword tokens a sentence may have where the model sets no limit (sinusoidal
# positions, the rnn): 16 times training's default max_len. A longer "sentence" is likely a
# whole text on one line, and attention's work grows with its square (600,000 tokens ran for
# minutes without an end).
MAX_SENTENCE_TOKENS = 4096


def next_token_log_probs(logits: Tensor, force_eos: Tensor | None) -> Tensor:
    """logits (N, V) of the next token, force_eos (N,) bool or None (no row) -> float32
    log-probs (N, V).

    PAD and BOS get -inf; on rows with ``force_eos`` every token but EOS gets -inf.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1)
    lprobs.narrow(1, PAD, BOS - PAD + 1).fill_(float("-inf"))  # adjacent ids: one call
    if force_eos is not None and bool(force_eos.any()):  # rare (the last step)
        rows = force_eos.nonzero().squeeze(1)
        eos = lprobs[rows, EOS]
        lprobs[rows] = float("-inf")
        lprobs[rows, EOS] = eos
    return lprobs


def check_eval_mode(model: object) -> None:
    """Decoding a model in training mode would apply dropout: refuse rather than decode noise."""
    if getattr(model, "training", False):
        raise ValueError("the model is in training mode (dropout on); call model.eval() first")


def first_forced_step(max_lens: Tensor) -> int:
    """The first step at which some row must end (EOS forced): before it, no row needs the
    check. max_lens (N,) from ``max_output_lengths``, not empty."""
    return int(max_lens.min())


__all__ = [
    "MAX_SENTENCE_TOKENS",
    "check_eval_mode",
    "first_forced_step",
    "max_output_lengths",
    "next_token_log_probs",
]
