"""Beam search on tiny real models: beam 1 is greedy, batching changes nothing, scores are the
full-forward log-probabilities, lengths respect the limit."""

import pytest
import torch

from inference_testkit import random_sources, sequence_log_probs, tiny_model
from transduce.data.vocab import PAD
from transduce.inference import beam_search, greedy_search, length_penalty


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_beam_one_equals_greedy(seed):
    model = tiny_model(seed)
    src = random_sources(torch.Generator().manual_seed(100 + seed), [4, 2, 6, 1, 3])
    greedy = greedy_search(model, src, max_len_offset=4)
    beam = beam_search(model, src, beam=1, alpha=0.6, max_len_offset=4)
    assert [hyps[0].tokens for hyps in beam] == greedy


@pytest.mark.parametrize(("seed", "beam", "nbest"), [(0, 3, 3), (1, 4, 2), (2, 2, 1)])
def test_batched_equals_one_at_a_time(seed, beam, nbest):
    model = tiny_model(seed)
    src = random_sources(torch.Generator().manual_seed(200 + seed), [3, 6, 1, 4, 2])
    batched = beam_search(model, src, beam=beam, alpha=0.6, max_len_offset=3, nbest=nbest)
    for row, hyps in zip(src, batched, strict=True):
        single = beam_search(
            model, row[row != PAD][None], beam=beam, alpha=0.6, max_len_offset=3, nbest=nbest
        )[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in single]
        for h, s in zip(hyps, single, strict=True):
            assert h.score == pytest.approx(s.score, abs=1e-5)
            assert h.log_prob == pytest.approx(s.log_prob, abs=1e-5)
    assert all(len(hyps) == nbest for hyps in batched)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_scores_are_full_forward_log_probs(alpha):
    model = tiny_model(5)
    src = random_sources(torch.Generator().manual_seed(5), [5, 2, 3])
    out = beam_search(model, src, beam=4, alpha=alpha, max_len_offset=2, nbest=4)
    for row, hyps in zip(src, out, strict=True):
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)  # no duplicates
        reference = sequence_log_probs(model, row, [h.tokens for h in hyps])
        for h, lp in zip(hyps, reference, strict=True):
            assert h.log_prob == pytest.approx(lp, abs=1e-5)
            assert h.score == pytest.approx(lp / length_penalty(len(h.tokens) + 1, alpha), abs=1e-5)


@pytest.mark.parametrize("offset", [0, 2])
def test_never_longer_than_source_plus_offset(offset):
    model = tiny_model(6)
    src = random_sources(torch.Generator().manual_seed(6), [1, 2, 3, 4, 5])
    limits = ((src != PAD).sum(1) + offset).tolist()
    out = beam_search(model, src, beam=3, alpha=2.0, max_len_offset=offset, nbest=3)
    assert all(len(h.tokens) <= n for hyps, n in zip(out, limits, strict=True) for h in hyps)
    assert any(len(h.tokens) == n for hyps, n in zip(out, limits, strict=True) for h in hyps)
