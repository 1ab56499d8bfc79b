"""Beam search with the GNMT length penalty, batched over (sentences x beam) on the cache.

The algorithm, per sentence, with a beam of W slots:

- Scores are sums of ``log_softmax`` log-probabilities; hypotheses are ranked by this raw score
  while they grow. A finished hypothesis (its last token is EOS) scores ``log P / lp(|Y|)``,
  with ``|Y|`` its token count including EOS (``length_penalty``).
- Each step, the candidates are all one-token extensions of the live hypotheses: the W best of
  the W*V scores of each sentence (as in fairseq; found as the W best among the W best
  extensions of each hypothesis, which hold them). Only the best ``W - finished``
  candidates enter the beam: those ending in EOS are finished, the others stay live. A finished
  hypothesis thus keeps its beam slot, and the beam shrinks as hypotheses finish (as in Nematus
  and Marian), which is why ``beam=1`` is exactly greedy search.
- A sentence is done when no live hypothesis can still get into its n-best list, by the bound
  below; in particular when no live hypothesis is left, or after step ``max_len``, where EOS is
  forced on all live ones (``transduce.inference.common``).

The bound. A live hypothesis with t tokens and log-probability s <= 0 finishes with
``|Y| = n`` tokens, ``t + 1 <= n <= max_len + 1``, and a log-probability f <= s (log-probs are
never positive). Its final score is ``f / lp(n) <= s / lp(n) <= s / max_n lp(n)``, the last
step because s <= 0 and lp > 0. lp is monotonic in n, so ``max_n lp(n) = max(lp(t + 1),
lp(max_len + 1))``: ``lp(max_len + 1)`` for alpha >= 0. A sentence is done once
``max(s) / max_n lp(n)`` over its live hypotheses is at most the n-th best finished score (-inf
while fewer than n are finished, so the search goes on then). The bound holds exactly, so the
search never stops while a live hypothesis could still enter the n-best list: it returns what an
unbounded run of the same beam would return (ties apart). Sentences that are done are dropped
from the batch and the cache, so they cost nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from transduce import kernels
from transduce.data.vocab import BOS
from transduce.inference.beam_choice import (
    PARENT_SLOTS_MIN_ROWS,
    ChoiceSettings,
    Sentences,
    choose,
    parent_slots,
)
from transduce.inference.common import (
    check_eval_mode,
    first_forced_step,
    max_output_lengths,
)
from transduce.inference.contract import DecodableModel
from transduce.inference.topk import next_token_candidates


@dataclass
class Hypothesis:
    """A finished output: ``tokens`` without BOS/EOS, ``log_prob`` the sum of the token
    log-probabilities including EOS, ``score = log_prob / length_penalty(len(tokens) + 1)``."""

    tokens: list[int]
    score: float
    log_prob: float


def beam_search(
    model: DecodableModel[Any],
    src: Tensor,
    *,
    beam: int = 4,
    alpha: float = 0.6,
    max_len_offset: int = 50,
    max_len: int | None = None,
    nbest: int = 1,
) -> list[list[Hypothesis]]:
    """src (B, S) right-padded token ids -> for each sentence its ``nbest`` best hypotheses,
    best score first (fewer only if fewer distinct outputs exist).

    Outputs have at most ``max_len`` tokens, EOS not counted: by default each sentence's non-pad
    source length + ``max_len_offset``. Only ``model.encode``, ``model.new_cache``,
    ``model.decode``, ``cache.reorder`` and ``cache.select_sources`` are used. Call
    ``model.eval()`` first.
    """
    if beam < 1:
        raise ValueError(f"beam must be at least 1, got {beam}")
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest must be between 1 and beam ({beam}), got {nbest}")
    max_lens = max_output_lengths(src, max_len_offset, max_len)
    return _beam_search(model, src, max_lens=max_lens, beam=beam, alpha=alpha, nbest=nbest)


class _Finished:
    """The finished hypotheses of a batch, kept on the search's device until the search ends.

    Row ``s * W + r`` holds the r-th hypothesis that sentence s (its index in the batch) finished:
    its tokens (the first ``length`` entries of ``tokens``), normalised score and log-probability.
    A step adds its finished hypotheses with a few tensor operations whatever their number, so
    it needs no read of the device to find them (a read waits for every queued kernel on a GPU):
    the search calls ``add`` only in steps where some did, which it learns in the step's one read
    (``_kept``). The last row (``sink``) takes the writes of the candidates that did not finish."""

    def __init__(self, batch: int, width: int, max_tokens: int, device: torch.device) -> None:
        rows = batch * width + 1
        self.width, self.sink = width, batch * width
        self.tokens = torch.zeros(rows, max(max_tokens, 1), dtype=torch.long, device=device)
        self.length = torch.full((rows,), -1, dtype=torch.long, device=device)  # -1: empty
        self.values = torch.zeros(rows, 2, device=device)  # (score, log_prob)

    def add(
        self,
        ended: Tensor,
        n_finished: Tensor,
        sent: Tensor,
        prefixes: Tensor,
        parent: Tensor,
        normalised: Tensor,
        log_prob: Tensor,
    ) -> None:
        """ended (n, W) bool: the candidates that finish, in order; n_finished (n,) what each
        sentence had finished before; sent (n,) their batch indices; prefixes (n*W, t) the live
        hypotheses' tokens, row i*W + w; parent (n, W) the slot each candidate extends;
        normalised, log_prob (n, W) the candidates' scores."""
        n, w = ended.shape
        rank = n_finished[:, None] + ended.cumsum(1) - 1  # (n, W): < W for every ended one
        dest = torch.where(ended, sent[:, None] * w + rank, self.sink).view(-1)  # (n*W,)
        t = prefixes.size(1)
        if t:
            rows = (torch.arange(n, device=ended.device)[:, None] * w + parent).view(-1)
            self.tokens.narrow(1, 0, t).index_copy_(0, dest, prefixes.index_select(0, rows))
        self.length.index_fill_(0, dest, t)
        scores = torch.stack((normalised, log_prob), -1).view(-1, 2)  # (n, W, 2) -> (n*W, 2)
        self.values.index_copy_(0, dest, scores)

    def best(self, nbest: int) -> list[list[Hypothesis]]:
        """Each sentence's ``nbest`` best hypotheses, best score first (of equal scores, the
        first finished), read from the device once."""
        w = self.width
        values = self.values[:-1].view(-1, w, 2)  # (B*W, 2) -> (B, W, 2)
        scores = values[..., 0].masked_fill(self.length[:-1].view(-1, w) < 0, float("-inf"))
        order = scores.sort(dim=1, descending=True, stable=True).indices[:, :nbest]  # (B, n)
        length = self.length[:-1].view(-1, w).gather(1, order).tolist()
        picked = values.gather(1, order[..., None].expand(-1, -1, 2)).tolist()  # (B, n, 2)
        stored = self.tokens[:-1].view(-1, w, self.tokens.size(1))  # (B*W, T) -> (B, W, T)
        tokens = stored.gather(1, order[..., None].expand(-1, -1, stored.size(2))).tolist()
        return [
            [
                Hypothesis(tokens=toks[:n], score=score, log_prob=lp)
                for n, (score, lp), toks in zip(lens, vals, rows, strict=True)
                if n >= 0
            ]
            for lens, vals, rows in zip(length, picked, tokens, strict=True)
        ]


def _first_step(
    model: DecodableModel[Any], sents: Sentences, cache: Any, width: int, forced: bool
) -> tuple[Tensor, Tensor]:
    """Step 0 on B rows -> the P = min(W, V) best log-probs and tokens of each of the B*W rows
    ((B*W, P) each), the cache expanded to B*W rows.

    Every beam of a sentence starts from the same BOS, and the cache projects the encoder
    output for cross-attention once per sentence. Then the hypothesis rows of the cache are
    expanded to B*W (row i*W + w is beam w of sentence i) once; memory, mask and cross-attention
    cache stay at one row per sentence (``decode`` groups the W). ``forced``: whether some
    sentence may have no token but EOS (``max_len`` 0)."""
    batch = sents.sent.numel()
    bos = sents.sent.new_full((batch, 1), BOS)
    logits = model.decode(bos, sents.memory, sents.src_valid, cache)[:, -1]  # (B, V)
    force = sents.max_lens <= 0 if forced else None
    per_row = min(width, logits.size(-1))  # candidates kept per hypothesis
    row_top, row_tok = next_token_candidates(logits, force, per_row)
    expand = sents.sent.repeat_interleave(width)  # (B*W,)
    cache.reorder(expand)
    return row_top.index_select(0, expand), row_tok.index_select(0, expand)  # (B*W, per_row)


@torch.inference_mode()  # see greedy_decode
def _beam_search(
    model: DecodableModel[Any],
    src: Tensor,
    *,
    max_lens: Tensor,
    beam: int,
    alpha: float,
    nbest: int,
) -> list[list[Hypothesis]]:
    check_eval_mode(model)
    batch, width, device = src.size(0), beam, src.device
    if batch == 0:
        return []
    memory, src_valid = model.encode(src)  # (B, S, D), (B, S)
    sents = Sentences.start(memory, src_valid, max_lens, width, alpha)
    cache = model.new_cache()
    forced_from = first_forced_step(max_lens)  # no EOS to force before this step
    row_top, row_tok = _first_step(model, sents, cache, width, forced_from <= 0)  # (B*W, P)
    per_row = row_top.size(1)  # P candidates kept per hypothesis
    # The W beams are identical at step 0: only beam 0 may expand, or the beam would fill with
    # copies of the same hypothesis.
    scores = torch.full((batch, width), float("-inf"), device=device)  # (B, W) live log-probs
    scores[:, 0] = 0.0
    tokens = src.new_empty((batch * width, 0))  # (B*W, t) tokens of each live hypothesis
    finished = _Finished(batch, width, int(max_lens.max()), device)
    cheap_reads = kernels.reads_are_cheap(device)  # CPUs: reads that skip work pay
    how = ChoiceSettings(
        alpha,
        nbest,
        cheap_reads,
        cheap_reads and kernels.beam_select_runs(device),
        torch.arange(width, device=device),
        torch.arange(0, batch * width, width, device=device)[:, None],
    )
    step = 0  # tokens in every live hypothesis
    while True:
        choice = choose(row_top, row_tok, scores, sents, step, how, cache)
        if choice.any_ended:  # n_finished: what each sentence had finished before this step
            finished.add(
                choice.ended,
                sents.n_finished,
                sents.sent,
                tokens,
                choice.parent,
                choice.normalised,
                choice.top,
            )
        sents.n_finished, sents.finished_scores = choice.n_finished, choice.finished_scores
        keep = choice.keep
        if keep is not None and keep.numel() == 0:
            break
        cache.reorder(choice.rows)
        tokens = torch.cat([tokens.index_select(0, choice.rows), choice.next_tok], 1)
        scores = choice.next_scores
        if keep is not None:  # drop the sentences that are done
            cache.select_sources(keep)
            sents = sents.keep(keep)
            forced_from = first_forced_step(sents.max_lens)
        step += 1
        logits = model.decode(tokens[:, -1:], sents.memory, sents.src_valid, cache)[:, -1]
        force = (sents.max_lens <= step).repeat_interleave(width) if step >= forced_from else None
        row_top, row_tok = next_token_candidates(logits, force, per_row)  # (n'*W, per_row)

    return finished.best(nbest)


__all__ = ["PARENT_SLOTS_MIN_ROWS", "Hypothesis", "beam_search", "parent_slots"]
