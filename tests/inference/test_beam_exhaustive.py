"""Beam search against exhaustive search: with a beam as wide as the number of outputs, beam
search must return the exact argmax and n-best of the model's (length-normalised) scores.

Outputs are every sequence over {UNK, A, B} of at most L = 3 tokens followed by EOS (at step L,
EOS is forced and scored with its probability): 1 + 3 + 9 + 27 = 40 outputs, each scored by the
full, cache-free forward pass.
"""

import pytest
import torch
from inference_testkit import enumerate_outputs, random_sources, ranked, tiny_model

from transduce.inference import beam_search

L = 3
N_OUTPUTS = len(enumerate_outputs(L))


def test_output_count():
    assert N_OUTPUTS == 40


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_is_exact(alpha):
    nbest, found_long, narrow_misses = 5, 0, 0
    for seed in (0, 4, 8, 9):  # models whose best outputs have varied lengths
        model = tiny_model(seed)
        src = random_sources(torch.Generator().manual_seed(300 + seed), [3, 1, 4])
        out = beam_search(model, src, beam=N_OUTPUTS, alpha=alpha, max_len=L, nbest=nbest)
        narrow = beam_search(model, src, beam=2, alpha=alpha, max_len=L)
        for row, hyps, small in zip(src, out, narrow, strict=True):
            exact = ranked(model, row, L, alpha)
            assert [h.tokens for h in hyps] == [y for _, y, _ in exact[:nbest]]
            for h, (score, _, log_prob) in zip(hyps, exact, strict=False):
                assert h.score == pytest.approx(score, abs=1e-5)
                assert h.log_prob == pytest.approx(log_prob, abs=1e-5)
            found_long += len(hyps[0].tokens) > 0
            top1 = beam_search(model, row[None], beam=N_OUTPUTS, alpha=alpha, max_len=L)[0]
            assert [h.tokens for h in top1] == [exact[0][1]]
            narrow_misses += small[0].tokens != hyps[0].tokens
    # The cases are not trivial: some best outputs are non-empty, and a beam of 2 misses some.
    assert found_long > 0
    assert narrow_misses > 0
