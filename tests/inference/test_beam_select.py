"""The native kernel's choice of a beam search step (``kernels.beam_select``) against the PyTorch
form it replaces on CPUs (``beam_choice.choose_in_torch``): the same tensors bit for bit on
random steps (without exact ties of finite scores), and the same searches end to end."""

from __future__ import annotations

import pytest
import torch
from inference_testkit import random_sources, tiny_model

from transduce import kernels
from transduce.data.vocab import EOS
from transduce.inference import beam_choice, beam_search
from transduce.inference.length_penalty import length_penalty
from transduce.kernels import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels did not build")


def _random_step(
    gen: torch.Generator, shape: tuple[int, int, int], step: int, alpha: float, ends: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, beam_choice.Sentences]:
    """A step's inputs for ``shape`` (n, W, P): sorted candidates (some -inf, EOS frequent), live
    scores (some -inf, a live one a sentence where none ``ends``), finished counts and their
    sorted scores, length limits (some reached now where ``ends``) -> row_top, row_tok (n*W, P),
    scores (n, W) and the sentences."""
    n, width, per_row = shape
    rows = n * width
    row_top = -torch.rand(rows, per_row, generator=gen) * 6
    row_top[torch.rand(rows, per_row, generator=gen) < 0.1] = float("-inf")
    row_top = row_top.sort(dim=1, descending=True).values
    row_tok = torch.randint(3, 9, (rows, per_row), generator=gen)
    row_tok[torch.rand(rows, per_row, generator=gen) < 0.3] = EOS
    scores = -torch.rand(n, width, generator=gen) * 10
    scores[torch.rand(n, width, generator=gen) < 0.3] = float("-inf")
    n_finished = torch.randint(0, width + 1, (n,), generator=gen)
    if not ends:  # every sentence goes on: a live hypothesis, room in the beam, no limit reached
        scores[:, 0] = -torch.rand(n, generator=gen)
        row_top[:, -1] = -torch.rand(rows, generator=gen)
        row_top = row_top.sort(dim=1, descending=True).values
        row_tok[row_tok == EOS] = 3
        n_finished.zero_()
    finished = -torch.rand(n, width, generator=gen) * 8
    finished = finished.sort(dim=1, descending=True).values
    finished[torch.arange(width)[None, :] >= n_finished[:, None]] = float("-inf")
    max_lens = torch.randint(step, step + 4, (n,), generator=gen) + (0 if ends else 50)
    sents = beam_choice.Sentences(
        memory=torch.zeros(n, 1, 1),
        src_valid=torch.ones(n, 1, dtype=torch.bool),
        sent=torch.arange(n),
        n_finished=n_finished,
        finished_scores=finished,
        max_lens=max_lens,
        lp_max_len=length_penalty(max_lens + 1, alpha),
    )
    return row_top, row_tok, scores, sents


def _how(n: int, width: int, alpha: float, nbest: int) -> beam_choice.ChoiceSettings:
    """A search's settings for n sentences of ``width`` slots, the native choice allowed."""
    return beam_choice.ChoiceSettings(
        alpha=alpha,
        nbest=nbest,
        cheap_reads=True,
        native=True,
        slot=torch.arange(width),
        first_rows=torch.arange(0, n * width, width)[:, None],
    )


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize(("width", "per_row"), [(1, 1), (2, 2), (4, 4), (5, 3)])
def test_random_steps_choose_the_same_bit_for_bit(width: int, per_row: int, in_place: bool):
    # (exact ties of finite scores apart, which random scores do not draw: of those, the native
    # kernel takes the first, torch.topk any)
    gen = torch.Generator().manual_seed(width * 10 + per_row)
    seen_ended = seen_done = seen_moved = seen_in_place = 0
    for case in range(80):
        ends = case % 2 == 0  # odd cases: every sentence goes on, often n*W >= 64 rows
        n = 1 + case % 23 if ends else -(-beam_choice.PARENT_SLOTS_MIN_ROWS // width) + case % 5
        step = case % 7
        alpha = (0.0, 0.6, 1.3, -0.5)[case % 4]
        nbest = 1 + case % width
        row_top, row_tok, scores, sents = _random_step(gen, (n, width, per_row), step, alpha, ends)
        how = _how(n, width, alpha, nbest)
        want = beam_choice.choose_in_torch(row_top, row_tok, scores, sents, step, how, in_place)
        got = beam_choice.choose(row_top, row_tok, scores, sents, step, how, _Cache(in_place))
        where = f"case {case}"
        entered = want.top > float("-inf")
        for name in ("top", "ended", "finished_scores", "n_finished", "rows", "next_scores"):
            assert torch.equal(getattr(got, name), getattr(want, name)), f"{where}: {name}"
        # of -inf candidates (ties) either may be taken: they never enter the beam
        assert torch.equal(got.parent[entered], want.parent[entered]), where
        assert torch.equal(got.tok[entered], want.tok[entered]), where
        assert torch.equal(got.normalised[want.ended], want.normalised[want.ended]), where
        live = want.next_scores.view(-1) > float("-inf")
        assert torch.equal(got.next_tok.view(-1)[live], want.next_tok.view(-1)[live]), where
        assert got.any_ended == bool(want.ended.any()), where
        assert (got.keep is None) == (want.keep is None), where
        if want.keep is not None:
            assert torch.equal(got.keep, want.keep), where
        seen_ended += got.any_ended
        seen_done += want.keep is not None
        seen_moved += bool((want.rows != torch.arange(want.rows.numel())).any())
        plain = beam_choice.choose_in_torch(row_top, row_tok, scores, sents, step, how, False)
        seen_in_place += not torch.equal(plain.rows, want.rows)
    # the cases are not trivial: candidates end, sentences finish, hypotheses move, and (asked,
    # with a beam to reorder) hypotheses take their parents' slots
    assert seen_ended > 10 and seen_done > 10 and seen_moved > 10
    assert seen_in_place > 10 if in_place and width > 1 else seen_in_place == 0


class _Cache:
    """Just what ``choose`` asks of a cache: whether its reorder moves rows."""

    def __init__(self, moves_rows: bool) -> None:
        self.reorder_moves_rows = moves_rows


def test_parent_slots_of_a_large_batch_are_pytorchs():
    # every sentence goes on and 16 x 4 rows: the hypotheses take their parents' slots
    gen = torch.Generator().manual_seed(5)
    n, width = 16, 4
    row_top, row_tok, scores, sents = _random_step(gen, (n, width, width), 0, 0.6, False)
    how = _how(n, width, 0.6, 1)
    want = beam_choice.choose_in_torch(row_top, row_tok, scores, sents, 0, how, True)
    got = beam_choice.choose(row_top, row_tok, scores, sents, 0, how, _Cache(True))
    assert want.keep is None
    assert torch.equal(got.rows, want.rows)
    # not the plain order: some hypotheses were put in their parents' slots
    plain = beam_choice.choose_in_torch(row_top, row_tok, scores, sents, 0, how, False)
    assert not torch.equal(plain.rows, want.rows)


def _searches(model, src, **options):
    """The search with the native choice, then with PyTorch's."""
    out = []
    for runs in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(kernels, "beam_select_runs", lambda device, runs=runs: runs)
            out.append(beam_search(model, src, **options))
    return out


@pytest.mark.parametrize("seed", [0, 4, 8, 9])
def test_searches_are_the_same_either_way(seed: int):
    model = tiny_model(seed)
    lengths = [3, 1, 4, 2, 5, 1, 3, 2, 4, 4, 1, 2, 3, 5, 2, 3, 1, 4]  # 18 x 4 > 64 rows
    src = random_sources(torch.Generator().manual_seed(seed), lengths)
    ended_early = 0
    for beam, nbest, alpha in ((1, 1, 0.6), (2, 2, 0.0), (4, 1, 0.6), (4, 3, 1.5), (5, 2, 0.6)):
        native_out, torch_out = _searches(
            model, src, beam=beam, nbest=nbest, alpha=alpha, max_len_offset=4
        )
        assert native_out == torch_out, (beam, nbest, alpha)
        ended_early += sum(len(hyps[0].tokens) < n + 4 for hyps, n in zip(native_out, lengths))
    assert ended_early > 0  # EOS chosen, not only forced
