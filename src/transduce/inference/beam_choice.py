"""A beam search step's choice (``inference.beam``, whose docstring gives the algorithm): from
each hypothesis's best next tokens, the W best extensions of each sentence, which of them
finish, which sentences are done, and the cache rows of the next step. ``choose`` takes the
native kernel where it runs (``kernels.beam_select``: CPUs), else ``choose_in_torch``, its
reference in PyTorch's operators (any device).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from transduce import kernels
from transduce.data.vocab import EOS
from transduce.inference.contract import reorder_moves_rows
from transduce.inference.length_penalty import length_penalty
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
class Sentences:
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
    ) -> Sentences:
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

    def keep(self, index: Tensor) -> Sentences:
        """The sentences ``index`` (n',) of these."""
        fields = dataclasses.fields(self)  # (not astuple: it deep-copies the tensors first)
        return Sentences(*(getattr(self, f.name).index_select(0, index) for f in fields))


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


@dataclass(frozen=True)
class ChoiceSettings:
    """What a search's choices share: its settings and the constants of its batch."""

    alpha: float
    nbest: int
    cheap_reads: bool  # kernels.reads_are_cheap
    native: bool  # whether kernels.beam_select chooses
    slot: Tensor  # (W,) 0..W-1
    first_rows: Tensor  # (B, 1) row i*W of sentence i


def choose_in_torch(
    row_top: Tensor,
    row_tok: Tensor,
    scores: Tensor,
    sents: Sentences,
    step: int,
    how: ChoiceSettings,
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

    # Done when the best live hypothesis cannot reach the n-th best finished score (the bound
    # of beam.py's docstring); this covers "no live hypothesis left" and the forced-EOS step.
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


def choose(
    row_top: Tensor,
    row_tok: Tensor,
    scores: Tensor,
    sents: Sentences,
    step: int,
    how: ChoiceSettings,
    cache: Any,
) -> BeamChoice:
    """The step's choice: the native kernel's where it runs (float32 scores), else
    ``choose_in_torch``. Hypotheses take their parents' slots where reads are cheap and
    ``cache`` moves rows."""
    in_place_pays = how.cheap_reads and reorder_moves_rows(cache)
    if not (how.native and row_top.dtype == scores.dtype == torch.float32):
        return choose_in_torch(row_top, row_tok, scores, sents, step, how, in_place_pays)
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


__all__ = [
    "PARENT_SLOTS_MIN_ROWS",
    "ChoiceSettings",
    "Sentences",
    "choose",
    "choose_in_torch",
    "parent_slots",
]
