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

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from transduce import kernels
from transduce.data.vocab import BOS, EOS
from transduce.inference.common import (
    check_eval_mode,
    first_forced_step,
    max_output_lengths,
)
from transduce.inference.contract import DecodableModel, reorder_moves_rows
from transduce.inference.length_penalty import length_penalty
from transduce.inference.topk import next_token_candidates
from transduce.kernels import BeamChoice

# Beam search keeps hypotheses in their parents' slots (parent_slots) from this many rows
# (sentences x beam) on: the cache then copies only the rows that move (DecoderCache.reorder).
# Below it the extra calls cost more than the smaller copy saves: measured 2-6% slower at 4 and
# 16 rows for SMALL (under 1% for BASE), 3-4% faster at 128 for both (benchmarks/RESULTS.md).
# Only where reads of the device are cheap (kernels.reads_are_cheap: CPUs): elsewhere the engine's
# cache gathers every row anyway (counting the moved rows would wait for the device), so the
# permutation would be calls for nothing; nor where the cache moves no rows (a lineage table:
# ``contract.reorder_moves_rows``).
PARENT_SLOTS_MIN_ROWS = 64


def parent_slots(parent: Tensor, live: Tensor) -> Tensor:
    """An order of each sentence's new hypotheses that leaves the most cache rows in place.

    parent (n, W) the beam slot each new hypothesis extends, live (n, W) bool -> perm (n, W), a
    permutation of 0..W-1 per sentence: slot s takes hypothesis ``perm[:, s]``. Every slot that
    is the parent of a live hypothesis takes the first of them, so its cache row stays; the
    other hypotheses take the remaining slots in order. Which slot holds a hypothesis changes
    nothing else in the search.
    """
    n, w = parent.shape
    idx = torch.arange(w, device=parent.device)
    child = (parent[:, None, :] == idx[:, None]) & live[:, None, :]  # (n, W_s, W_j)
    first = torch.where(child, idx, w).amin(dim=2)  # (n, W_s): first live child, w if none
    has = first < w
    # the hypotheses no slot claimed, in order, for the slots nobody claimed, in order
    claimed = torch.zeros(n, w + 1, dtype=torch.bool, device=parent.device).scatter_(1, first, True)
    rest = torch.argsort(claimed[:, :w].to(torch.uint8), dim=1, stable=True)  # (n, W)
    free_rank = (~has).cumsum(1) - 1  # (n, W_s): rank of each unclaimed slot
    return torch.where(has, first, rest.gather(1, free_rank.clamp(min=0)))


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


@dataclass
class _Sentences:
    """What beam search keeps per sentence still searched: their encoder output and mask, batch
    indices, finished counts and best finished scores, and length limits."""

    memory: Tensor  # (n, S, D)
    src_valid: Tensor  # (n, S)
    sent: Tensor  # (n,) index of each in the batch
    n_finished: Tensor  # (n,)
    finished_scores: Tensor  # (n, W) normalised, best first, -inf where none
    max_lens: Tensor  # (n,)
    lp_max_len: Tensor  # (n,) lp of the longest possible output

    @classmethod
    def start(
        cls, memory: Tensor, src_valid: Tensor, max_lens: Tensor, width: int, alpha: float
    ) -> _Sentences:
        """The batch's B sentences before the first step: none finished."""
        batch, device = memory.size(0), memory.device
        return cls(
            memory,
            src_valid,
            torch.arange(batch, device=device),
            torch.zeros(batch, dtype=torch.long, device=device),
            torch.full((batch, width), float("-inf"), device=device),
            max_lens,
            length_penalty(max_lens + 1, alpha),
        )

    def finish(self, ended: Tensor, normalised: Tensor) -> tuple[Tensor, Tensor]:
        """The step's ended candidates (n, W) bool, with their normalised scores (n, W), counted
        among each sentence's finished -> (its count (n,), its W best scores (n, W))."""
        new = normalised.masked_fill(~ended, float("-inf"))
        width = self.finished_scores.size(1)
        best = torch.cat([self.finished_scores, new], 1).topk(width).values
        return self.n_finished + ended.sum(1), best

    def keep(self, index: Tensor) -> _Sentences:
        """The sentences ``index`` (n',) of these."""
        fields = dataclasses.fields(self)  # (not astuple: it deep-copies the tensors first)
        return _Sentences(*(getattr(self, f.name).index_select(0, index) for f in fields))


def _first_step(
    model: DecodableModel[Any], sents: _Sentences, cache: Any, width: int, forced: bool
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


def _candidates(row_top: Tensor, row_tok: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """row_top, row_tok (n*W, per_row) the best log-probs and tokens of each hypothesis's
    next token, scores (n, W) live log-probs -> the W best one-token extensions of each
    sentence, best first: their log-probs, parent slots and tokens, (n, W) each.

    They are among the ``per_row`` best extensions of each hypothesis (a candidate with fewer
    than W better ones overall has fewer than W in its own row): two small topk calls instead of
    adding the scores to all W*V (``next_token_candidates`` gives the first)."""
    n, width = scores.shape
    per_row = row_top.size(1)
    cand = (scores.view(-1, 1) + row_top).view(n, width * per_row)
    top, pick = cand.topk(width, dim=1)  # (n, W), best first
    parent = torch.div(pick, per_row, rounding_mode="floor")  # beam each candidate extends
    return top, parent, row_tok.view(n, width * per_row).gather(1, pick)


def _kept(done: Tensor, ended: Tensor, cheap_reads: bool) -> tuple[Tensor | None, bool]:
    """done (n,) bool, ended (n, W) bool -> (the sentences that go on (n',), None if all do;
    whether any candidate ended), in one read of the device. Where reads are cheap the second
    is not read (the caller read it before): False."""
    n = done.numel()
    if cheap_reads:
        going = (~done).nonzero().squeeze(1)
        return (None if going.numel() == n else going), False
    flags = torch.cat([done, ended.any().view(1)]).tolist()  # waits for the device once
    kept = [i for i, is_done in enumerate(flags[:n]) if not is_done]
    if len(kept) == n:
        return None, bool(flags[n])
    return torch.tensor(kept, dtype=torch.long, device=done.device), bool(flags[n])


def _next_rows(
    parent: Tensor,
    tok: Tensor,
    scores: Tensor,
    keep: Tensor | None,
    slot: Tensor,
    first_rows: Tensor,
    in_place_pays: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """The step's candidates, parent slots, tokens and live scores (n, W) each, and the
    sentences that go on (n',) (None: all) -> the cache rows the next step reads (n'*W,), their
    new tokens (n'*W, 1) and live scores (n', W). ``slot`` (W,) 0..W-1; ``first_rows`` (B, 1):
    row i*W of sentence i.
    Where that pays (``in_place_pays``: reads are cheap and the cache moves rows), the
    hypotheses of a large batch take their parents' slots (``parent_slots``) so that the cache
    moves the fewest rows."""
    n, width = parent.shape
    live = scores > float("-inf")
    if keep is None and n * width >= PARENT_SLOTS_MIN_ROWS and in_place_pays:
        perm = parent_slots(parent, live)  # (n, W)
        parent, tok, scores, live = (t.gather(1, perm) for t in (parent, tok, scores, live))
    # an ended hypothesis's row is never read again: leave it where it is rather than copy
    parent = torch.where(live, parent, slot)
    if keep is None:  # every sentence goes on
        return (first_rows[:n] + parent).view(-1), tok.view(-1, 1), scores  # (n*W,), (n*W, 1)
    rows = (keep[:, None] * width + parent.index_select(0, keep)).view(-1)  # (n'*W,)
    return rows, tok.index_select(0, keep).view(-1, 1), scores.index_select(0, keep)


def _choose(
    row_top: Tensor,
    row_tok: Tensor,
    scores: Tensor,
    sents: _Sentences,
    step: int,
    how: _How,
    in_place_pays: bool,
) -> BeamChoice:
    """A step's choice (``kernels.BeamChoice``) in PyTorch's operators: on any device, and the
    reference of the native kernel's (``kernels.beam_select``). row_top, row_tok (n*W, P) each
    hypothesis's best next log-probabilities and tokens, scores (n, W) the live log-probs;
    ``in_place_pays``: whether hypotheses may take their parents' slots (``_next_rows``)."""
    width, ninf, slot = scores.size(1), float("-inf"), how.slot
    top, parent, tok = _candidates(row_top, row_tok, scores)  # (n, W) each
    entered = (slot < (width - sents.n_finished)[:, None]) & (top > ninf)
    is_eos = tok == EOS
    ended = entered & is_eos
    n_finished, finished_scores = sents.n_finished, sents.finished_scores
    normalised = top  # replaced below whenever a candidate may have ended
    # where reads are cheap (CPUs), one costs less than the writes it skips on most steps;
    # elsewhere whether any ended is read below, with the sentences that are done
    any_ended = how.cheap_reads and bool(ended.any())
    if not how.cheap_reads or any_ended:
        normalised = top / length_penalty(step + 1, how.alpha)  # |Y| = step tokens + EOS
        n_finished, finished_scores = sents.finish(ended, normalised)
    live = top.masked_fill(~(entered & ~is_eos), ninf)  # live hypotheses

    # Done when the best live hypothesis cannot reach the n-th best finished score (see the
    # module docstring); this covers "no live hypothesis left" and the forced-EOS step.
    lp_bound = sents.lp_max_len.clamp(min=length_penalty(step + 2, how.alpha))
    bound = live.max(dim=1).values / lp_bound
    done = (bound <= finished_scores[:, how.nbest - 1]) | (sents.max_lens <= step)
    keep, ended_read = _kept(done, ended, how.cheap_reads)  # the step's one read of the device
    rows, next_tok, next_scores = _next_rows(
        parent, tok, live, keep, slot, how.first_rows, in_place_pays
    )
    return BeamChoice(
        top,
        parent,
        tok,
        ended,
        normalised,
        finished_scores,
        n_finished,
        keep,
        rows,
        next_tok,
        next_scores,
        any_ended or ended_read,
    )


@dataclass(frozen=True)
class _How:
    """What a search's choices share: its settings and the constants of its batch."""

    alpha: float
    nbest: int
    cheap_reads: bool  # kernels.reads_are_cheap
    native: bool  # whether kernels.beam_select chooses
    slot: Tensor  # (W,) 0..W-1
    first_rows: Tensor  # (B, 1) row i*W of sentence i


def _choice(
    row_top: Tensor,
    row_tok: Tensor,
    scores: Tensor,
    sents: _Sentences,
    step: int,
    how: _How,
    cache: Any,
) -> BeamChoice:
    """The step's choice: the native kernel's where it runs (float32 scores), else ``_choose``.
    Hypotheses take their parents' slots where reads are cheap and ``cache`` moves rows."""
    in_place_pays = how.cheap_reads and reorder_moves_rows(cache)
    if not (how.native and row_top.dtype == scores.dtype == torch.float32):
        return _choose(row_top, row_tok, scores, sents, step, how, in_place_pays)
    n, width = scores.shape
    return kernels.beam_select(
        row_top,
        row_tok,
        scores,
        (sents.n_finished, sents.finished_scores, sents.lp_max_len, sents.max_lens),
        step,
        (length_penalty(step + 1, how.alpha), length_penalty(step + 2, how.alpha)),
        how.nbest,
        EOS,
        in_place_pays and n * width >= PARENT_SLOTS_MIN_ROWS,
    )


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
    sents = _Sentences.start(memory, src_valid, max_lens, width, alpha)
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
    how = _How(
        alpha,
        nbest,
        cheap_reads,
        kernels.beam_select_runs(device),
        torch.arange(width, device=device),
        torch.arange(0, batch * width, width, device=device)[:, None],
    )
    step = 0  # tokens in every live hypothesis
    while True:
        choice = _choice(row_top, row_tok, scores, sents, step, how, cache)
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
