"""Sampling: each next token drawn from the model's distribution instead of searched for
(back-translation, diverse outputs), on the decoding contract like greedy and beam search.

At each step the distribution of a row is the searches' log-probabilities
(``transduce.inference.common``: PAD and BOS never, EOS forced at the length limit) divided by
``temperature``, cut to the ``top_k`` most probable tokens (0: no cut), then to the smallest
set of the most probable tokens whose probability reaches ``top_p`` (nucleus sampling; 1: no
cut), and renormalised. A draw is ``torch.multinomial`` with the caller's generator, so a seed
and a batch give the same samples every time (on the same device and library).

``samples`` outputs are drawn per sentence, as rows i*K + k of the batch, sharing the sentence's
memory as beam search does. Each output's ``log_prob`` is the model's own (before temperature
and cuts; what ``transduce score`` gives the output) and its ``score`` that over the length
penalty; a sentence's samples come back best score first.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from transduce.data.vocab import BOS, EOS
from transduce.inference.beam import Hypothesis
from transduce.inference.common import (
    check_eval_mode,
    max_output_lengths,
    next_token_log_probs,
)
from transduce.inference.contract import DecodableModel
from transduce.inference.length_penalty import length_penalty


def sampling_probs(lprobs: Tensor, *, temperature: float, top_k: int, top_p: float) -> Tensor:
    """lprobs (N, V) log-probabilities -> probabilities (N, V) to draw from: tempered, cut to
    the ``top_k`` best (0: all; ties at the k-th broken by index) and to the nucleus of mass
    ``top_p`` (ties at its edge broken by index), renormalised. A row needs one finite entry."""
    x = lprobs / temperature if temperature != 1.0 else lprobs
    if 0 < top_k < x.size(1):
        # torch.topk returns any of the entries tied at the k-th: keep those above it, then
        # the tied ones by index until k are kept
        kth = x.topk(top_k, dim=1).values[:, -1:]  # (N, 1)
        above, tied = x > kth, x == kth
        room = top_k - above.sum(1, keepdim=True)  # (N, 1) places left for the tied
        kept = above | (tied & (tied.cumsum(1) <= room))
        x = x.masked_fill(~kept, float("-inf"))
    probs = torch.softmax(x, dim=1)
    if top_p < 1.0:
        # stable: of equal probabilities, the lower index first (and kept first)
        sorted_p, order = probs.sort(dim=1, descending=True, stable=True)
        # a token stays while the tokens before it hold less than top_p: the first always does
        before = sorted_p.cumsum(1) - sorted_p
        cut = before >= top_p
        cut[:, 0] = False  # (a top_p below float32's least, 5e-324, reads as 0: the first stays)
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, order, cut)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(1, keepdim=True)
    return probs


def sample(
    model: DecodableModel[Any],
    src: Tensor,
    *,
    samples: int = 1,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    alpha: float = 0.6,
    generator: torch.Generator | None = None,
    max_len_offset: int = 50,
    max_len: int | None = None,
) -> list[list[Hypothesis]]:
    """src (B, S) right-padded ids -> per sentence ``samples`` sampled outputs, best score
    (``log_prob / lp``, with ``alpha``) first. Length limits as the searches'. ``generator``:
    where the draws come from (default: torch's global one). Call ``model.eval()`` first."""
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    if temperature <= 0 or top_k < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(
            f"bad sampling settings: temperature={temperature}, top_k={top_k}, top_p={top_p}"
        )
    max_lens = max_output_lengths(src, max_len_offset, max_len)
    out = _sample(model, src, max_lens, samples, (temperature, top_k, top_p), generator)
    for hyps in out:
        for h in hyps:
            h.score = h.log_prob / length_penalty(len(h.tokens) + 1, alpha)
        hyps.sort(key=lambda h: h.score, reverse=True)
    return out


@torch.inference_mode()  # see greedy_decode
def _sample(
    model: DecodableModel[Any],
    src: Tensor,
    max_lens: Tensor,
    samples: int,
    settings: tuple[float, int, float],
    generator: torch.Generator | None,
) -> list[list[Hypothesis]]:
    check_eval_mode(model)
    temperature, top_k, top_p = settings
    batch, k, device = src.size(0), samples, src.device
    out: list[list[Hypothesis]] = [[] for _ in range(batch)]
    if batch == 0:
        return out
    memory, src_valid = model.encode(src)
    cache = model.new_cache()
    # step 0 on B rows (every sample starts from BOS), then K rows per sentence
    logits = model.decode(src.new_full((batch, 1), BOS), memory, src_valid, cache)[:, -1]
    expand = torch.arange(batch, device=device).repeat_interleave(k)  # (B*K,)
    cache.reorder(expand)
    logits = logits.index_select(0, expand)  # (B*K, V)
    sent = torch.arange(batch, device=device)  # original index of each active sentence
    tokens = src.new_empty((batch * k, 0))  # (n*K, t)
    log_prob = torch.zeros(batch * k, device=device)
    alive = torch.ones(batch * k, dtype=torch.bool, device=device)  # not ended yet
    step = 0
    while True:
        force = (max_lens <= step).repeat_interleave(k)  # (n*K,)
        lprobs = next_token_log_probs(logits, force)
        probs = sampling_probs(lprobs, temperature=temperature, top_k=top_k, top_p=top_p)
        # a forced row, or one that has ended (it rides along until its sentence is done),
        # draws nothing: the model may give EOS no probability
        ride = force | ~alive
        probs[ride] = 0.0
        probs[ride, EOS] = 1.0
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (n*K,)
        log_prob = log_prob + torch.where(alive, lprobs.gather(1, tok[:, None]).squeeze(1), 0.0)
        ended = alive & (tok == EOS)
        if bool(ended.any()):
            rows = ended.nonzero().squeeze(1)
            for r, toks, lp in zip(
                rows.tolist(), tokens[rows].tolist(), log_prob[rows].tolist(), strict=True
            ):
                out[int(sent[r // k])].append(Hypothesis(tokens=toks, score=0.0, log_prob=lp))
            alive = alive & ~ended
        tokens = torch.cat([tokens, tok[:, None]], 1)
        n = sent.numel()
        going = alive.view(n, k).any(1)  # (n,) sentences with a sample still growing
        if not bool(going.any()):
            return out
        if not bool(going.all()):  # drop the sentences whose samples have all ended
            keep = going.nonzero().squeeze(1)
            rows = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)  # (n'*K,)
            cache.reorder(rows)
            cache.select_sources(keep)
            memory, src_valid = memory.index_select(0, keep), src_valid.index_select(0, keep)
            tokens, tok, log_prob, alive = tokens[rows], tok[rows], log_prob[rows], alive[rows]
            sent, max_lens = sent[keep], max_lens[keep]
        step += 1
        logits = model.decode(tok[:, None], memory, src_valid, cache)[:, -1]  # (n*K, V)


__all__ = ["sample", "sampling_probs"]
