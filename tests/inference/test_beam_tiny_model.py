"""Beam search on tiny real models: beam 1 is greedy, batching changes nothing, scores are the
full-forward log-probabilities, lengths respect the limit."""

import pytest
import torch
from inference_testkit import random_sources, sequence_log_probs, tiny_model

from transduce import kernels
from transduce.config import ModelConfig
from transduce.data.vocab import PAD
from transduce.inference import beam as beam_module
from transduce.inference import beam_search, greedy_search, length_penalty
from transduce.inference import topk as topk_module
from transduce.inference.beam import parent_slots
from transduce.inference.engine import DecodingModel
from transduce.inference.topk import CHUNK, chunked_topk
from transduce.model.transformer import make_model


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


def test_parent_slots_keeps_a_child_in_every_parent_slot():
    gen = torch.Generator().manual_seed(0)
    for w in (1, 2, 4, 5):
        parent = torch.randint(0, w, (300, w), generator=gen)
        live = torch.rand(300, w, generator=gen) < 0.7
        perm = parent_slots(parent, live)
        for p, alive, order in zip(parent.tolist(), live.tolist(), perm.tolist(), strict=True):
            assert sorted(order) == list(range(w))
            for s in range(w):
                children = [j for j in range(w) if alive[j] and p[j] == s]
                if children:
                    assert order[s] == children[0]


@pytest.mark.parametrize("decoding", [False, True])
def test_hypothesis_slots_change_no_result(monkeypatch, decoding):
    """With and without parent_slots (and the cache's in-place moves it enables): the same
    hypotheses and scores."""
    model = tiny_model(7)
    model = DecodingModel(model) if decoding else model
    src = random_sources(torch.Generator().manual_seed(7), [5, 2, 6, 3, 4, 1, 5, 2])
    results = []
    for min_rows in (0, 10**9):
        monkeypatch.setattr(beam_module, "PARENT_SLOTS_MIN_ROWS", min_rows)
        results.append(beam_search(model, src, beam=4, alpha=0.6, max_len_offset=4, nbest=4))
    for with_slots, without in zip(*results, strict=True):
        assert [h.tokens for h in with_slots] == [h.tokens for h in without]
        # float rounding only: a row's place in the batch can change the matrix kernels' blocking
        want = pytest.approx([h.score for h in without], rel=1e-6, abs=1e-6)
        assert [h.score for h in with_slots] == want


def test_chunked_topk_changes_no_result(monkeypatch):
    # A vocabulary wide enough for chunked_topk to chunk (not fall back to torch.topk), against
    # the same search with torch.topk.
    torch.manual_seed(7)
    cfg = ModelConfig(n_layers=1, d_model=16, d_ff=32, n_heads=2, d_k=8, d_v=8, dropout=0.0)
    model = make_model(cfg, src_vocab_size=3000).eval()
    with torch.no_grad():
        model.generator.weight.normal_(0.0, 1.0)  # peaky distributions, a varied beam
    src = torch.randint(4, 3000, (6, 5), generator=torch.Generator().manual_seed(7))
    calls = []

    def spy(scores, k):
        calls.append(scores.size(1) // CHUNK >= 4 * k)
        return chunked_topk(scores, k)

    monkeypatch.setattr(topk_module, "chunked_topk", spy)
    # log_softmax and a top-k at every step: not the one pass (kernels.log_softmax_topk)
    monkeypatch.setattr(kernels, "log_softmax_topk_pays", lambda device, k: False)
    chunked = beam_search(model, src, beam=4, alpha=0.6, max_len_offset=4, nbest=4)
    assert calls and all(calls)  # the chunked path ran at every step
    monkeypatch.setattr(topk_module, "chunked_topk", lambda scores, k: scores.topk(k, dim=1))
    plain = beam_search(model, src, beam=4, alpha=0.6, max_len_offset=4, nbest=4)
    assert [[h.tokens for h in hyps] for hyps in chunked] == [
        [h.tokens for h in hyps] for hyps in plain
    ]
    assert [[h.score for h in hyps] for hyps in chunked] == [
        [h.score for h in hyps] for hyps in plain
    ]


def test_the_tiles_log_softmax_topk_change_no_result(monkeypatch):
    # The GPU's candidates (kernels.log_softmax_topk: the k best of every tile of the logits and
    # a log-sum-exp; here its torch stage) against log_softmax + topk, on a vocabulary of many
    # tiles, n-best 4: the same hypotheses with the same scores.
    from transduce.kernels import topk_tiles as lst

    torch.manual_seed(7)
    cfg = ModelConfig(n_layers=1, d_model=16, d_ff=32, n_heads=2, d_k=8, d_v=8, dropout=0.0)
    model = make_model(cfg, src_vocab_size=3 * lst.BLOCK + 5).eval()
    with torch.no_grad():
        model.generator.weight.normal_(0.0, 1.0)  # peaky distributions, a varied beam
    src = torch.randint(4, 3000, (6, 5), generator=torch.Generator().manual_seed(7))
    monkeypatch.setattr(kernels, "log_softmax_topk_pays", lambda device, k: False)
    plain = beam_search(model, src, beam=4, alpha=0.6, max_len_offset=4, nbest=4)
    calls = []

    def tiles(logits, k, lo, hi, *, force=None, forced=-1):
        calls.append(force is not None)
        return lst.log_softmax_topk(logits, k, lo, hi, use_triton=False, force=force, forced=forced)

    monkeypatch.setattr(kernels, "log_softmax_topk_pays", lambda device, k: True)
    monkeypatch.setattr(kernels, "log_softmax_topk", tiles)
    tiled = beam_search(model, src, beam=4, alpha=0.6, max_len_offset=4, nbest=4)
    assert len(calls) >= 4 and set(calls) == {False, True}  # the forced last steps too
    assert [[h.tokens for h in hyps] for hyps in tiled] == [
        [h.tokens for h in hyps] for hyps in plain
    ]
    for got, want in zip(tiled, plain, strict=True):
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5)
