"""Greedy decoding: the most probable next token at each step, batched on the key/value cache."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from transduce.data.vocab import BOS, EOS
from transduce.inference.common import check_eval_mode, first_forced_step, max_output_lengths
from transduce.inference.contract import DecodableModel
from transduce.inference.topk import next_token_best


def greedy_search(
    model: DecodableModel[Any], src: Tensor, *, max_len_offset: int = 50, max_len: int | None = None
) -> list[list[int]]:
    """Greedy outputs of a batch: src (B, S) right-padded token ids -> B token lists.

    Each list holds the output tokens without BOS/EOS, at most ``max_len`` of them (by default the
    sentence's non-pad source length + ``max_len_offset``; see ``transduce.inference.common``).
    Only ``model.encode``, ``model.new_cache``, ``model.decode``, ``cache.reorder`` and
    ``cache.select_sources`` are used; sentences that have finished are dropped from the batch
    (and the cache). Call ``model.eval()`` first.
    """
    max_lens = max_output_lengths(src, max_len_offset, max_len)
    return [tokens for tokens, _ in greedy_decode(model, src, max_lens=max_lens)]


@torch.inference_mode()
def greedy_decode(
    model: DecodableModel[Any], src: Tensor, *, max_lens: Tensor
) -> list[tuple[list[int], float]]:
    """Greedy search returning, per sentence, (tokens, log-probability including the final EOS).

    max_lens (B,) LongTensor from ``max_output_lengths``. Behaves exactly like beam search with a
    beam of 1: EOS is forced at step ``max_len`` and its log-probability counted.
    """
    # inference_mode (3-6% faster than no_grad here, benchmarks/RESULTS.md): a buffer the model
    # replaces while decoding (the growing sinusoidal table) is made outside it, so no
    # inference tensor leaks into later training.
    check_eval_mode(model)
    batch = src.size(0)
    out: list[tuple[list[int], float]] = [([], 0.0)] * batch
    if batch == 0:
        return out
    memory, src_valid = model.encode(src)
    cache = model.new_cache()
    sent = torch.arange(batch, device=src.device)  # original index of each active row
    # (B, max_len) tokens generated so far: the first ``step`` columns (written in place, not
    # concatenated every step; at batch 1 the step costs far more in calls than arithmetic)
    tokens = src.new_empty((batch, int(max_lens.max())))
    log_prob = torch.zeros(batch, device=src.device)
    last = src.new_full((batch, 1), BOS)
    forced_from = first_forced_step(max_lens)
    step = 0
    while True:
        logits = model.decode(last, memory, src_valid, cache)[:, -1]  # (B, V)
        # from forced_from on, rows at their max_len end: EOS, even if the model gives it -inf
        force = max_lens <= step if step >= forced_from else None
        best, tok = next_token_best(logits, force)  # (B,), (B,)
        log_prob = log_prob + best
        if EOS in tok.tolist():  # one read of the device (fewer calls than any() at batch 1)
            done = tok == EOS
            for i, toks, lp in zip(
                sent[done].tolist(),
                tokens[done, :step].tolist(),
                log_prob[done].tolist(),
                strict=True,
            ):
                out[i] = (toks, lp)
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                return out
            cache.reorder(keep)
            cache.select_sources(keep)
            memory, src_valid = memory.index_select(0, keep), src_valid.index_select(0, keep)
            tokens, tok, log_prob = tokens[keep], tok[keep], log_prob[keep]
            sent, max_lens = sent[keep], max_lens[keep]
            forced_from = first_forced_step(max_lens)
        tokens[:, step] = tok
        last = tok.view(-1, 1)  # (B,) -> (B, 1)
        step += 1


__all__ = ["greedy_decode", "greedy_search"]
